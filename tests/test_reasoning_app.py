"""The reasoning block in the chat (issue 17, section 1): it streams above the answer, folds to
one line once the answer starts, unfolds on a click or F4; ``/think`` and
``/set reasoning_budget``; the token view and continue-from-alternative inside the
reasoning. Over the scripted backend, whose replies can reason (``inference.scripted``)."""

from __future__ import annotations

import threading

from test_app import SIZE, make_app, notices, send, settle

from chatui.widgets.reasoning import ReasoningBlock
from chatui.widgets.reply import ReplyView
from inference.scripted import ScriptedBackend

REASONING = "First I check the question. Then I answer it briefly."
ANSWER = "The answer is **42**."


def think_reply(request, row):
    return (REASONING, ANSWER)


class GatedBackend(ScriptedBackend):
    """Holds the first answer token until ``gate`` is set, so a test sees the reasoning
    streaming without timing anything."""

    def __init__(self) -> None:
        super().__init__(think_reply)
        self.gate = threading.Event()
        self.reasoned = threading.Event()

    def generate(self, request, cancel):
        from inference.types import TokenBatch

        for ev in super().generate(request, cancel):
            if isinstance(ev, TokenBatch) and ev.tokens[0].channel == "answer":
                self.reasoned.set()
                self.gate.wait(30)
            yield ev


def block_text(app) -> str:
    [view] = app.chat.query(ReplyView)
    return str(view.reasoning_block.render())


async def wait_for(pilot, cond, what):
    for _ in range(500):
        if cond():
            return
        await pilot.pause(0.02)
    raise AssertionError(f"never happened: {what}")


async def test_reasoning_streams_open_then_folds_and_unfolds():
    backend = GatedBackend()
    app = make_app(backend=backend)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "What is six times seven?", wait=False)
        await wait_for(pilot, backend.reasoned.is_set, "the reasoning streamed")
        await wait_for(pilot, lambda: "briefly." in block_text(app), "the block shows it")
        text = block_text(app)
        assert text.startswith("▾ Reasoning… · ") and REASONING in text
        reply = app.chat.conversation.last_assistant.reply
        assert reply.text == "" and reply.reasoning == REASONING
        backend.gate.set()
        await settle(pilot, app)
        # folded to one line once the answer came: count and (stable) duration
        n = len(REASONING.split())
        assert block_text(app) == f"▸ Reasoning · {n} tokens · – s"
        assert reply.text == "\n\n" + ANSWER and reply.reasoning == REASONING
        [view] = app.chat.query(ReplyView)
        assert "42" in view.markdown.source and "First I check" not in view.markdown.source
        # a click unfolds it, F4 folds it again
        await pilot.click(ReasoningBlock)
        await pilot.pause(0.05)
        assert block_text(app).startswith("▾ Reasoning · ") and REASONING in block_text(app)
        await pilot.press("f4")
        await pilot.pause(0.05)
        assert block_text(app) == f"▸ Reasoning · {n} tokens · – s"
        await pilot.press("f4")
        await pilot.pause(0.05)
        assert REASONING in block_text(app)


async def test_think_switch_reaches_the_request_and_a_budget_cuts_the_reasoning():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/think on")
        await send(pilot, app, "/set reasoning_budget 3")
        await send(pilot, app, "hello")
        backend = app.holder["backend"]
        assert backend.requests[-1].thinking is True
        assert backend.requests[-1].settings[0].reasoning_budget == 3
        reply = app.chat.conversation.last_assistant.reply
        assert reply.reasoning == "The user wrote" and reply.text.lstrip().startswith("You said: hello")
        assert "think on" in app.chat.status.settings and "reasoning_budget 3" in \
            app.chat.status.settings
        await send(pilot, app, "/think off")
        await send(pilot, app, "again")
        assert backend.requests[-1].thinking is False
        assert app.chat.conversation.last_assistant.reply.reasoning == ""
        # the earlier reply's reasoning goes with its message (the template decides)
        msgs = backend.requests[-1].messages
        assert [m.reasoning for m in msgs if m.role == "assistant"] == ["The user wrote"]


async def test_think_says_so_when_the_template_has_no_switch():
    import dataclasses

    backend = ScriptedBackend()
    backend.info = dataclasses.replace(backend.info, thinking_switch=False, reasoning="")
    app = make_app(backend=backend)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/think off")
        [warning] = notices(app, "warning")
        assert "has no reasoning switch" in str(warning.render())


async def test_token_view_and_alternatives_work_inside_the_reasoning():
    app = make_app(think_reply)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hi")
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        [view] = app.chat.query(ReplyView)
        units = view.token_view.units
        assert units[0].reasoning and not units[-1].reasoning
        await pilot.press("home")
        await pilot.pause(0.1)
        detail = str(app.chat.inspector.query_one(".detail").render())
        assert "token 1 of" in detail and "channel      reasoning" in detail
        await pilot.press("right", "2")  # continue from alternative 2 at reasoning token 2
        await settle(pilot, app)
        reply = app.chat.conversation.last_assistant.reply
        backend = app.holder["backend"]
        assert backend.requests[-1].prefix is not None
        chosen = reply.tokens[units[1].start]
        assert chosen.channel == "reasoning" and chosen.text == "alt1"
        assert reply.reasoning.startswith(REASONING.split()[0] + "alt1")


# ---- snapshots (tests/snapshots/reasoning_*.svg; see tests/test_snapshots.py) ----


def snapshot_reply(request, row):
    return ("The user asks for a table. I will give one row with a wide character, then "
            "say something short about it.", "Here is the table:\n\n| name | 值 |\n|---|---|\n"
            "| café | 日本語 |\n")


async def _ask(pilot) -> None:
    app = pilot.app
    app.chat.prompt.text = "A table, please"
    await pilot.press("enter")
    for _ in range(300):
        if not app.chat.generating:
            break
        await pilot.pause(0.01)
    await app.workers.wait_for_complete()


async def test_snapshot_reasoning_folded():
    from test_snapshots import snapshot

    await snapshot("reasoning_folded", _ask, reply=snapshot_reply)


async def test_snapshot_reasoning_unfolded():
    from test_snapshots import snapshot

    async def run_before(pilot):
        await _ask(pilot)
        await pilot.press("f4")

    await snapshot("reasoning_unfolded", run_before, reply=snapshot_reply)


def test_readme_documents_the_reasoning_commands_keys_flags_and_format():
    from pathlib import Path

    from chatui.commands import COMMANDS
    from chatui.screens.chat import ChatScreen

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for spec in COMMANDS:
        assert f"`/{spec.name}" in readme, spec.name
    keys = {b.key: b for b in ChatScreen.BINDINGS if hasattr(b, "key")}
    assert "f4" in keys and "| F4 (or a click on it) | unfold / fold the last reply's reasoning" \
        in readme
    for claim in ("**Reasoning models.**", "`--reasoning-budget N`", "`--hide-reasoning`",
                  "`--think on\\|off`", '"channel": "reasoning"|"answer"',
                  '"reasoning": str, "reasoning_s"', "reasoning_budget},",
                  "<details><summary>Reasoning"):
        assert claim in readme, claim


def test_a_long_reasoning_streams_its_tail_and_unfolds_in_full():
    from chatui.widgets.reasoning import LIVE_TAIL, live_tail

    text = "\n".join(f"step {i}: " + "word " * 12 for i in range(200))
    tail = live_tail(text)
    assert tail.startswith("…step ") and text.endswith(tail[1:])
    assert len(tail) <= LIVE_TAIL + 1
    assert live_tail("short") == "short"


async def test_openai_reasoning_content_fills_the_same_block():
    from test_openai_backend import FakeServer, chunk, entry

    from inference.openai_backend import OpenAIBackend

    def chat(h, body):
        h.start_sse()
        for p in ["Thinking", " it", " over."]:
            c = chunk(None, [entry(p, -0.3, [(p, -0.3)], p.encode())])
            c["choices"][0]["delta"] = {"reasoning_content": p}
            h.event(c)
        for p in ["Yes", "."]:
            h.event(chunk(p, [entry(p, -0.1, [(p, -0.1)], p.encode())]))
        h.event(chunk(None, None, "stop"))
        h.end_sse()

    fake = FakeServer()
    fake.chat = chat
    try:
        app = make_app(backend=OpenAIBackend(fake.url, None, None))
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "Well?")
            reply = app.chat.conversation.last_assistant.reply
            assert reply.reasoning == "Thinking it over." and reply.text == "Yes."
            assert block_text(app) == "▸ Reasoning · 3 tokens · – s"
            [view] = app.chat.query(ReplyView)
            assert view.markdown.source == "Yes."
    finally:
        fake.close()
