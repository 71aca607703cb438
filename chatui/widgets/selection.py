"""Drawing a mouse selection over a line-API widget's line (shared by the token view and the
finished replies' Markdown)."""

from __future__ import annotations

from typing import Callable

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


def selected_text(selection: Selection, lines: int, line_text: Callable[[int], str],
                  trim: Callable[[str], str] = str.rstrip) -> tuple[str, str]:
    """The text under ``selection`` over ``lines`` drawn lines (``line_text(y)`` their plain
    text), one line per drawn line, each ``trim``-med: a line-API widget's ``get_selection``."""
    out: list[str] = []
    for y in range(lines):
        span = selection.get_span(y)
        if span is None:
            continue
        text = line_text(y)
        start, end = span
        out.append(trim(text[start:] if end == -1 else text[start:end]))
    return "\n".join(out), "\n"
