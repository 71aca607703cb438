"""The help screen: every slash command and key, from the same tables the app uses."""

from __future__ import annotations

import textwrap

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import ModalScreen
from textual.widget import Widget

from ..commands import help_rows
from .once import DismissOnce

KEYS: tuple[tuple[str, str], ...] = (
    ("Enter", "send the message"),
    ("Ctrl+J / Shift+Enter", "new line in the message (pasting multi-line text also works)"),
    ("Up / Down", "recall earlier prompts, earlier sessions' too (on the first / last line "
                  "of the box)"),
    ("PageUp / PageDown", "page the conversation (a message taller than its box pages itself)"),
    ("Tab", "complete a /command; otherwise move focus"),
    ("Ctrl+L", "empty the message box, however long (Ctrl+Z brings the text back)"),
    ("Esc / Ctrl+C", "stop the reply (the partial text is kept, marked as stopped)"),
    ("Ctrl+T", "token view: tokens coloured by probability, with a side panel"),
    ("Esc (token view)", "back to the message box; the token view stays on"),
    ("← → ↑ ↓ Home End", "move the token cursor (in the token view; ↑↓ by 10 tokens)"),
    ("n", "jump to the least likely token"),
    ("1 … 9", "continue the reply from that alternative of the selected token"),
    ("Ctrl+R / Ctrl+G / Ctrl+O", "retry / edit the last prompt / continue the reply"),
    ("F2 / F3", "copy the last reply / its last code block (no clipboard tool needed)"),
    ("Ctrl+F", "search the saved conversations as you type; Enter opens one"),
    ("r", "raw token view (in the token view): special tokens, exact spellings"),
    ("Ctrl+P", "command palette (every action, themes)"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit (the conversation is kept)"),
)


def _cell(text: str, width: int) -> str:
    """``text`` padded to ``width`` columns, or followed by two spaces where it is longer (a
    long key ran into its description: "Alt+Left / Alt+RightShow the previous ...")."""
    return f"{text:<{width}}" if len(text) < width else f"{text}  "


def _wrapped(first: str, rest: str, text: str, width: int | None,
             column: int = 0) -> list[Content]:
    """A help row: ``first`` (bold) and ``rest`` before ``text``, whose words wrap within
    ``width`` columns under its own first word (a wrapped description began again at the
    page's left edge, under the command names). Where the command or its key is longer than
    its cell, so that the text would begin past the page's ``column``, the text goes below them
    at that column (every description began in a column of its own: "/sibling prev|next
    Alt+Left / Alt+Right  Show the previous..." 15 columns right of the others, seen in tmux);
    where that or the row's start leaves under 24 columns, below them, indented 6. One line
    with no width."""
    indent = len(first) + len(rest)
    if width is None or (indent <= column and indent + len(text) <= width):
        return [Content.assemble((first, "bold"), rest, text)]
    if column < indent and width - column >= 24:
        parts = textwrap.wrap(text, width - column)
        head = Content.assemble((first, "bold"), rest.rstrip()) if rest.strip() else \
            Content.assemble((first.rstrip(), "bold"))
        return [head] + [Content(" " * column + part) for part in parts]
    if width - indent >= 24:
        parts = textwrap.wrap(text, width - indent)
        head = [Content.assemble((first, "bold"), rest, parts[0])]
        return head + [Content(" " * indent + part) for part in parts[1:]]
    below = 6
    parts = textwrap.wrap(text, max(width - below, 8))
    return [Content.assemble((first.rstrip(), "bold"), rest.rstrip() and "  " + rest.rstrip())] + [
        Content(" " * below + part) for part in parts]


def help_text(width: int | None = None) -> Content:
    """The whole help page, its descriptions wrapped within ``width`` columns (None: one
    line a row)."""
    lines: list[Content] = [Content.styled("Slash commands", "bold $primary")]
    for usage, key, text in help_rows():
        lines.extend(_wrapped(f"  {_cell(usage, 24)}", _cell(key, 10), text, width, 36))
    lines.append(Content(""))
    lines.append(Content.styled("Keys", "bold $primary"))
    for key, text in KEYS:
        lines.extend(_wrapped(f"  {_cell(key, 27)}", "", text, width, 29))
    lines.append(Content(""))
    lines.append(Content.styled("Start a message with // to send a text that begins with /.",
                                "$text-muted"))
    return Content("\n").join(lines)


class HelpPage(Widget):
    """The help page at the width it is given: its descriptions wrap under themselves."""

    DEFAULT_CSS = "HelpPage { height: auto; }"

    def render(self) -> Content:
        return help_text(self.content_size.width or None)

    def get_content_height(self, container, viewport, width: int) -> int:  # type: ignore[override]
        return len(help_text(width).plain.splitlines())


class HelpScreen(DismissOnce, ModalScreen[None]):
    """A modal page of commands and keys; any of Esc, q, F1 closes it."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 96; max-width: 100%; height: auto; max-height: 90%;
        border: round $primary; background: $surface; padding: 0 1; }
    """

    BINDINGS = [Binding("escape,q,f1", "dismiss", "Close", id="help.close", priority=True)]
    """A priority binding: the screen closes as the key arrives, so the keys typed right after
    it reach the chat's prompt (they were lost while the close waited its turn)."""

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield HelpPage()

    def action_dismiss(self, result: None = None) -> None:  # type: ignore[override]
        self.dismiss(None)
