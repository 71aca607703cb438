"""The prompt box's history survives a restart, and a message left unsent when chatui ended
comes back (it was lost on quit, on a closed terminal and on an internal error)."""

from __future__ import annotations

import json
import signal

from textual import events

from chatui import prompt_history as ph
from chatui.textual_compat.testing import deliver
from test_app import SIZE, config_dir, loaded, make_app, notices, send, settle  # noqa: F401


def test_the_file_keeps_prompts_and_the_last_draft(tmp_path):
    assert ph.load(tmp_path) == ph.Recalled([], "")
    for text in ("one", "two", "two", "  ", "/compare off"):
        ph.append(tmp_path, text)
    ph.append(tmp_path, "half written", kind="draft")
    assert ph.load(tmp_path) == ph.Recalled(["one", "two", "/compare off"], "half written")
    ph.append(tmp_path, "three")  # a later line: the draft is one more prompt for Up
    assert ph.load(tmp_path) == ph.Recalled(
        ["one", "two", "/compare off", "half written", "three"], "")
    ph.append(tmp_path, "again", kind="draft")
    ph.append(tmp_path, "", kind="draft")  # the draft put back was emptied: gone
    assert ph.load(tmp_path).draft == ""
    with open(ph.history_path(tmp_path), "a", encoding="utf-8") as f:
        f.write('{"prompt": "cut sho')  # a write cut short, then more
    ph.append(tmp_path, "four\nlines ünïcode")
    assert ph.load(tmp_path).prompts[-1] == "four\nlines ünïcode"


def test_the_file_is_compacted_to_its_last_prompts(tmp_path, monkeypatch):
    monkeypatch.setattr(ph, "MAX_PROMPTS", 10)
    for i in range(300):
        ph.append(tmp_path, f"prompt number {i} " + "x" * 900)
    lines = ph.history_path(tmp_path).read_text().splitlines()
    assert len(lines) < 100  # compacted (to 10) once it held twice as many, past 256 KB
    assert ph.load(tmp_path).prompts[-1].startswith("prompt number 299 ")
    assert json.loads(lines[-1])["prompt"].startswith("prompt number 299 ")


def test_an_unwritable_folder_is_logged_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert ph.append(blocker / "sub", "text") is False
    assert ph.load(blocker / "sub") == ph.Recalled([], "")


async def test_prompts_and_an_unsent_message_survive_a_restart():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first question")
        await send(pilot, app, "/settings")
        app.chat.prompt.text = "a long message\nI had not sent"
        await pilot.press("ctrl+q")
        await pilot.pause(0.3)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.pause(0.1)
        prompt = app.chat.prompt
        assert prompt.text == "a long message\nI had not sent"
        assert "back in the box" in str(notices(app)[-1].render())
        await pilot.press("ctrl+l", "up")
        assert prompt.text == "/settings"
        await pilot.press("up")
        assert prompt.text == "first question"
        await pilot.press("ctrl+l", "ctrl+q")  # emptied: the draft does not come back
        await pilot.pause(0.3)
    assert await box_at_next_start() == ""


async def test_a_command_typed_onto_the_restored_draft_runs_and_the_draft_stays():
    """Put back in the box, the draft took a command typed without looking at the box ("an
    unsent draft about whales/history"), and Enter sent both to the model: seen in tmux."""
    await quit_leaving("an unsent draft about whales")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.pause(0.1)
        prompt = app.chat.prompt
        prompt.move_cursor(prompt.document.end)
        await pilot.press(*"/settings", "enter")
        await pilot.pause(0.2)
        assert not app.chat.conversation.entries  # nothing went to the model
        said = [str(n.render()) for n in notices(app)]
        assert any("Settings in force" in n for n in said)
        assert any("still in the box" in n for n in said)
        assert prompt.text == "an unsent draft about whales"
        await pilot.press(*" /exit", "enter")  # (quits, and the draft is kept for next time)
        await pilot.pause(0.3)
    assert await box_at_next_start() == "an unsent draft about whales"
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:  # once sent, it is a message like any other
        await loaded(pilot, app)
        await pilot.pause(0.1)
        prompt = app.chat.prompt
        prompt.move_cursor(prompt.document.end)
        await pilot.press(*" and /sharks", "enter")
        await settle(pilot, app)
        assert app.chat.conversation.entries[0].text == "an unsent draft about whales and /sharks"


def test_only_a_known_command_after_the_draft_is_split_off():
    from chatui.commands import command_after_draft as split

    assert split("draft/history", "draft") == "/history"
    assert split("draft /set temp 0.3", "draft") == "/set temp 0.3"
    assert split("draft/usr/bin is a folder", "draft") is None  # no such command: a message
    assert split("draft//history", "draft") is None  # // escapes a slash
    assert split("draft", "draft") is None and split("other/history", "draft") is None
    assert split("draft/help", None) is None
    assert split("draft/set", "draft") == "/set"  # a known command: it says what it needs
    assert split("draft/q", "draft") == "/q" and split("draft/", "draft") is None


async def test_a_draft_typed_with_ctrl_q_at_once_is_kept_whole():
    """Ctrl+Q, a priority binding, quit as its key arrived, before the keys typed just before
    it had reached the box: the draft came back as "my unsen" (seen in tmux)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        for ch in "my unsent draft":
            deliver(app, events.Key("space" if ch == " " else ch, ch))
        deliver(app, events.Key("ctrl+q", None))
        for _ in range(100):
            await pilot.pause(0.02)
            if app.return_code is not None:
                break
    assert await box_at_next_start() == "my unsent draft"


async def test_a_closed_terminal_keeps_the_unsent_message(monkeypatch):
    import os

    monkeypatch.setattr(os, "_exit", lambda code: None)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat.prompt.text = "typing when the window closed"
        app._hung_up(signal.SIGHUP)
    assert await box_at_next_start() == "typing when the window closed"


async def test_keys_typed_at_start_are_not_added_to_the_unsent_message(tmp_path):
    """Keys typed before the box exists go into an empty box and the old draft to Up: put
    back first, an Enter among the keys would have sent it with them."""
    ph.append(tmp_path / "data", "old draft", kind="draft")
    app = make_app()
    app._held = [events.Key(c, c) for c in "new"]  # (as typed before the screen was ready)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.pause(0.1)
        assert app.chat.prompt.text == "new"
        assert "Up brings it back" in str(notices(app)[-1].render())
        deliver(app, events.Key("ctrl+l", None))
        await pilot.press("up")
        assert app.chat.prompt.text == "old draft"


async def quit_leaving(draft: str) -> None:
    """A session quit (Ctrl+Q) with ``draft`` unsent in the box."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat.prompt.text = draft
        await pilot.press("ctrl+q")
        await pilot.pause(0.3)


async def box_at_next_start() -> str:
    """What the prompt box holds when chatui starts again (the same data folder)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await pilot.pause(0.1)
        return app.chat.prompt.text
