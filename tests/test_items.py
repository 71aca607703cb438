"""The user's message drawn by one line-API widget (issue 21) draws what the container of two
Statics it replaced drew, and copies what it shows."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.content import Content
from textual.geometry import Offset
from textual.selection import Selection
from textual.widgets import Static

from chatui.widgets.items import UserMessage
from chatui.widgets.text import safe_text

TEXTS = [
    "hi",
    "a line long enough to wrap several times at this width: " + "word " * 40,
    "two\nlines\n\nand a blank one, 值 wide 日本語 characters and an emoji 👋 " * 3,
    "[bold]not markup[/] \x1b[31m escapes shown literally",
]


class OldUserMessage(Vertical):
    """The user's message as it was drawn before (textual's containers and Statics)."""

    DEFAULT_CSS = """
    OldUserMessage { height: auto; }
    OldUserMessage > .user-header { color: $text-muted; height: 1; }
    OldUserMessage > .user-text { padding: 0 1; }
    """

    def __init__(self, text: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static(Content("you"), classes="user-header")
        yield Static(Content(safe_text(self.text)), classes="user-text")


class Both(App[None]):
    CSS = """
    VerticalScroll { height: 1fr; padding: 0 1; }
    UserMessage, OldUserMessage { margin: 1 0 0 0; border-left: thick $secondary; }
    UserMessage > .user-message--header { color: $secondary; text-style: bold; }
    OldUserMessage > .user-header { color: $secondary; text-style: bold; }
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield OldUserMessage(self.text, id="old")
            yield UserMessage(self.text, id="new")


@pytest.mark.parametrize("theme", ["textual-dark", "textual-light"])
@pytest.mark.parametrize("text", TEXTS)
async def test_draws_what_the_two_statics_drew(text, theme):
    app = Both(text)
    async with app.run_test(size=(60, 80)) as pilot:
        app.theme = theme
        await pilot.pause(0.05)
        old, new = app.query_one("#old"), app.query_one("#new")
        assert old.region.height == new.region.height > 1
        strips = app.screen._compositor.render_strips()  # (as test_markdown_lines does)
        before = strips[old.region.y:old.region.bottom]
        after = strips[new.region.y:new.region.bottom]
        assert [_cells(s) for s in after] == [_cells(s) for s in before]


def _cells(strip) -> list[tuple[str, object]]:
    """What each cell looks like (a space: its background; the offsets a selection reads
    left out)."""
    out = []
    for seg in strip:
        style = seg.style.clear_meta_and_links() if seg.style is not None else None
        for ch in seg.text:
            out.append((ch, style.bgcolor if ch == " " and style is not None else style))
    return out


async def test_copies_the_text_it_shows():
    text = "first line\nsecond line that wraps " + "word " * 20
    app = Both(text)
    async with app.run_test(size=(60, 40)) as pilot:
        await pilot.pause(0.05)
        new = app.query_one("#new", UserMessage)
        got = new.get_selection(Selection(Offset(0, 1), Offset(200, 4)))
        assert got is not None
        # one line per line of the text: the second, wrapped at the width, copied as one
        assert got[0] == text.strip(), got[0]
        assert new.get_selection(Selection(Offset(1, 1), Offset(6, 1)))[0] == "first"
        # a mouse drag over it selects (the drawn lines carry the offsets Textual reads)
        await pilot.mouse_down(new, offset=(7, 1))
        await pilot.hover(new, offset=(20, 2))
        await pilot.mouse_up(new, offset=(20, 2))
        await pilot.pause(0.05)
        assert app.screen.get_selected_text() == "line\nsecond line that wr"
