"""Mixins that spare a streaming reply layouts of the whole screen (textual 8.2.8).

Their parts that override Textual's private size bookkeeping live in
:mod:`chatui.textual_compat.widget_hooks` and are applied only where that package allows; the
rest is public API.

- :class:`SettledSize`, :class:`KeepHeight`: no second layout after a layout resized a widget,
  none for a paragraph whose new text is as tall as the old;
- :class:`GrowsInSteps`, :class:`FillsRoom`: a streaming reply takes room several lines at a
  time and its last paragraph fills it, so most new lines are only a repaint.

Textual sets a widget's ``virtual_size`` after every layout that changed the widget's size, and
``virtual_size`` is a layout reactive: each widget that grew asks for another layout of the
screen, which finds nothing left to do. For a widget that never scrolls its own content the
second layout is pure cost, and a streaming reply grows on most frames: its views paid two
layouts of the whole screen per new line.
"""

from __future__ import annotations

from typing import TypeVar

from textual.containers import VerticalScroll
from textual.geometry import Offset, Region, Size
from textual.visual import VisualType
from textual.widget import Widget

from ..textual_compat import NoLayoutOnResize, RepaintsNewRowsOnly, forget_measured_size

W = TypeVar("W", bound=Widget)


class SettledSize(NoLayoutOnResize):
    """Mixin for a widget that never scrolls: a layout that resizes it is the only one.

    Nor does one that is not mounted yet ask for a layout when its content is set (a Markdown
    block gets its text while it is built): the mount lays it out, and the request, kept until
    the widget was mounted, made Textual lay the screen out a second time for nothing (each
    new block of a streaming reply cost two layouts)."""

    def refresh(self, *regions: Region, repaint: bool = True, layout: bool = False,
                recompose: bool = False) -> Widget:
        widget: Widget = self  # type: ignore[assignment]
        if layout and not widget.is_mounted:
            layout = False
        return super().refresh(  # type: ignore[misc, no-any-return]
            *regions, repaint=repaint, layout=layout, recompose=recompose)


class KeepHeight(SettledSize):
    """Mixin for a text widget as wide as its parent (a paragraph): new content with the height
    of the old is repainted without a layout of the screen (``Static.update`` always asks for
    one; while a paragraph streams, most appends leave its height as it was)."""

    def update(self, content: VisualType = "", *, layout: bool = True) -> None:
        widget: Widget = self  # type: ignore[assignment]
        region = widget.content_region
        super().update(content, layout=False)  # type: ignore[misc]
        same = (widget.is_mounted and region.width > 0 and region.height > 0
                and widget.get_content_height(region.size, region.size, region.width)
                == region.height)
        if layout and not same:
            widget.refresh(layout=True)


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


class FillsRoom:
    """Mixin for the last block of a reply that grows in steps (:class:`GrowsInSteps`): while
    ``fill`` is set it is as tall as the room its parent reserved below its top, or as its
    content where that is taller. Lines written into that room are then only a repaint, not a
    layout that moves the block's edge (a paragraph streams one line at a time).

    The parent's height is the last layout's: a block that grows past it makes the parent take
    its next step, and fills that on its next update. The room only saves layouts; a wrong
    guess (a block mounted with others at once) costs one, never a line of text."""

    fill: bool = False

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        height: int = super().get_content_height(container, viewport, width)  # type: ignore[misc]
        if self.fill:
            top = self._content_top(container, viewport)
            widget: Widget = self  # type: ignore[assignment]
            parent = widget.parent
            if top is not None and isinstance(parent, Widget):
                styles = widget.styles
                room = (parent.content_region.bottom - top - styles.gutter.bottom
                        - styles.margin.bottom)
                height = max(height, room)
        return height

    def _content_top(self, container: Size, viewport: Size) -> int | None:
        """Where this block's content starts on screen: where the last layout put it, or for a
        block just mounted, below the block before it (as tall as its text: it filled the room
        until now and stops in this layout)."""
        widget: Widget = self  # type: ignore[assignment]
        parent = widget.parent
        if not isinstance(parent, Widget) or not parent.region:
            return None
        if widget.region:
            return widget.content_region.y
        siblings = parent.children
        index = siblings.index(widget) if widget in siblings else 0
        before = siblings[index - 1] if index > 0 else None
        if before is None or not before.region:
            return None
        if isinstance(before, FillsRoom):
            bottom = before.content_region.y + before.get_content_height(
                container, viewport, before.content_region.width) + before.styles.gutter.bottom
        else:
            bottom = before.region.bottom
        gap = max(before.styles.margin.bottom, widget.styles.margin.top)
        return bottom + gap + widget.styles.gutter.top

    def set_fill(self, fill: bool, *, layout: bool = True) -> None:
        """Fill the room (or not). Without ``layout`` the caller lays out the parent: the
        block's own request would reach the screen only after that layout, and make a second
        one."""
        if fill != self.fill:
            self.fill = fill
            widget: Widget = self  # type: ignore[assignment]
            if not layout:
                forget_measured_size(widget)
            elif widget.region:  # a block not laid out yet fills in the layout that places it
                widget.refresh(layout=True)


_SETTLED: dict[tuple[type, tuple[type, ...]], type] = {}


def settled(cls: type[W], *mixins: type) -> type[W]:
    """``cls`` with ``mixins`` (default :class:`SettledSize`) mixed in (the same name, so the
    same CSS applies)."""
    key = (cls, mixins or (SettledSize,))
    if key not in _SETTLED:
        _SETTLED[key] = type(cls.__name__, (*key[1], cls), {"__module__": __name__})
    return _SETTLED[key]


class ConversationLog(SettledSize, VerticalScroll):
    """The scrolling conversation. It scrolls, but a change of its virtual size needs no second
    layout either: the layout that measured it already placed and anchored its children, and a
    scrollbar that appears or goes asks for its own layout (``show_vertical_scrollbar``)."""

    @property
    def scroll_offset(self) -> Offset:
        """Never above the top. Textual 8.2.8's compositor sets an anchored scroll's offset to
        its content's end less the viewport without the clamp the reactive's validator
        applies (textual#6652): a conversation shorter than the screen was drawn that many
        blank lines down, hugging the prompt, until something scrolled it (seen in a snapshot
        test, one run in four)."""
        offset = super().scroll_offset
        return offset if offset.y >= 0 else Offset(offset.x, 0)
