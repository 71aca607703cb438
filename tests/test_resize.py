"""Every screen survives a terminal resized to any size, however small.

Found using chatui in tmux (2026-11-28): with the token view on, a terminal narrowed from 100
to 40 columns stopped the app ("range() arg 3 must not be zero"): for one layout, before the
narrow breakpoint moved the token inspector below, the conversation was 0 cells wide and a
reply's statistics line asked Rich to fold its words 0 cells wide. A split tmux pane or a
window dragged small does that; none of it may stop the chat or lose the conversation.
"""

from __future__ import annotations

import pytest

from tests.test_app import loaded, make_app, send

SIZES = [(100, 30), (40, 20), (1, 1), (12, 4), (46, 10), (47, 12), (71, 24), (72, 24),
         (20, 50), (200, 8), (80, 24), (100, 30)]
"""From wide to a single cell and back, around the inspector's 46 cells and the 72-cell
breakpoint."""


async def sweep(pilot, app) -> None:
    for cols, rows in SIZES:
        await pilot.resize_terminal(cols, rows)
        await pilot.pause(0.05)
        await pilot.pause()
        assert app.is_running, f"the app stopped at {cols}x{rows}"


@pytest.mark.parametrize("token_view", [False, True])
async def test_the_chat_survives_any_size(token_view):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "Tell me about the quick brown fox, please.")
        if token_view:
            await pilot.press("ctrl+t")
            await pilot.pause(0.2)
        await sweep(pilot, app)
        if token_view:
            await pilot.press("escape")  # from the token view back to the message box
        await send(pilot, app, "And the lazy dog?")  # still answers, the same conversation
        assert len(app.chat.state.conversation.messages()) == 4


@pytest.mark.parametrize("screen", ["compare", "tree", "help", "history", "find", "notebook",
                                    "compare-screen", "score"])
async def test_every_screen_survives_any_size(screen):
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "Tell me about the quick brown fox, please.")
        await send(pilot, app, "/save")
        opening = {"compare": ["/compare temperature=0 | temperature=1", "the fox?"],
                   "tree": ["/retry", "/tree"], "help": ["/help"], "history": ["/history"],
                   "find": ["/find fox"], "notebook": ["/raw-mode"],
                   "compare-screen": ["/compare"], "score": ["/score"]}[screen]
        for line in opening:
            await send(pilot, app, line)
        await pilot.pause(0.3)
        if screen in ("compare", "score"):
            await pilot.press("ctrl+t")
            await pilot.pause(0.2)
        await sweep(pilot, app)
