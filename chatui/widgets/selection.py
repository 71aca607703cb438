"""Drawing a mouse selection over a line-API widget's line, and the text it copies (shared by
the token view, the user's messages and the replies' Markdown)."""

from __future__ import annotations

from typing import Callable

from textual.content import Content
from textual.selection import Selection

from rich.cells import cell_len
from textual.strip import Strip
from textual.widget import Widget


def with_selection(widget: Widget, strip: Strip, y: int, line_text: Callable[[int], str]) -> Strip:
    """``strip`` (line ``y`` of ``widget``) with the part under the widget's text selection in
    the screen's selection style; ``line_text(y)`` is the line's plain text, read only when the
    line is selected."""
    selection = widget.text_selection
    if selection is None or (span := selection.get_span(y)) is None:
        return strip
    text = line_text(y)
    start, end = span  # characters of the line
    end = len(text) if end == -1 else min(end, len(text))
    # (the line's text can be wider than its strip, a wide glyph cut at the edge or a strip
    # drawn narrower: Strip.divide drops a cut past the end, and the app stopped on the
    # two strips it gave; found by random keys and clicks, tests/test_monkey.py)
    total = strip.cell_length
    left, right = min(cell_len(text[:start]), total), min(cell_len(text[:end]), total)
    if right <= left:
        return strip
    head, mid, tail = strip.divide([left, right, total])
    style = widget.screen.get_component_rich_style("screen--selection")
    return Strip.join([head, mid.apply_style(style), tail])


JOINS: dict[str, tuple[str, int | None]] = {
    ".join_space": (" ", None), ".join_fold": ("", None), ".join_code": ("", 2)}
"""Names of the span that marks where the text of a drawn line that goes on from the line
above starts (a paragraph wrapped at a space, a word folded at the width, a line of code wider
than its fence, whose lines end in a 2-cell padding), with the glue that joins the two again
when they are copied and how much of the line above's end to drop first (None: its trailing
spaces; a number: that many characters, the code's own spaces kept). Drawn, the span has no
style; it moves with the text when a list, a quote or a heading's centring adds cells before
it."""

Joined = tuple[int, str]
"""Where a drawn line's text starts and its ``JOINS`` name."""


def joined_at(line: Content) -> Joined | None:
    """Where ``line``'s text starts and how it joins the line above, if it goes on from it."""
    for span in line.spans:
        if isinstance(span.style, str) and span.style in JOINS:
            return span.start, span.style
    return None


def wrap_marked(text: Content, width: int) -> list[Content]:
    """``text.wrap(width)``, each line that goes on from the one above (a wrap, not a newline
    of the text) marked where its text starts (``JOINS``): copied, they are one line again."""
    out: list[Content] = []
    for part in text.split("\n", allow_blank=True):
        plain, at = part.plain, 0
        for n, line in enumerate(part.wrap(width)):
            start = plain.find(line.plain, at) if line.plain else -1
            if start < 0:
                out.append(line)
                continue
            if n:
                line = line.stylize(".join_space" if start > at else ".join_fold", 0, 1)
            out.append(line)
            at = start + len(line.plain)
    return out


def selected_text(selection: Selection, lines: int, line_text: Callable[[int], str],
                  trim: Callable[[str], str] = str.rstrip,
                  joined: Callable[[int], Joined | None] | None = None) -> tuple[str, str]:
    """The text under ``selection`` over ``lines`` drawn lines (``line_text(y)`` their plain
    text), one line per drawn line, each ``trim``-med: a line-API widget's ``get_selection``.
    With ``joined`` (``joined_at`` of drawn line y), a line that goes on from the line above
    is copied onto it, without what comes before its text (a list's indent, a quote's
    border, the mark of wrapped code): a paragraph wrapped at the width is one line again."""
    out: list[str] = []
    for y in range(lines):
        span = selection.get_span(y)
        if span is None:
            continue
        text = line_text(y)
        start, end = span
        part = text[start:] if end == -1 else text[start:end]
        goes_on = joined(y) if joined is not None and out else None
        if goes_on is None:
            out.append(trim(part))
            continue
        at, name = goes_on
        glue, drop = JOINS[name]
        above = out[-1].rstrip() if drop is None else out[-1][:len(out[-1]) - drop]
        out[-1] = trim(above + glue + part[at:])
    return "\n".join(out), "\n"
