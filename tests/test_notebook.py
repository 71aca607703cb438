"""Raw mode in the app (issue 17, part 2): ``chatui --raw`` and ``/raw-mode`` open a notebook
whose text the model continues in place as plain text; the continuation equals transformers'
``generate`` on the same ids; the transcript records the mode; a checkpoint without a chat
template opens in it with a notice."""

from __future__ import annotations

import json

import torch
from test_app import SIZE, config_dir, loaded, make_app, send  # noqa: F401

from chatui.conversation import Conversation
from chatui.screens.notebook import NO_TEMPLATE_NOTICE, NotebookScreen
from chatui.transcript import from_json_dict, to_json_dict
from inference.types import Message


async def notebook(pilot, app) -> NotebookScreen:
    await loaded(pilot, app)
    for _ in range(200):
        screen = app.screen
        if isinstance(screen, NotebookScreen) and screen.is_mounted and screen.query(
                "#notebook-text"):
            return screen
        await pilot.pause(0.02)
    raise AssertionError("the notebook did not open")


async def wait_done(pilot, screen, steps=300):
    for _ in range(steps):
        await pilot.pause(0.02)
        if not screen.generating:
            break
    await pilot.pause(0.05)


async def test_raw_flag_opens_the_notebook_and_continues_in_place():
    app = make_app(lambda r, row: " upon a time there was a fox.", raw_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        # the empty panel says how to select a token here (it spoke of replies; seen in tmux)
        hint = str(nb.inspector.query_one(".detail").render())
        assert "continuation" in hint and "repl" not in hint
        nb.text_area.insert("Once")
        await pilot.press("ctrl+o")
        await wait_done(pilot, nb)
        assert nb.text_area.text == "Once upon a time there was a fox."
        req = app.holder["backend"].requests[-1]
        assert req.raw and req.messages == (Message("user", "Once"),)
        assert nb.reply is not None and nb.reply.text == " upon a time there was a fox."
        # the token view shows the continuation; the cursor selects a token in the inspector
        assert "".join(t.text for t in nb.token_view.tokens) == nb.reply.text
        await pilot.press("ctrl+t", "home", "right")
        await pilot.pause(0.1)
        assert "token 2 of" in str(nb.inspector.query_one(".detail").render())
        # continue from alternative 2 of token 2: the text is cut there and goes on
        await pilot.press("2")
        await wait_done(pilot, nb)
        alt = nb.reply.tokens[1]
        assert nb.text_area.text.startswith("Once" + nb.reply.tokens[0].text + alt.text)
        # the conversation recorded is raw, and the transcript keeps the mode
        conv = nb.conversation
        assert conv.mode == "raw" and conv.entries[0].text == "Once"
        doc = json.loads(json.dumps(to_json_dict(conv)))
        assert doc["mode"] == "raw" and from_json_dict(doc).mode == "raw"
        # F4: back to the chat
        await pilot.press("f4")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, NotebookScreen)


async def test_raw_mode_command_and_scoring_the_whole_text():
    app = make_app(lambda r, row: " two three")
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat.prompt.text = "/raw-mode"
        await pilot.press("enter")
        await pilot.pause(0.2)
        nb = app.screen
        assert isinstance(nb, NotebookScreen) and not nb.query_one("#notebook-notice").display
        nb.text_area.insert("one two three four")
        await pilot.press("ctrl+e")
        for _ in range(100):
            await pilot.pause(0.02)
            if nb.scored is not None:
                break
        assert app.holder["backend"].scored[-1].text == "one two three four"
        assert "perplexity" in str(nb.query_one("#notebook-status").render())
        assert "".join(t.text for t in nb.token_view.tokens) == "one two three four"


async def test_text_typed_right_after_raw_mode_goes_to_the_notebook():
    """Keys a quick typist sends right after ``/raw-mode`` and Enter, before the notebook is
    up, are the notebook's: they went to the chat's message box, and the text typed for the
    notebook waited there (seen in tmux). A draft in the box when the notebook opens some
    other way (not sent from the box) stays the chat's."""
    from textual import events

    from chatui.textual_compat.testing import deliver

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat.prompt.text = "/raw-mode"
        deliver(app, events.Key("enter", "\r"))
        for ch in "Once upon":
            deliver(app, events.Key("space" if ch == " " else ch, ch))
        nb = await notebook(pilot, app)
        for ch in " a time":
            deliver(app, events.Key("space" if ch == " " else ch, ch))
        await pilot.pause(0.2)
        assert nb.text_area.text == "Once upon a time"
        assert app.chat.prompt.text == ""
        await pilot.press("f4")
        await pilot.pause(0.1)
        app.chat.prompt.text = "a draft for the chat"
        await app.chat.action_command("/raw-mode")
        nb = await notebook(pilot, app)
        await pilot.pause(0.1)
        assert nb.text_area.text == "Once upon a time"
        assert app.chat.prompt.text == "a draft for the chat"
        # typed with the token view focused (Ctrl+T): it goes to the document, at its cursor
        await pilot.press("ctrl+t")
        await pilot.pause(0.05)
        assert app.focused is nb.token_view
        for ch in ", there":
            deliver(app, events.Key("space" if ch == " " else ch, ch))
        await pilot.pause(0.1)
        assert nb.text_area.text == "Once upon a time, there"
        assert app.focused is nb.text_area


async def test_text_typed_with_ctrl_o_at_once_is_continued_whole():
    """Text and Ctrl+O typed in one burst continue the whole text: Ctrl+O, a priority
    binding, started as its key arrived, from "Once upon a time," and the rest of the line,
    arriving while the text was read-only, was lost (seen in tmux). Ctrl+E the same."""
    from textual import events

    from chatui.textual_compat.testing import deliver

    def typed(text):
        for ch in text:
            deliver(app, events.Key("space" if ch == " " else ch, ch))

    app = make_app(lambda r, row: " and a fox.", raw_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        nb.text_area.focus()
        await pilot.pause()
        typed("Once upon a time, in a village")
        deliver(app, events.Key("ctrl+o", None))
        await pilot.pause(0.05)
        await wait_done(pilot, nb)
        assert nb.text_area.text == "Once upon a time, in a village and a fox."
        assert nb.base == "Once upon a time, in a village"
        typed(" Then")
        deliver(app, events.Key("ctrl+e", None))
        for _ in range(200):
            await pilot.pause(0.02)
            if nb.scored is not None:
                break
        assert "".join(t.text for t in nb.scored.tokens) == nb.text_area.text
        assert nb.text_area.text.endswith("fox. Then")


async def test_text_typed_while_the_model_writes_goes_after_its_text():
    """Typing on while the model continues the text (read-only meanwhile) is not dropped:
    the characters and line breaks come after the continuation once it ends, the cursor
    after them; typed in the token view, the same."""
    from textual import events

    from chatui.textual_compat.testing import deliver

    story = " and then a fox came by, and a hare, and a crow, and the night fell."
    app = make_app(lambda r, row: story, raw_mode=True, delay_s=0.1)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        nb.text_area.focus()
        nb.text_area.text = "Once"
        await pilot.pause()
        await pilot.press("ctrl+o")
        for _ in range(100):
            await pilot.pause(0.01)
            if nb.generating:
                break
        assert nb.generating
        for ch in " Then":
            deliver(app, events.Key("space" if ch == " " else ch, ch))
        deliver(app, events.Key("enter", "\r"))
        await pilot.pause(0.05)
        assert nb.generating and "Then" not in nb.text_area.text
        await wait_done(pilot, nb)
        assert nb.text_area.text == f"Once{story} Then\n"
        assert nb.reply.text == story  # the continuation, not the typing
        assert nb.text_area.cursor_location == nb.text_area.document.end
        await pilot.press("ctrl+o")
        for _ in range(100):
            await pilot.pause(0.01)
            if nb.generating:
                break
        nb.type_into("x", False)  # (a key typed in the token view)
        await wait_done(pilot, nb)
        assert nb.text_area.text.endswith("fell.x")


async def test_a_saved_raw_text_opens_in_the_notebook_not_as_a_chat(tmp_path):
    """`/load` (and so `--resume` and the search) of a notebook's continuation opens its text
    in the notebook, as the continuation left it, with its tokens in the token view; the
    chat stays as it was (it opened as a chat of one message, and went on under the chat
    template); the text that was in the notebook comes back with Ctrl+Z."""
    from chatui import transcript

    app = make_app(lambda r, row: " and a fox.", raw_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        nb.text_area.text = "Once upon a time"
        await pilot.press("ctrl+o")
        await wait_done(pilot, nb)
        assert nb.text_area.text == "Once upon a time and a fox."
        saved = nb.conversation
        await pilot.press("f4")
        await pilot.pause(0.1)
        await send(pilot, app, "a chat message")
        chat_before = [e.content for e in app.chat.conversation.entries]
        await app.chat.action_command("/raw-mode")
        nb = await notebook(pilot, app)
        nb.text_area.text = "notes of mine"
        await pilot.press("f4")
        await pilot.pause(0.1)
        assert app.autosaver.flush(timeout=10)
        [raw] = [s for s in transcript.list_transcripts(tmp_path / "data")
                 if transcript.load_transcript(s.path).mode == "raw"]
        await send(pilot, app, f"/load {raw.path}")
        nb = await notebook(pilot, app)
        await pilot.pause(0.1)
        assert nb.text_area.text == "Once upon a time and a fox."
        expected = [t.text for t in saved.entries[1].reply.tokens]
        assert [t.text for t in nb.token_view.tokens] == expected
        assert "Ctrl+Z brings back" in str(nb.query_one("#notebook-notice").render())
        assert [e.content for e in app.chat.conversation.entries] == chat_before
        await pilot.press("ctrl+z")
        await pilot.pause(0.05)
        assert nb.text_area.text == "notes of mine"


def test_a_chat_transcript_has_no_mode_key_and_reads_as_chat():
    conv = Conversation()
    conv.add_user("hi")
    doc = to_json_dict(conv)
    assert "mode" not in doc and from_json_dict(doc).mode == "chat"


async def test_notebook_continuation_equals_transformers_generate(tiny_ckpt):
    from chatui.app import ChatApp
    from chatui.config import AppConfig
    from inference.engine import LocalBackend

    text = "Once upon a time, in a small village by the sea,"
    app = ChatApp(lambda progress: LocalBackend.from_checkpoint(tiny_ckpt),
                  config=AppConfig(stable_timings=True, raw_mode=True,
                                   settings_overrides={"temperature": 0.0,
                                                       "max_new_tokens": 12}))
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        nb.text_area.insert(text)
        await pilot.press("ctrl+o")
        await wait_done(pilot, nb, 1500)
        got = [t.id for t in nb.reply.tokens]
        shown = nb.text_area.text
    ids = tiny_ckpt.tokenizer(text)["input_ids"]
    out = tiny_ckpt.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                   eos_token_id=list(tiny_ckpt.eos_token_ids), pad_token_id=2)
    assert got == out[0, len(ids):].tolist()
    assert shown == text + tiny_ckpt.tokenizer.decode(got, skip_special_tokens=True)


async def test_a_checkpoint_without_a_chat_template_opens_in_raw_mode():
    from inference.scripted import ScriptedBackend

    backend = ScriptedBackend()
    backend.info = type(backend.info)(**{**backend.info.__dict__,
                                         "chat_template_warning": "no chat template"})
    app = make_app(backend=backend)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        assert NO_TEMPLATE_NOTICE in str(nb.query_one("#notebook-notice").render())


def test_readme_documents_every_command_and_this_issues_keys_and_fields():
    from pathlib import Path

    from chatui.commands import COMMANDS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    missing = [c.name for c in COMMANDS if f"`/{c.name}" not in readme]
    assert not missing, f"README lacks {missing}"
    for claim in ("`--raw`", "| Ctrl+O | the model continues", "| Ctrl+E | score the whole",
                  '"mode": "raw"', '`sampler_prob`', '"sampled_prob"', '"nucleus"',
                  '"prompt_logprobs": K', "/probe \" Paris\""):
        assert claim in readme, claim
    for binding in NotebookScreen.BINDINGS:
        key = {"ctrl+o": "Ctrl+O", "escape": "Esc", "ctrl+e": "Ctrl+E", "ctrl+t": "Ctrl+T",
               "f4": "F4"}[binding.key]
        assert f"| {key} |" in readme, key


async def test_the_notebook_honours_stop_strings():
    app = make_app(lambda r, row: " and the fox ran away STOP never shown", raw_mode=True,
                   settings_overrides={"stop": ("STOP",)})
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        nb.text_area.insert("The dog")
        await pilot.press("ctrl+o")
        await wait_done(pilot, nb)
        text = nb.text_area.text
        assert text.startswith("The dog and the fox ran away") and "STOP" not in text
        assert "never" not in text
        assert nb.reply.finish_reason == "stop"


async def test_the_status_says_in_words_how_a_continuation_ended():
    """It showed the finish reason ("length") both where the token limit cut the text off (^O
    goes on) and where the text had filled the model's context (^O cannot): seen in tmux."""
    long = " ".join(f"w{i}" for i in range(400))
    cases = ((4096, {"max_new_tokens": 5}, "cut off at the token limit (^O goes on)"),
             (40, {}, "cut off at the end of the model's context (40 tokens)"),
             (4096, {"stop": ("w3",)}, "3 tokens · ended ·"))
    for context, overrides, words in cases:
        app = make_app(lambda r, row: long, raw_mode=True, context_limit=context,
                       settings_overrides=overrides)
        async with app.run_test(size=SIZE) as pilot:
            nb = await notebook(pilot, app)
            nb.text_area.insert("go on")
            await pilot.press("ctrl+o")
            await wait_done(pilot, nb)
            status = str(nb.query_one("#notebook-status").render())
            assert words in status, (words, status)
            assert "· length ·" not in status and "· stop ·" not in status


def test_the_status_line_names_whole_keys_that_fit():
    """One line cut at the width showed "^E score · F4" of "F4 chat" (seen in tmux at 100
    columns): the keys after what happened are whole, as many as fit."""
    from chatui.screens.notebook import HELP, fit_keys

    head = "139 tokens · ended"
    for width in range(len(head), 120):
        line = fit_keys(head, HELP, width)
        assert len(line) <= width and line.startswith(head)
        shown = line[len(head):].split(" · ")[1:]
        assert shown == list(HELP[:len(shown)])  # whole keys, in order, none cut
    assert fit_keys("", HELP, 200) == " · ".join(HELP)
    long = "This token has 3 alternatives; there is no fourth " * 3
    assert fit_keys(long, HELP, 40) == long  # a sentence is whole, wrapped, never cut


async def test_escape_and_ctrl_c_stop_a_continuation_and_keep_what_came():
    long = " ".join(f"w{i}" for i in range(400))
    for key in ("escape", "ctrl+c"):
        app = make_app(lambda r, row: long, delay_s=0.01, raw_mode=True)
        async with app.run_test(size=SIZE) as pilot:
            nb = await notebook(pilot, app)
            nb.text_area.insert("go")
            await pilot.press("ctrl+o")
            for _ in range(200):
                await pilot.pause(0.02)
                if len(nb.text_area.text) > 20:
                    break
            await pilot.press(key)
            await wait_done(pilot, nb)
            assert not nb.generating and nb.reply.finish_reason == "cancelled", key
            assert nb.text_area.text == "go" + nb.reply.text and len(nb.reply.tokens) < 400
            assert not nb.text_area.read_only


async def test_the_text_is_scored_as_it_is_typed_but_not_as_the_model_writes():
    from chatui.screens import notebook as nbmod

    app = make_app(lambda r, row: " and more words", raw_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        backend = app.holder["backend"]
        nb.text_area.insert("some words")
        await pilot.press("ctrl+o")  # continued at once: nothing typed is left to score
        await wait_done(pilot, nb)
        await pilot.pause(nbmod.SCORE_AFTER_S + 0.5)
        assert not backend.scored and nb.scored is None
        assert "".join(t.text for t in nb.token_view.tokens) == " and more words"
        nb.text_area.insert(" typed")  # typing: scored once it pauses
        for _ in range(200):
            await pilot.pause(0.02)
            if nb.scored is not None:
                break
        assert [r.text for r in backend.scored] == ["some words and more words typed"]
        assert "perplexity" in str(nb.query_one("#notebook-status").render())


def test_raw_flag_with_a_system_prompt_is_refused_in_one_sentence():
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "chatui", "--raw", "--system", "be brief",
                        "--backend", "scripted"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "--raw opens a notebook of plain text" in r.stderr
    assert "Traceback" not in r.stderr


async def test_the_notebook_keeps_its_text_when_closed_and_across_sessions():
    """F4 back to the chat and /raw-mode again: the notebook opened empty, its document gone;
    quitting lost a document typed or edited since its last continuation. Now it opens with
    its text, and at the next start with the last session's (a notice says so)."""
    app = make_app(raw_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        nb.text_area.insert("A long document, never continued.")
        await pilot.press("f4")
        await pilot.pause(0.1)
        await send(pilot, app, "/raw-mode")
        nb = await notebook(pilot, app)
        assert nb.text_area.text == "A long document, never continued."
        assert not nb.query_one("#notebook-notice").display
        nb.text_area.insert(" Edited.")
        await pilot.press("ctrl+q")
        await pilot.pause(0.3)
    app = make_app(raw_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        assert nb.text_area.text == "A long document, never continued. Edited."
        notice = nb.query_one("#notebook-notice")
        assert notice.display and "last ended is back" in str(notice.render())
        nb.text_area.text = ""  # emptied: the next start opens empty
        await pilot.press("ctrl+q")
        await pilot.pause(0.3)
    app = make_app(raw_mode=True)
    async with app.run_test(size=SIZE) as pilot:
        nb = await notebook(pilot, app)
        assert nb.text_area.text == ""


async def test_a_narrow_terminal_puts_the_inspector_below_the_text():
    """Under 72 cells the notebook's inspector (46 cells) goes below the text, as the chat's
    goes below the conversation (beside it, at 64 cells the text had 16; seen in tmux)."""
    for width, below in ((64, True), (100, False)):
        app = make_app(lambda r, row: " two three")
        async with app.run_test(size=(width, 30)) as pilot:
            await loaded(pilot, app)
            app.chat.prompt.text = "/raw-mode"
            await pilot.press("enter")
            nb = await notebook(pilot, app)
            await pilot.pause(0.1)
            text, inspector = nb.text_area.region, nb.inspector.region
            if below:
                assert text.width >= width - 2 and inspector.y >= text.bottom
            else:
                assert inspector.x >= text.right and text.width >= width - 46 - 2
