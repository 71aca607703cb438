"""A line of statistics that wraps between its parts, not inside one.

A reply's statistics line (``… · least likely ' acrylic' 0.068% · …``) and a scored
message's header (``… least likely: ' capital' 0.87%, ' is' 1.70%``) show tokens quoted with
their leading space. Textual wraps at any space, so the line broke inside the quotes and read
``least likely '`` at one line's end and ``acrylic' 0.068%`` at the next one's start. Here a
line is a list of parts, each with the separator that follows it, and breaks come only after
a separator; a part longer than the whole width still folds where Textual would fold it.
"""

from __future__ import annotations

from typing import Sequence

from rich.cells import cell_len
from textual.content import Content
from textual.geometry import Size
from textual.widgets import Static

from .text import safe_text

Piece = tuple[str, str]
"""A part's text and the separator after it (``" · "``, ``", "``, or ``""`` for the last)."""


def joined(pieces: Sequence[Piece]) -> str:
    """The pieces as one line (what a wide enough view shows, and what a copy gives)."""
    return "".join(text + sep for text, sep in pieces).rstrip()


def pack(pieces: Sequence[Piece], width: int) -> str:
    """The pieces in lines of at most ``width`` cells, each line ending after a separator
    (its trailing spaces dropped, and its mark too where only that is over the width); a
    piece that does not fit after the others on a line, its separator's mark included,
    starts the next one."""
    if width <= 0:
        return joined(pieces)
    lines: list[str] = []
    line, last_sep = "", ""

    def end_line() -> None:
        done = line.rstrip()
        if cell_len(done) > width and last_sep:  # only the separator's mark is over
            done = line[: len(line) - len(last_sep)].rstrip()
        lines.append(done)

    for text, sep in pieces:
        if line and cell_len((line + text + sep).rstrip()) > width:
            end_line()
            line = ""
        line += text + sep
        last_sep = sep
    end_line()
    return "\n".join(lines)


def _safe(pieces: Sequence[Piece]) -> tuple[Piece, ...]:
    return tuple((safe_text(t), safe_text(s)) for t, s in pieces)


class PartsLine(Static):
    """A muted line of parts (see the module docstring): ``show(pieces)`` sets it."""

    def __init__(self, *, classes: str | None = None) -> None:
        super().__init__(classes=classes)
        self.pieces: tuple[Piece, ...] = ()

    @property
    def text(self) -> str:
        """The whole line, unwrapped."""
        return joined(self.pieces)

    def show(self, pieces: Sequence[Piece], *, layout: bool = True) -> None:
        """Show ``pieces``; ``layout=False`` when the caller knows the height stays."""
        self.pieces = _safe(pieces)
        self.refresh(layout=layout)

    def height_at(self, width: int, pieces: Sequence[Piece] | None = None) -> int:
        """How many lines the pieces shown (or ``pieces``) take ``width`` cells wide."""
        shown = self.pieces if pieces is None else _safe(pieces)
        width = max(1, width)  # (0 for one layout of a terminal narrowed: Rich cannot fold at 0)
        return Content(pack(shown, width)).get_height(self.styles, width)

    def render(self) -> Content:
        return Content(pack(self.pieces, self.content_region.width))

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return self.height_at(width)
