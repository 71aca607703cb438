"""Small conversation items: the user's message, inline notices and the ``‹ 2/3 ›`` bar
under a message with alternatives."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.events import Click
from textual.message import Message
from textual.widgets import Static

from .text import safe_text


class UserMessage(Vertical):
    """A message the user sent (shown literally: never parsed as markup)."""

    DEFAULT_CSS = """
    UserMessage { height: auto; }
    UserMessage > .user-header { color: $text-muted; height: 1; }
    UserMessage > .user-text { padding: 0 1; }
    """

    def __init__(self, text: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static(Content("you"), classes="user-header")
        yield Static(Content(safe_text(self.text)), classes="user-text")


class Notice(Static):
    """A one-paragraph notice in the conversation (context dropped, errors, command output)."""

    DEFAULT_CSS = """
    Notice { height: auto; padding: 0 1; color: $text-muted; }
    Notice.-warning { color: $warning; }
    Notice.-error { color: $error; }
    """

    def __init__(self, text: str, *, kind: str = "info", id: str | None = None) -> None:
        super().__init__(Content(safe_text(text)), id=id, classes=f"-{kind}")
        self.kind = kind


def estimate_lines(text: str, width: int) -> int:
    """About how many lines ``text`` takes wrapped at ``width`` cells: the height of a message
    not drawn yet (the window corrects it when the message is drawn; see ``log_window``)."""
    width = max(1, width)
    return sum(max(1, -(-len(line) // width)) for line in text.split("\n"))


class SiblingBar(Static):
    """``‹ 2/3 ›`` under a message that has alternatives (issue 18): a click on an arrow
    asks for the sibling before or after it (:class:`SiblingBar.Step`, messages up)."""

    DEFAULT_CSS = """
    SiblingBar { height: 1; padding: 0 1; color: $text-muted; }
    SiblingBar:hover { color: $text; }
    """

    class Step(Message):
        """An arrow of a sibling bar was clicked."""

        def __init__(self, node: str, delta: int) -> None:
            super().__init__()
            self.node = node
            self.delta = delta

    def __init__(self, node: str, index: int, count: int, *, id: str | None = None) -> None:
        super().__init__(Content(sibling_label(index, count)), id=id, classes="sibling-bar")
        self.node = node
        self.index = index
        self.count = count

    def on_click(self, event: Click) -> None:
        label = sibling_label(self.index, self.count)
        x = event.x - 1  # the padding
        if 0 <= x <= 1:
            self.post_message(self.Step(self.node, -1))
        elif len(label) - 2 <= x <= len(label) - 1:
            self.post_message(self.Step(self.node, +1))


def sibling_label(index: int, count: int) -> str:
    """``‹ 2/3 ›`` for the second of three alternatives (``index`` 0-based)."""
    return f"‹ {index + 1}/{count} ›"
