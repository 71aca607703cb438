"""Pilot tests of the chat app on the scripted engine: every command and key of issue 3."""

from __future__ import annotations

import asyncio
import time

import pytest

from chatui.app import ChatApp
from chatui.config import AppConfig, load_remembered
from chatui.textual_compat.testing import deliver
from chatui.widgets.items import Notice, UserMessage
from chatui.widgets.reply import ReplyView
from chatui.widgets.token_view import build_units
from inference.scripted import ScriptedBackend
from inference.settings import SamplingParams
from inference.types import Token

SIZE = (110, 40)


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "config"


def make_app(reply=None, *, delay_s=0.0, context_limit=4096, backend=None, **config):
    holder = {}

    def factory(progress):
        b = backend or ScriptedBackend(reply or _echo, delay_s=delay_s,
                                       context_limit=context_limit)
        holder["backend"] = b
        return b

    app = ChatApp(factory, config=AppConfig(stable_timings=True, **config))
    app.holder = holder  # type: ignore[attr-defined]
    return app


def _echo(request, row):
    from inference.scripted import echo_reply

    return echo_reply(request, row)


async def loaded(pilot, app, timeout_s: float = 30.0):
    """Until the model has loaded (or failed to). Time-bound, not a count of pauses: a real
    engine's first load in a fresh process (a test run alone) took over the 2 s that 200
    pauses gave it, and test_status_line_names_the_weights_quantization failed so."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if app.chat.info is not None or app.chat.load_error:
            return
        await pilot.pause(0.01)
    raise AssertionError("model did not load")


async def send(pilot, app, text, *, wait=True):
    await loaded(pilot, app)
    app.chat.prompt.text = text
    await pilot.press("enter")
    if wait:
        await settle(pilot, app)


SETTLE_S = 60.0
"""How long a reply may take to end before a test fails (a hang is a failure, not a wait)."""


def at_top(app, entry) -> bool:
    """Whether ``entry``'s message is drawn with its top at the top of the conversation's view
    (within the margin above it)."""
    items = app.chat.window.items_of(entry)
    if not items or not items[0].widgets:
        return False
    top, view = items[0].widgets[0].region, app.chat.log_view.content_region
    return view.y <= top.y <= view.y + 2


async def until_at_top(pilot, app, entry) -> bool:
    """``at_top`` once the conversation's window is up to date (or after ~2 s)."""
    for _ in range(100):
        await pilot.pause(0.02)
        if at_top(app, entry) and not app.chat.window.busy:
            return True
    return at_top(app, entry)


async def settle(pilot, app):
    """Wait until no reply is being generated; fail after SETTLE_S."""
    await pilot.pause()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_S
    while True:
        worker = app.chat._gen_worker
        if not app.chat.generating and (worker is None or worker.is_finished):
            break
        if loop.time() > deadline:
            raise AssertionError(f"the reply did not end within {SETTLE_S:.0f} s")
        await pilot.pause(0.01)
    await asyncio.wait_for(app.workers.wait_for_complete(), SETTLE_S)
    await pilot.pause(0.1)


async def tap(app, key, wait=0.05):
    """Press a key without waiting for the app to be idle (it is busy while streaming)."""
    from textual import events

    deliver(app, events.Key(key, key if len(key) == 1 else None))
    await asyncio.sleep(wait)


async def send_nowait(app, text):
    app.chat.prompt.text = text
    await tap(app, "enter")


def notices(app, kind=None):
    return [n for n in app.chat.query(Notice) if kind is None or n.kind == kind]


def replies(app):
    return list(app.chat.query(ReplyView))


async def test_send_prompt_streams_markdown_reply():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        conv = app.chat.conversation
        assert [e.role for e in conv.entries] == ["user", "assistant"]
        reply = conv.entries[1].reply
        assert reply.finish_reason == "stop"
        assert reply.text.startswith("You said: hello")
        view = replies(app)[0]
        assert view.markdown.source == reply.text  # every token reached the screen
        assert len(reply.tokens) > 10
        assert app.chat.prompt.text == ""
        assert app.chat.status.context_used > 0


async def test_long_reply_with_fences_loses_nothing():
    body = "".join(f"line {i}\n" for i in range(300))
    text = f"Intro\n\n```python\n{body}```\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nEnd."
    app = make_app(lambda r, row: text, settings=SamplingParams(max_new_tokens=5000))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go")
        view = replies(app)[0]
        assert view.reply.finish_reason == "stop"
        assert view.markdown.source == text
        assert app.chat.conversation.entries[1].content == text


async def test_cancel_mid_reply_keeps_partial_text_marked_stopped():
    long = " ".join(f"w{i}" for i in range(400))
    app = make_app(lambda r, row: long, delay_s=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send_nowait(app, "go")
        await asyncio.sleep(0.3)
        assert app.chat.generating
        await tap(app, "escape")
        await settle(pilot, app)
        reply = app.chat.conversation.entries[1].reply
        assert reply.finish_reason == "cancelled"
        assert 0 < len(reply.tokens) < 400
        finish = replies(app)[0].query_one(".reply-finish")
        assert "stopped" in str(finish.render())


async def test_ctrl_c_stops_the_reply_and_never_quits():
    long = " ".join(f"w{i}" for i in range(400))
    app = make_app(lambda r, row: long, delay_s=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send_nowait(app, "go")
        await asyncio.sleep(0.2)
        await tap(app, "ctrl+c")
        await settle(pilot, app)
        assert app.chat.conversation.entries[1].reply.finish_reason == "cancelled"
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.is_running


async def test_clear_empties_conversation_and_engine_cache(config_dir):
    """/clear starts afresh and says where the conversation went (saved: /history lists it);
    with nothing to keep, it only says it cleared."""
    from chatui import transcript as tr

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        old = app.chat.conversation
        await send(pilot, app, "/clear")
        assert app.chat.conversation.entries == ()
        assert not replies(app) and not list(app.chat.query(UserMessage))
        assert app.holder["backend"].resets == 1
        assert app.chat.status.context_used == 0
        assert "saved (/history lists it)" in str(notices(app)[-1].render())
        app.flush_autosaves()
        path = tr.autosave_path(old, app.config.transcripts_dir())
        assert tr.load_transcript(path).entries[0].text == "hello"
        await send(pilot, app, "/clear")
        assert str(notices(app)[-1].render()) == "Conversation cleared."


async def test_exit_quits():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/exit")
        await pilot.pause()
    assert app.return_code == 0


async def test_retry_regenerates_last_reply():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+r")
        await settle(pilot, app)
        conv = app.chat.conversation
        assert [e.role for e in conv.entries] == ["user", "assistant"]
        assert len(replies(app)) == 1
        assert len(app.holder["backend"].requests) == 2
        assert app.holder["backend"].requests[1].messages[-1].content == "hello"


async def test_edit_puts_last_prompt_back_and_sends_it_as_a_sibling():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first")
        await send(pilot, app, "/edit")
        assert app.chat.prompt.text == "first"
        conv = app.chat.conversation
        before = list(conv.entries)
        assert [e.text for e in before][0] == "first" and len(before) == 2  # unchanged till sent
        assert "editing" in str(app.chat.prompt.border_title)
        app.chat.prompt.text = "first, edited"
        await pilot.press("enter")
        await settle(pilot, app)
        assert conv.entries[0].text == "first, edited" and len(conv.entries) == 2
        assert [e.text for e in conv.siblings(conv.entries[0])] == ["first", "first, edited"]
        assert not app.chat.prompt.border_title and app.chat.state.editing is None
        assert len(replies(app)) == 1  # the old branch is off the screen, in the tree


async def test_retry_and_edit_n_branch_from_any_message():
    """Users of every chat tool ask to regenerate any message, not only the last: /retry N
    regenerates reply N, /edit N puts your message N back in the box; the old message and
    everything after it stay in the tree, a branch (‹ ›)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        for text in ("one", "two", "three"):
            await send(pilot, app, text)
        conv = app.chat.conversation
        old = list(conv.entries)
        await send(pilot, app, "/retry 2")  # the reply to "one"
        assert [e.text for e in conv.entries[:1]] == ["one"] and len(conv.entries) == 2
        assert app.holder["backend"].requests[-1].messages[-1].content == "one"
        assert [s is old[1] for s in conv.siblings(conv.entries[1])] == [True, False]
        assert len(replies(app)) == 1  # "two" and "three" are off the screen, in the tree
        await send(pilot, app, "/retry 1")  # your message: the reply to it
        assert len(conv.siblings(conv.entries[1])) == 3 and len(conv.entries) == 2
        await send(pilot, app, "/edit 2")
        assert "is a reply" in str(notices(app, "error")[-1].render())
        await send(pilot, app, "/edit 9")
        assert "from 1 to 2" in str(notices(app, "error")[-1].render())
        conv.select(old[1])  # back to the first branch
        await app.chat.sync_path()
        assert [e.text for e in conv.entries][::2] == ["one", "two", "three"]
        await send(pilot, app, "/edit 3")  # "two", in the middle
        assert app.chat.prompt.text == "two"
        assert "your message 3" in str(app.chat.prompt.border_title)
        app.chat.prompt.text = "two, edited"
        await pilot.press("enter")
        await settle(pilot, app)
        assert [e.text for e in conv.entries][::2] == ["one", "two, edited"]
        assert [e.text for e in conv.siblings(conv.entries[2])] == ["two", "two, edited"]
        every = {e.text for e in conv.all_entries()}  # nothing was lost
        assert {"one", "two", "three", "two, edited"} <= every


def log_order(app) -> list[str]:
    """The conversation's items top to bottom: a message's text, or "notice: " and its
    first words."""
    out = []
    for item in app.chat.window.items:
        if item.tag == "notice":
            out.append("notice: " + str(app.chat.window.draw(item)[0].render())[:17])
        else:
            out.append(item.key.text)
    return out


@pytest.mark.parametrize("how", ["/retry", "ctrl+r", "edit"])
async def test_a_retried_or_edited_exchange_stays_where_it_was_above_later_notices(how):
    """The reply a retry or an edit brings goes where the one it replaces was: right under its
    prompt, above the notices that came after it. It went to the end, and a notice ("Saved
    to ...") stood between the prompt and its reply (seen in tmux). A message sent after
    that goes at the end, below them."""
    texts = iter(["first reply", "second reply", "third reply", "fourth reply"])
    app = make_app(lambda request, row: next(texts))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "question")
        await send(pilot, app, "/settings")
        await send(pilot, app, "/settings")
        assert log_order(app) == ["question", "first reply", "notice: Settings in force",
                                  "notice: Settings in force"]
        if how == "edit":
            await pilot.press("ctrl+g")
            await pilot.pause()
            app.chat.prompt.text = "question, edited"
            await pilot.press("enter")
            await settle(pilot, app)
        elif how == "ctrl+r":
            await pilot.press("ctrl+r")
            await settle(pilot, app)
        else:
            await send(pilot, app, how)
        asked = "question, edited" if how == "edit" else "question"
        assert log_order(app) == [asked, "second reply", "notice: Settings in force",
                                  "notice: Settings in force"]
        await send(pilot, app, "next")
        assert log_order(app) == [asked, "second reply", "notice: Settings in force",
                                  "notice: Settings in force", "next", "third reply"]
        await send(pilot, app, "/retry")  # (nothing after it: at the end, as before)
        assert log_order(app)[-2:] == ["next", "fourth reply"]


@pytest.mark.parametrize("leave", ["escape", "ctrl+l"])
async def test_an_edit_abandoned_leaves_the_conversation_as_it_was(leave):
    """Esc, or Ctrl+L (the box's clear key), ends an edit: the message and its reply stay on the screen
    (the edit used to take them off at once, and only /tree found them again), and the next
    message is a plain follow-up."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first")
        def footer_actions() -> set[str]:  # as the person sees them
            return {k.action for k in app.chat.query("FooterKey")}

        await pilot.press("ctrl+g")
        await pilot.pause(0.1)
        assert app.chat.state.editing is not None and app.chat.prompt.text == "first"
        assert "cancel_edit" in footer_actions()  # Esc says "Cancel edit" ("Stop", it said)
        await pilot.press(leave)
        await pilot.pause(0.1)
        assert app.chat.state.editing is None and app.chat.prompt.text == ""
        assert not app.chat.prompt.border_title and "cancel_edit" not in footer_actions()
        conv = app.chat.conversation
        assert [e.role for e in conv.entries] == ["user", "assistant"]
        assert conv.entries[0].text == "first" and len(replies(app)) == 1
        await send(pilot, app, "second")
        assert [e.text for e in conv.entries[::2]] == ["first", "second"]
        assert len(conv.all_entries()) == 4


async def test_an_edit_retyped_from_an_empty_box_is_still_the_edit():
    """Deleting the edited text to type it anew (Ctrl+U, Backspace) keeps the edit: what is
    sent goes beside the old message as a branch. Seen in tmux: Ctrl+U ended the edit
    silently, and the retyped message was sent as a new turn after the old reply."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first")
        await pilot.press("ctrl+g")
        await pilot.pause(0.1)
        await pilot.press("ctrl+u", *["backspace"] * 3)
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "" and app.chat.state.editing is not None
        assert app.chat.prompt.border_title  # still says "editing"
        await send(pilot, app, "again")
        conv = app.chat.conversation
        assert [e.text for e in conv.entries[::2]] == ["again"]  # beside "first", not after
        assert sorted(e.text for e in conv.all_entries() if e.role == "user") == [
            "again", "first"]
        assert app.chat.state.editing is None and not app.chat.prompt.border_title


async def test_an_edit_ends_when_its_message_leaves_the_screen():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first")
        await send(pilot, app, "/edit")
        await send(pilot, app, "/clear")
        assert app.chat.state.editing is None and not app.chat.prompt.border_title


async def test_continue_after_length_limit_appends_to_same_reply():
    app = make_app(lambda r, row: "one two three four five six seven eight")
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/set max_tokens 3")
        await send(pilot, app, "count")
        reply = app.chat.conversation.entries[1].reply
        assert reply.finish_reason == "length" and reply.text == "one two three"
        await send(pilot, app, "/set max_tokens 100")
        # the scripted engine ignores the prefix and replies from the start of its script
        await send(pilot, app, "/continue")
        request = app.holder["backend"].requests[-1]
        assert request.prefix is not None and request.prefix.text == "one two three"
        assert request.prefix.token_ids is None  # scripted tokens carry no ids
        assert request.messages[-1].content == "count"
        assert len(app.chat.conversation.entries) == 2
        assert reply.text.startswith("one two threeone two")
        assert [t.index for t in reply.tokens] == list(range(len(reply.tokens)))
        assert len(replies(app)) == 1
        assert reply.finish_reason == "stop"
        await send(pilot, app, "/continue")
        assert "finished on its own" in str(notices(app, "error")[-1].render())


async def test_set_validates_with_engine_messages_and_settings_shows():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/set temperature -1")
        assert "temperature must be between 0 and 100" in str(notices(app, "error")[-1].render())
        await send(pilot, app, "/set top_p 0.5")
        assert app.chat.settings.top_p == 0.5
        await send(pilot, app, "/set temp=0 seed=3")
        assert app.chat.settings.temperature == 0 and app.chat.settings.seed == 3
        assert "temp 0" in app.chat.status.settings
        # several pairs as the status line writes them (the first one's value was the rest)
        await send(pilot, app, "/set temp 0.3 max 64 seed 5")
        s = app.chat.settings
        assert (s.temperature, s.max_new_tokens, s.seed) == (0.3, 64, 5)
        # what changed, then what is on, in the words /set takes (it listed every field as
        # name=value: "repetition_penalty=1 seed=None" after "/set max 40")
        assert str(notices(app)[-1].render()) == (
            "Set temp 0.3 (was 0), max 64 (was 512), seed 5 (was 3). "
            "In force: temp 0.3 · max 64 · top_p 0.5 · seed 5. Kept for your next chat with "
            "this model (/set reset forgets it).")
        await send(pilot, app, "/set max 64")
        assert str(notices(app)[-1].render()).startswith("Nothing changed. In force: temp 0.3")
        await send(pilot, app, "/set stop User: and")  # a stop string keeps its spaces
        assert app.chat.settings.stop == ("User: and",)
        await send(pilot, app, "/settings")
        shown = str(notices(app)[-1].render())
        assert shown.startswith("Settings in force: temp 0.3 · max 64 · top_k 0 · top_p 0.5 · "
                                "min_p 0 · rep 1 · seed 5 · stop User: and · "
                                "reasoning_budget none\nModel defaults: temp 0.7 · max 512 · "), shown
        await send(pilot, app, "hi")
        assert app.holder["backend"].requests[-1].settings[0].top_p == 0.5


async def test_set_is_kept_for_the_next_chat_with_the_model_and_reset_forgets_it(tmp_path):
    """What /set changes is kept for the model's next chat (it began from the model's
    defaults every time), said when the chat starts; a flag of the command line goes on top
    for its session and is not kept; /set back to a default keeps that field no more; /set
    reset forgets all and is back at the defaults."""
    async def chat(**config) -> tuple[str, str]:
        """A new chat's settings in force (its status line) and what it said at the start."""
        app = make_app(config_dir=tmp_path, **config)
        async with app.run_test(size=SIZE) as pilot:
            await loaded(pilot, app)
            await pilot.pause(0.05)
            return app.chat.status.settings, "\n".join(str(n.render()) for n in notices(app))

    async def commands(*typed: str) -> list[str]:
        app = make_app(config_dir=tmp_path)
        async with app.run_test(size=SIZE) as pilot:
            for text in typed:
                await send(pilot, app, text)
            return [str(n.render()) for n in notices(app)]

    status, said = await chat()
    assert status == "temp 0.7 · max 512" and "Kept" not in said
    await commands("/set temp 0.3 max 64 seed 5")
    status, said = await chat()
    assert status == "temp 0.3 · max 64 · seed 5", status
    assert ("Kept from your last chat with this model: temp 0.3 (the model's 0.7), max 64 "
            "(the model's 512), seed 5 (the model's none). /set reset goes back to the "
            "model's own.") in said, said
    status, said = await chat(settings_overrides={"max_tokens": 40})  # --max-tokens 40
    assert status == "temp 0.3 · max 40 · seed 5", status
    assert "In force with the command line's flags: temp 0.3 · max 40 · seed 5." in said, said
    shown = await commands("/set seed none", "/settings")
    assert "Kept for this model's next chat: temp 0.3 (the model's 0.7), max 64 (the model's " \
           "512) (/set reset forgets it)" in shown[-1], shown
    status, _ = await chat()
    assert status == "temp 0.3 · max 64", status
    shown = await commands("/set reset")
    assert shown[-1].startswith("Back to the model's defaults: temp 0.7 (was 0.3), max 512 "
                                "(was 64). Nothing kept for its next chat."), shown
    status, said = await chat()
    assert status == "temp 0.7 · max 512" and "Kept" not in said


async def test_system_prompt_is_sent():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/system You are terse.")
        await send(pilot, app, "hi")
        msgs = app.holder["backend"].requests[-1].messages
        assert msgs[0].role == "system" and msgs[0].content == "You are terse."


async def test_unknown_command_says_so_and_suggests():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/retyr")
        text = str(notices(app, "error")[-1].render())
        assert "Unknown command /retyr" in text and "/retry" in text
        assert app.chat.conversation.entries == ()  # never sent to the model
        assert not app.holder["backend"].requests  # never sent to the model


async def test_help_screen_opens_and_closes():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("f1")
        await pilot.pause()
        assert app.screen.__class__.__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.chat
        await send(pilot, app, "/help")
        assert app.screen.__class__.__name__ == "HelpScreen"


async def test_prompt_history_and_newline_key():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first")
        await send(pilot, app, "second")
        prompt = app.chat.prompt
        await pilot.press("up")
        assert prompt.text == "second"
        await pilot.press("up")
        assert prompt.text == "first"
        await pilot.press("down", "down")
        assert prompt.text == ""
        await pilot.press("a", "ctrl+j", "b")
        assert prompt.text == "a\nb"


async def test_completion_with_tab_and_hint():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.press("/", "r", "e", "t")
        await pilot.pause()
        hint = app.chat.query_one("#hint")
        assert hint.display and "/retry" in str(hint.render())
        await pilot.press("tab")
        assert app.chat.prompt.text == "/retry "  # (it takes a number: /retry N)


async def test_token_view_cursor_and_inspector():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        view = replies(app)[0]
        assert view.token_mode and app.chat.inspector.display
        tv = view.token_view
        assert app.focused is tv
        assert tv.cursor == len(tv.units) - 1
        await pilot.press("home", "right", "right")
        await pilot.pause(0.1)
        assert tv.cursor == 2
        detail = str(app.chat.inspector.query_one(".detail").render())
        token = view.reply.tokens[tv.units[2].start]
        assert "token 3 of" in detail and "alternatives" in detail and "entropy" in detail
        assert f"{token.prob:.2%}" in detail
        await pilot.press("n")
        lowest = min(u.logprob for u in tv.units)
        assert tv.units[tv.cursor].logprob == lowest
        footer = {k.action for k in app.chat.query("FooterKey")}
        assert "to_prompt" in footer and "stop" not in footer  # Esc said "Stop" here
        await pilot.press("escape")
        assert app.focused is app.chat.prompt and view.token_mode  # the view stays on
        await pilot.pause()
        assert "to_prompt" not in {k.action for k in app.chat.query("FooterKey")}
        await pilot.press("ctrl+t")
        await pilot.pause()
        assert not view.token_mode and not app.chat.inspector.display


async def test_token_view_switches_while_streaming_and_mouse_selects():
    long = " ".join(f"w{i}" for i in range(300))
    app = make_app(lambda r, row: long, delay_s=0.005)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send_nowait(app, "go")
        await asyncio.sleep(0.2)
        await tap(app, "ctrl+t", 0.2)
        assert app.chat.generating and replies(app)[0].token_mode
        await settle(pilot, app)
        tv = replies(app)[0].token_view
        assert len(tv.units) == 300
        lines = tv.plain_lines()
        assert "".join(lines) == long and len(lines) > 1  # wrapped at spaces, none dropped
        # each break is at a space, which ends the line above (hanging past the edge, cropped
        # when drawn, when that line is full): no line starts with the space
        assert all(a.endswith(" ") and not b.startswith(" ") for a, b in zip(lines, lines[1:]))
        assert all(len(line.removesuffix(" ")) <= tv.size.width for line in lines)
        assert tv.text == long
        await pilot.click(tv, offset=(1, 0))  # padding 1: the first cell of the first line
        await pilot.pause(0.1)
        assert tv.cursor == 0


async def test_token_view_keeps_the_space_where_a_line_breaks():
    """A token " wK" that does not fit leaves its space at the end of the line: the token can
    be clicked there, the cursor copies it with its space, and a mouse selection across the
    break gives the text back without a made-up line break."""
    from textual.geometry import Offset
    from textual.selection import Selection

    long = " ".join(f"w{i}" for i in range(300))
    app = make_app(lambda r, row: long, token_view=True)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go")
        tv = replies(app)[0].token_view
        lines = tv.plain_lines()
        y = next(y for y, line in enumerate(lines) if line.endswith(" "))
        here, there = tv._wrapper.lines[y].pieces, tv._wrapper.lines[y + 1].pieces
        unit = here[-1].unit
        assert here[-1].text == " " and there[0].unit == unit  # one token, two lines
        assert tv.units[unit].text == " " + there[0].text
        await pilot.click(tv, offset=(1 + len(lines[y]) - 1, y))  # the space ending line y
        await pilot.pause(0.1)
        assert tv.cursor == unit
        assert tv.selected_text == tv.units[unit].text
        await pilot.press("ctrl+c")  # not streaming: copies the token under the cursor
        assert app.clipboard == tv.units[unit].text
        app.screen.selections = {tv: Selection(Offset(3, y), Offset(4, y + 1))}
        await pilot.pause(0.1)
        before = sum(len(line) for line in lines[:y])
        assert tv.selected_text == long[before + 3:before + len(lines[y]) + 4]
        app.screen.selections = {}


async def test_continue_from_alternative_adds_a_sibling():
    """Issue 18: the reply continued from an alternative is a new sibling sharing the
    prefix; the original stays in the tree (‹ 1/2 ›)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        view = replies(app)[0]
        tv = view.token_view
        await pilot.press("home", "right", "right", "2")
        await settle(pilot, app)
        request = app.holder["backend"].requests[-1]
        assert request.prefix is not None
        assert request.prefix.text == "You said:alt1"
        original = view.reply
        assert original.tokens[2].text != "alt1" and not original.text.startswith(
            "You said:alt1")
        view = replies(app)[0]
        tv = view.token_view
        reply = view.reply
        assert reply.tokens[2].text == "alt1" and reply.tokens[:2] == original.tokens[:2]
        assert reply.text.startswith("You said:alt1You said:")  # scripted ignores the prefix
        assert len(app.chat.conversation.entries) == 2 and len(replies(app)) == 1
        conv = app.chat.conversation
        assert [e.reply for e in conv.siblings(conv.entries[-1])] == [original, reply]
        assert tv.units and tv.tokens == reply.tokens
        assert tv.tokens is not reply.tokens  # the view keeps its own list


async def test_continue_from_alternative_uses_token_ids_when_known():
    class IdBackend(ScriptedBackend):
        def generate(self, request, cancel):
            import dataclasses

            for ev in super().generate(request, cancel):
                if hasattr(ev, "tokens"):
                    ev = dataclasses.replace(ev, tokens=tuple(
                        dataclasses.replace(t, id=100 + t.index, top=tuple(
                            dataclasses.replace(a, id=200 + k) for k, a in enumerate(t.top)))
                        for t in ev.tokens))
                yield ev

    app = make_app(backend=IdBackend())
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await app.chat.continue_from_alternative(replies(app)[0].id, 1, 3)
        await settle(pilot, app)
        prefix = app.holder["backend"].requests[-1].prefix
        assert prefix.token_ids == (100, 202)


async def test_multi_token_glyph_shown_once_and_special_hidden():
    toks = [Token(0, 1, "Hi ", -0.1, 0.1), Token(1, 2, "", -2.0, 0.1),
            Token(2, 3, "", -0.5, 0.1), Token(3, 4, "😀", -0.2, 0.1, glyph_start=1),
            Token(4, 5, "", -0.1, 0.1, special=True, raw="<|im_end|>")]
    units = build_units(toks)
    assert [u.text for u in units] == ["Hi ", "😀"]
    assert units[1].start == 1 and units[1].end == 3 and units[1].logprob == -2.0
    raw = build_units(toks, raw=True)
    assert raw[-1].text == "<|im_end|>" and len(raw) == 5


async def test_raw_view_shows_special_tokens():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await send(pilot, app, "/raw")
        assert all(v.raw for v in replies(app))


async def test_theme_switch_is_remembered(config_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/theme chatui-light")
        assert app.theme == "chatui-light"
        await send(pilot, app, "/theme chatui-ligth")
        assert "Did you mean chatui-light?" in str(notices(app, "error")[-1].render())
    assert load_remembered(config_dir)["theme"] == "chatui-light"
    app2 = make_app()
    async with app2.run_test(size=SIZE):
        assert app2.theme == "chatui-light"
    app3 = make_app(theme="chatui-dark")
    async with app3.run_test(size=SIZE):
        assert app3.theme == "chatui-dark"


def _contrast(a: str, b: str) -> float:
    """WCAG's contrast ratio of two colours."""
    from textual.color import Color

    def luminance(text: str) -> float:
        c = Color.parse(text)
        lin = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
               for v in (c.r / 255, c.g / 255, c.b / 255)]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


async def test_the_heat_scale_is_readable_on_every_theme():
    """Each heat colour at least 3:1 (WCAG's floor for what must be told apart) against the
    background of every theme `/theme` offers, Textual's own included: a light theme without
    a heat scale had the dark one's pale blue at 1.3:1 on textual-light. (The ansi themes'
    background is the terminal's own colour, unknown here.)"""
    app = make_app()
    async with app.run_test(size=SIZE):
        checked = []
        for name in sorted(app.available_themes):
            if name.startswith("ansi-"):
                continue
            app.theme = name
            variables = app.get_css_variables()
            worst = min(_contrast(variables[f"heat-{i}"], variables["background"])
                        for i in range(5))
            assert worst >= 3.0, (name, round(worst, 2))
            checked.append(name)
        assert {"textual-light", "solarized-light", "nord", "chatui-light"} <= set(checked)


async def test_load_failure_is_shown_in_the_app():
    def factory(progress):
        raise RuntimeError("no such checkpoint: /nope")

    app = ChatApp(factory, config=AppConfig())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.pause()
        assert "no such checkpoint" in app.chat.load_error
        assert "could not be loaded" in str(notices(app, "error")[-1].render())
        await send(pilot, app, "hello")
        assert app.chat.prompt.text == "hello"
        await send(pilot, app, "/help")  # commands still work
        assert app.is_running


async def test_generation_failure_gives_prompt_back():
    class Broken(ScriptedBackend):
        def generate(self, request, cancel):
            raise RuntimeError("CUDA out of memory")
            yield

    app = make_app(backend=Broken())
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        assert "out of memory" in str(notices(app, "error")[-1].render())
        assert app.chat.conversation.entries == ()
        assert app.chat.prompt.text == "hello"


async def test_context_overflow_notice():
    class Dropping(ScriptedBackend):
        def generate(self, request, cancel):
            import dataclasses

            from inference.types import Started

            for ev in super().generate(request, cancel):
                if isinstance(ev, Started):
                    ev = dataclasses.replace(ev, dropped_messages=2)
                yield ev

    app = make_app(backend=Dropping(context_limit=64))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        text = str(notices(app, "warning")[-1].render())
        assert "oldest 2 messages were left out" in text
        assert app.chat.status.context_limit == 64


async def test_markup_and_escapes_in_output_are_literal():
    evil = "[bold red]x[/] [@click=app.quit]click[/] \x1b[31mred\x1b[0m [link](http://x)"
    app = make_app(lambda r, row: evil)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, evil)
        message = app.chat.query_one(UserMessage)
        user = "".join(message.render_line(y).text for y in range(message.size.height))
        assert "[bold red]x[/]" in user and "\x1b" not in user and "␛" in user
        md = replies(app)[0].markdown
        assert "\x1b" not in md.source and "[bold red]x[/]" in md.source
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        plain = "".join(replies(app)[0].token_view.plain_lines())
        assert "[@click=app.quit]click[/]" in plain and "\x1b" not in plain
        await pilot.click(replies(app)[0].token_view, offset=(20, 0))
        await pilot.pause()
        assert app.is_running


async def test_copy_without_clipboard_does_not_crash():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/copy")
        assert "no reply to copy" in str(notices(app, "error")[-1].render())
        await send(pilot, app, "hi")
        await pilot.press("f2")
        assert app.clipboard.startswith("You said: hi")
        await pilot.press("f3")
        assert app.clipboard == "print(0 + 0.7)"


async def test_message_sent_while_loading_goes_out_when_ready():
    import time

    def slow(progress):
        time.sleep(1.0)
        return ScriptedBackend()

    app = ChatApp(slow, config=AppConfig(stable_timings=True))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        app.chat.prompt.text = "early"
        await tap(app, "enter")
        assert app.chat.loading_panel.display

        def waiting() -> list[str]:
            return [str(n.render()) for n in app.chat.query(Notice)
                    if "still loading" in str(n.render())]

        await pilot.pause()  # the notice mounted
        assert len(waiting()) == 1  # said while it waits...
        await loaded(pilot, app)
        await settle(pilot, app)
        assert app.chat.conversation.entries[-1].reply.finish_reason == "stop"
        assert waiting() == []  # ...and gone once the message went out


async def test_palette_lists_commands():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        titles = [c.title for c in app.get_system_commands(app.chat)]
        assert "/clear" in titles and "/logprobs" in titles and "Theme: chatui-light" in titles


async def test_every_command_is_in_the_completion_the_palette_and_help():
    """One registry feeds all three: no command can be missing from one of them."""
    from chatui import commands
    from chatui.screens.help import help_text

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        palette = {c.title.split()[0] for c in app.get_system_commands(app.chat)}
        help_page = help_text().plain
        for spec in commands.COMMANDS:
            name = f"/{spec.name}"
            completed = [c.strip() for c in commands.completions(name[:2])]
            assert name in completed, f"{name} is not completed"
            assert name in palette, f"{name} is not in the command palette"
            assert f"  {name}" in help_page, f"{name} is not in /help"


async def test_palette_puts_a_command_that_needs_an_argument_in_the_prompt():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        [command] = [c for c in app.get_system_commands(app.chat)
                     if c.title.startswith("/set ")]
        command.callback()
        await pilot.pause()
        assert app.chat.prompt.text == "/set "
        assert not notices(app, "error")


async def test_ui_stays_responsive_while_generating():
    long = " ".join(f"w{i}" for i in range(2000))
    app = make_app(lambda r, row: long, delay_s=0.001)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send_nowait(app, "go")
        await asyncio.sleep(0.2)
        assert app.chat.generating
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await tap(app, "x", 0)
        for _ in range(2500):  # at most ~5 s: a key that never arrives fails, not hangs
            if app.chat.prompt.text == "x":
                break
            await asyncio.sleep(0.002)
        assert app.chat.prompt.text == "x", "the key typed while streaming never arrived"
        assert loop.time() - t0 < 0.2
        await tap(app, "escape")
        await settle(pilot, app)


async def test_autosave_save_history_load_export(tmp_path):
    from chatui import transcript

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "remember me")
        assert app.autosaver.flush(timeout=10)  # autosaves are written on a thread
        saved = transcript.list_transcripts(tmp_path / "data")
        assert len(saved) == 1 and saved[0].messages == 2
        await send(pilot, app, f"/save {tmp_path / 'mine.json'}")
        assert (tmp_path / "mine.json").exists()
        await send(pilot, app, f"/export {tmp_path / 'out.md'}")
        assert "remember me" in (tmp_path / "out.md").read_text()
        await send(pilot, app, "/clear")
        await send(pilot, app, "/history")
        assert "remember me" in str(notices(app)[-1].render())
        await send(pilot, app, "/load 1")
        conv = app.chat.conversation
        assert [e.content for e in conv.entries][0] == "remember me"
        assert len(replies(app)) == 1 and replies(app)[0].reply.tokens
        await send(pilot, app, f"/load {tmp_path / 'missing.json'}")
        assert "missing.json" in str(notices(app, "error")[-1].render())


async def test_save_into_a_folder_and_a_markdown_export_loaded_says_what_it_is(tmp_path):
    """`/save DIR` saves into the folder under the conversation's own file name, as `/export`
    does (it said "it is a directory"); saved again, the same file. `/load` of a Markdown
    export says it is one instead of naming a JSON parse error."""
    from chatui import transcript

    folder = tmp_path / "keep"
    folder.mkdir()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "remember me")
        await send(pilot, app, f"/save {folder}")
        files = list(folder.iterdir())
        assert len(files) == 1 and files[0].name == transcript.autosave_path(
            app.chat.conversation, folder).name, files
        assert str(files[0]) in str(notices(app)[-1].render())
        await send(pilot, app, "and me")
        await send(pilot, app, f"/save {folder}")
        assert list(folder.iterdir()) == files
        assert [e.content for e in transcript.load_transcript(files[0]).entries
                if e.role == "user"] == ["remember me", "and me"]
        await send(pilot, app, f"/export md {folder}")
        exported = folder / (files[0].stem + ".md")
        assert exported.exists()
        await send(pilot, app, f"/load {exported}")
        said = str(notices(app, "error")[-1].render())
        assert "it is Markdown, not a transcript" in said and "JSON" not in said
        assert len(replies(app)) == 2  # the conversation open is untouched


async def test_a_save_path_without_an_extension_gets_json_and_loads_back(tmp_path,
                                                                        monkeypatch):
    """`/save notes` writes notes.json (as `/export notes` writes notes.md; it wrote a file
    named `notes`), the notice names the whole path, and `/load notes` finds notes.json (its
    notice the whole path too, as /save's and /export's: it showed the path as typed); a
    file that is there under the bare name is still the one `/load` opens."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "remember me")
        await send(pilot, app, f"/save {tmp_path / 'notes'}")
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["notes.json"]
        assert f"Saved to {tmp_path / 'notes.json'}" in str(notices(app)[-1].render())
        await send(pilot, app, "/clear")
        await send(pilot, app, f"/load {tmp_path / 'notes'}")
        assert [e.content for e in app.chat.conversation.entries][0] == "remember me"
        assert str(tmp_path / "notes.json") in str(notices(app)[-1].render())
        monkeypatch.chdir(tmp_path)
        await send(pilot, app, "/load notes")
        assert f"Loaded {tmp_path / 'notes.json'} (2 messages)" in str(notices(app)[-1].render())
        (tmp_path / "bare").write_text("not a transcript")
        (tmp_path / "bare.json").write_bytes((tmp_path / "notes.json").read_bytes())
        await send(pilot, app, f"/load {tmp_path / 'bare'}")
        assert "bare" in str(notices(app, "error")[-1].render())


async def test_a_transcript_given_at_start_is_opened(tmp_path):
    first = make_app()
    async with first.run_test(size=SIZE) as pilot:
        await send(pilot, first, "open me later")
        await send(pilot, first, f"/save {tmp_path / 'start.json'}")
    app = make_app(load_path=tmp_path / "start.json")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        for _ in range(500):
            if any("Loaded" in str(n.render()) for n in notices(app)):
                break
            await pilot.pause(0.01)
        await pilot.pause()
        assert [e.role for e in app.chat.conversation.entries] == ["user", "assistant"]
        assert app.chat.conversation.entries[0].text == "open me later"
        assert len(replies(app)) == 1


async def test_settings_overrides_apply_on_model_defaults():
    app = make_app(settings_overrides={"temperature": 0.1, "max_tokens": 9})
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        assert app.chat.settings.temperature == 0.1 and app.chat.settings.max_new_tokens == 9


async def test_typing_after_esc_in_token_view_goes_to_the_prompt():
    long = " ".join(f"w{i}" for i in range(400))
    app = make_app(lambda r, row: long, delay_s=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send_nowait(app, "go")
        await asyncio.sleep(0.2)
        await tap(app, "ctrl+t", 0.2)
        tv = replies(app)[0].token_view
        assert app.focused is tv
        await tap(app, "escape", 0.1)  # stops the reply; the token view keeps the focus
        await settle(pilot, app)
        reply = app.chat.conversation.entries[-1].reply
        assert reply.finish_reason == "cancelled"
        cursor = tv.cursor
        before = len(reply.tokens)
        for key in [*"/continue", "enter"]:  # one burst, as a terminal delivers typing
            await tap(app, key, 0)
        await pilot.pause(0.2)
        assert tv.cursor == cursor  # its 'n' did not jump to the least likely token
        assert app.focused is app.chat.prompt
        assert app.chat.prompt.prompt_history[-1] == "/continue"
        await settle(pilot, app)
        assert len(reply.tokens) > before and reply.finish_reason in ("stop", "length")
        tv.focus()  # the view's own keys still work there
        await pilot.press("home", "right")
        assert tv.cursor == 1


async def test_enter_right_behind_typed_keys_sends_them_all():
    """Keys that arrive in one burst (a fast typist, a terminal without bracketed paste, a busy
    app) are sent whole: Enter is a priority binding, handled before the characters queued
    ahead of it reach the prompt, so the prompt waits for them."""
    from textual import events

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        text = "Write a short poem about the sea."
        keys = [events.Key(ch if ch != " " else "space", ch) for ch in text]
        for key in [*keys, events.Key("enter", "\r")]:  # as the driver delivers a burst
            deliver(app, key)
        for _ in range(100):
            await pilot.pause(0.02)
            if app.chat.conversation.entries:
                break
        assert app.chat.conversation.entries[0].text == text
        assert app.chat.prompt.text == ""


async def test_prompt_cursor_is_steady_while_a_reply_streams():
    """A blinking cursor repaints the prompt twice a second; while a reply streams it stays
    on, then blinks again as before."""
    app = make_app(lambda r, row: "word " * 300, delay_s=0.01)  # 3 s: long on a busy machine
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send_nowait(app, "go")
        for _ in range(500):
            if app.chat.generating:
                break
            await asyncio.sleep(0.005)
        assert app.chat.generating and app.chat.prompt.cursor_blink is False
        await tap(app, "escape")
        await settle(pilot, app)
        assert app.chat.prompt.cursor_blink is True


def test_chatui_has_no_import_cycle():
    """No chatui module imports (at module level, TYPE_CHECKING blocks included) one that
    imports it back, directly or transitively: the app talks down to the screen by calls,
    the screen up by messages, and compare mode and commands reach the screen through narrow
    protocols."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    modules = {}
    for path in (root / "chatui").rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path

    def resolve(current: str, is_pkg: bool, level: int, module: str | None) -> str:
        if level == 0:
            return module or ""
        base = current.split(".")
        base = base if is_pkg else base[:-1]
        base = base[:len(base) - (level - 1)]
        return ".".join(base + ([module] if module else []))

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        edges = graph.setdefault(name, set())

        def visit(body):
            for node in body:
                if isinstance(node, ast.Import):
                    edges.update(a.name for a in node.names if a.name in modules)
                elif isinstance(node, ast.ImportFrom):
                    target = resolve(name, is_pkg, node.level, node.module)
                    if target in modules:
                        edges.add(target)
                    for a in node.names:
                        if f"{target}.{a.name}" in modules:
                            edges.add(f"{target}.{a.name}")
                elif isinstance(node, (ast.If, ast.Try)):
                    visit(node.body)
                    visit(getattr(node, "orelse", []))
                    for h in getattr(node, "handlers", []):
                        visit(h.body)

        visit(ast.parse(path.read_text("utf-8")).body)
        edges.discard(name)

    def reaches(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(graph.get(m, ()))
        return seen

    cycles = sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if a in reaches(b))
    assert not cycles, "import cycles: " + ", ".join(cycles)


async def test_a_narrow_terminal_puts_the_inspector_below_the_conversation():
    """Under 72 cells the token inspector (46 cells beside the conversation) goes below it:
    at 40 cells it took the whole width and the conversation was gone."""
    app = make_app()
    async with app.run_test(size=(50, 30)) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        log, inspector = app.chat.log_view.region, app.chat.inspector.region
        assert inspector.y >= log.bottom and inspector.width == 50 and log.width == 50
        assert log.height >= 5 and inspector.height >= 5
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        log, inspector = app.chat.log_view.region, app.chat.inspector.region
        assert inspector.x >= log.right and inspector.y == log.y  # beside it
