"""Mixins that spare a streaming reply layouts of the whole screen (textual 8.2.8).

Their parts that override Textual's private size bookkeeping live in
:mod:`chatui.textual_compat.widget_hooks` and are applied only where that package allows; the
rest is public API.

- :class:`SettledSize`: no second layout after a layout resized a widget;
- :class:`GrowsInSteps`: a streaming reply takes room several lines at a time, so most new
  lines are only a repaint.

Textual sets a widget's ``virtual_size`` after every layout that changed the widget's size, and
``virtual_size`` is a layout reactive: each widget that grew asks for another layout of the
screen, which finds nothing left to do. For a widget that never scrolls its own content the
second layout is pure cost, and a streaming reply grows on most frames: its views paid two
layouts of the whole screen per new line.
"""

from __future__ import annotations

from typing import Callable

from textual import events
from textual.containers import VerticalScroll
from textual.geometry import Offset, Region, Size
from textual.widget import Widget

from ..textual_compat import NoLayoutOnResize, RepaintsNewRowsOnly


class SettledSize(NoLayoutOnResize):
    """Mixin for a widget that never scrolls: a layout that resizes it is the only one.

    Nor does one that is not mounted yet ask for a layout when its content is set (a widget
    gets its text while it is built): the mount lays it out, and the request, kept until the
    widget was mounted, made Textual lay the screen out a second time for nothing."""

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> Widget:
        widget: Widget = self  # type: ignore[assignment]
        if layout and not widget.is_mounted:
            layout = False
        return super().refresh(  # type: ignore[misc, no-any-return]
            *regions, repaint=repaint, layout=layout, recompose=recompose)


def round_up(height: int, step: int) -> int:
    """``height`` rounded up to a multiple of ``step`` (unchanged when ``step`` is 0)."""
    return -(-height // step) * step if step > 0 else height


class GrowsInSteps(RepaintsNewRowsOnly):
    """Mixin for a widget of auto height that streams: while ``step`` > 0 its height is rounded
    up to a multiple of ``step`` lines.

    A reply that grows one line at a time moves everything below it and, followed to the end,
    scrolls the conversation by one line: each new line was a layout and a repaint of the whole
    screen. Grown in steps, the lines of a step are written into room already there (a repaint
    of those lines), and the conversation scrolls once per step. A change of height repaints
    only the rows between the two heights (:class:`RepaintsNewRowsOnly`)."""

    step: int = 0

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        height = super().get_content_height(container, viewport, width)  # type: ignore[misc]
        return round_up(height, self.step)

    def set_step(self, step: int) -> None:
        """Grow in steps of ``step`` lines (0: exactly as tall as the content)."""
        if step != self.step:
            self.step = step
            self.refresh(layout=True)  # type: ignore[attr-defined]


class ConversationLog(SettledSize, VerticalScroll):
    """The scrolling conversation. It scrolls, but a change of its virtual size needs no second
    layout either: the layout that measured it already placed and anchored its children, and a
    scrollbar that appears or goes asks for its own layout (``show_vertical_scrollbar``).

    It takes the focus itself (Tab from the prompt: the arrows and pages then scroll it), and
    a character typed then goes to ``type_into`` (the prompt), as from a token view: it was
    dropped, and a message typed after a Tab went nowhere (seen in tmux)."""

    type_into: Callable[[str, bool], None] | None = None

    def on_key(self, event: events.Key) -> None:
        if self.type_into is None or not self.has_focus or not (
                event.is_printable and event.character):
            return  # (a key of a widget inside, bubbling up, is that widget's)
        bound = self.screen.active_bindings.get(event.key)
        if bound is not None and bound.enabled:
            return
        self.type_into(event.character, False)
        event.stop()
        event.prevent_default()

    @property
    def scroll_offset(self) -> Offset:
        """Never above the top. Textual 8.2.8's compositor sets an anchored scroll's offset to
        its content's end less the viewport without the clamp the reactive's validator
        applies (textual#6652): a conversation shorter than the screen was drawn that many
        blank lines down, hugging the prompt, until something scrolled it (seen in a snapshot
        test, one run in four)."""
        offset = super().scroll_offset
        return offset if offset.y >= 0 else Offset(offset.x, 0)
