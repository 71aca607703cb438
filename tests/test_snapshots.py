"""Snapshot tests: SVG screenshots of each screen compared with stored files.

Run with ``CHATUI_UPDATE_SNAPSHOTS=1`` to (re)write the stored pictures after a deliberate
change, then look at them (any SVG viewer or browser) before committing. Timings are
normalised (``stable_timings``) and the scripted engine is deterministic.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from chatui.app import ChatApp
from chatui.config import AppConfig
from inference.scripted import ScriptedBackend

from conftest import in_ci, skip_unless_ci

SNAPSHOTS = Path(__file__).parent / "snapshots"
UPDATE = os.environ.get("CHATUI_UPDATE_SNAPSHOTS") == "1"
SIZE = (110, 34)


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))


def reply_with_wide_chars(request, row):
    last = request.messages[-1].content
    return (f"You said: {last}\n\nA table:\n\n| name | 值 |\n|---|---|\n| café | 日本語 |\n\n"
            "```python\ndef hello():\n    return '👋'\n```\n")


def _normalise(svg: str) -> str:
    # the terminal's unique id is derived from the content but keep it out of the diff anyway
    return re.sub(r"terminal-\d+", "terminal", svg)


async def snapshot(name: str, run_before, *, theme: str = "chatui-dark",
                   reply=reply_with_wide_chars) -> None:
    app = ChatApp(lambda p: ScriptedBackend(reply),
                  config=AppConfig(theme=theme, stable_timings=True))
    async with app.run_test(size=SIZE) as pilot:
        for _ in range(200):
            if app.chat.info is not None:
                break
            await pilot.pause(0.01)
        app.chat.prompt.cursor_blink = False
        await run_before(pilot)
        await pilot.pause(0.2)
        svg = _normalise(app.export_screenshot(title=name))
    path = SNAPSHOTS / f"{name}.svg"
    if not path.exists() and in_ci():
        pytest.fail(f"snapshot {path.name} is missing; create it locally and commit it",
                    pytrace=False)
    if UPDATE or not path.exists():
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(svg, encoding="utf-8")
        if not UPDATE:
            skip_unless_ci(f"wrote new snapshot {path.name}; check it and commit it")
        return
    assert svg == path.read_text(encoding="utf-8"), (
        f"{name} differs from {path}; if the change is intended, rerun with "
        "CHATUI_UPDATE_SNAPSHOTS=1 and look at the picture")


async def _chat(pilot) -> None:
    app = pilot.app
    app.chat.prompt.text = "Show me [bold]markup[/] and a table"  # typed text is data
    await pilot.press("enter")  # send; waits until the scripted reply has streamed
    for _ in range(300):
        if not app.chat.generating:
            break
        await pilot.pause(0.01)
    await app.workers.wait_for_complete()


async def test_main_screen_dark():
    await snapshot("main_dark", _chat)


async def test_main_screen_light():
    await snapshot("main_light", _chat, theme="chatui-light")


async def test_token_view_with_inspector():
    async def run_before(pilot):
        await _chat(pilot)
        await pilot.press("ctrl+t")  # token view on; the cursor goes to the last token
        await pilot.press("home", "right", "right", "right")  # select the 4th token
    await snapshot("token_view", run_before)


async def test_token_view_light():
    async def run_before(pilot):
        await _chat(pilot)
        await pilot.press("ctrl+t", "n")  # token view; jump to the least likely token
    await snapshot("token_view_light", run_before, theme="chatui-light")


async def test_help_screen():
    async def run_before(pilot):
        await pilot.press("f1")  # open help
    await snapshot("help", run_before)


async def test_raw_mode_notebook():
    async def run_before(pilot):
        app = pilot.app
        app.chat.prompt.text = "/raw-mode"
        await pilot.press("enter")  # open raw mode's notebook
        for _ in range(100):
            if app.screen.query("#notebook-text"):
                break
            await pilot.pause(0.01)
        nb = app.screen
        nb.text_area.cursor_blink = False
        nb.text_area.insert("Once upon a time")  # the text to continue
        await pilot.press("ctrl+o")  # the model continues it in place
        for _ in range(300):
            if not nb.generating:
                break
            await pilot.pause(0.01)
        await pilot.press("ctrl+t", "home", "right")  # tokens: select the 2nd one
    await snapshot("raw_mode_notebook", run_before)


async def _command(pilot, text: str) -> None:
    """Type a slash command (or message) and wait until any reply it starts has ended."""
    app = pilot.app
    app.chat.prompt.text = text
    await pilot.press("enter")
    for _ in range(300):
        if not app.chat.generating:
            break
        await pilot.pause(0.01)
    await app.workers.wait_for_complete()


async def test_scored_message():
    """Issue 17: a user message scored under the model (/score), in the token view coloured
    by its own probability, with its perplexity header and the inspector on its least likely
    token."""
    async def run_before(pilot):
        await _chat(pilot)
        await _command(pilot, "/score")
        chat = pilot.app.chat
        for _ in range(300):  # drawn, and the window done drawing around it
            if chat.query(".score-header") and not chat.window.busy:
                break
            await pilot.pause(0.01)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause(0.3)
    await snapshot("scored_message", run_before)


async def test_sibling_bar():
    async def run_before(pilot):
        await _chat(pilot)
        await _command(pilot, "/retry")  # a second reply, the first kept: ‹ 2/2 ›
        await _command(pilot, "/retry")  # ‹ 3/3 ›
        await pilot.press("alt+left")  # back to the second: ‹ 2/3 ›
        await pilot.pause(0.1)
    await snapshot("sibling_bar", run_before)


async def test_tree_view():
    async def run_before(pilot):
        await _chat(pilot)
        await _command(pilot, "/retry")  # the first reply stays as a branch
        await _command(pilot, "And a follow-up question")
        await pilot.press("f5")  # the tree view
    await snapshot("tree_view", run_before)
