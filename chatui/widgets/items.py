"""Small conversation items: the user's message and inline notices."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
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
