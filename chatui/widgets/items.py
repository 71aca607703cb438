"""Small conversation items: the user's message, inline notices and the ``‹ 2/3 ›`` bar
under a message with alternatives."""

from __future__ import annotations

from rich.segment import Segment
from textual.content import Content
from textual.events import Click
from textual.geometry import Size
from textual.message import Message
from textual.selection import Selection
from textual.strip import Strip
from textual.widget import Widget
from textual.widgets import Static

from .selection import Joined, joined_at, selected_text, with_selection, wrap_marked
from .text import safe_text


class UserMessage(Widget):
    """A message the user sent (shown literally: never parsed as markup): a ``you`` header
    line, then the text wrapped with a cell of padding on each side.

    One widget drawn line by line (Textual's line API), where it was a container with two
    Statics: every message that PageUp brings back into a long chat is mounted, laid out and,
    once scrolled away, collected again, and two widgets fewer a message made that cheaper
    (issue 21). It draws what the two Statics drew (``tests/test_items.py``)."""

    COMPONENT_CLASSES = {"user-message--header"}

    DEFAULT_CSS = """
    UserMessage { height: auto; }
    UserMessage > .user-message--header { color: $text-muted; }
    """

    HEADER = "you"

    def __init__(self, text: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.text = text
        self._wrapped: tuple[int, list[Content]] | None = None

    def _lines(self, width: int) -> list[Content]:
        """The text's lines wrapped at ``width`` cells less the padding."""
        if self._wrapped is None or self._wrapped[0] != width:
            self._wrapped = (width, wrap_marked(Content(safe_text(self.text)), max(1, width - 2)))
        return self._wrapped[1]

    def line_text(self, y: int) -> str:
        """Line ``y`` as drawn, in plain text (the padding included)."""
        if y == 0:
            return self.HEADER
        lines = self._lines(self.size.width)
        return f" {lines[y - 1].plain}" if 0 < y <= len(lines) else ""

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 1 + len(self._lines(width))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._wrapped = None

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.visual_style
        blank = base.rich_style
        if y == 0:
            style = base + self.get_visual_style("user-message--header")
            segments = [Segment(self.HEADER, style.rich_style)]
        else:
            lines = self._lines(width)
            if not 0 < y <= len(lines):
                return Strip.blank(width, blank)
            # (the padding as separate segments, as a Static's: the same screen, segment
            # for segment)
            text = Strip(lines[y - 1].render_segments(base)).adjust_cell_length(
                max(0, width - 2), blank)
            segments = [Segment(" ", blank), *text, Segment(" ", blank)]
        # offsets in the drawn lines, where the mouse's selection starts and ends
        strip = Strip(segments).adjust_cell_length(width, blank).apply_offsets(0, y)
        return with_selection(self, strip, y, self.line_text)

    def _joined(self, y: int) -> Joined | None:
        """Where drawn line ``y``'s text starts if it goes on from the line above (a wrap)."""
        lines = self._lines(self.size.width)
        found = joined_at(lines[y - 1]) if 0 < y <= len(lines) else None
        return None if found is None else (found[0] + 1, found[1])  # (the padding's cell)

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The text under a mouse selection without the padding, one line per line of the
        text (a line wrapped at the width is copied as one)."""
        return selected_text(selection, 1 + len(self._lines(self.size.width)), self.line_text,
                             str.strip, joined=self._joined)

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()


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
