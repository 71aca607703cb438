"""Overrides of :class:`textual.widget.Widget`'s private size bookkeeping (textual 8.2.8).

Two mixins and a function that :mod:`chatui.widgets.settled` builds its public mixins on. Where
:mod:`.gate` turns the patches off they are empty (the mixins) or take the public path (the
function): Textual then lays the screen out again after each resize and repaints a resized
widget in full, which costs layouts and repaints while a reply streams and changes nothing on
screen.

- :class:`NoLayoutOnResize`: Textual sets a widget's ``virtual_size`` after every layout that
  changed the widget's size, and ``virtual_size`` is a layout reactive, so each widget that
  grew asks for a second layout of the screen, which finds nothing left to do. For a widget
  that never scrolls its own content that layout is pure cost (a streaming reply grows on
  most frames: its views paid two layouts of the whole screen per new line).
- :class:`RepaintsNewRowsOnly`: Textual repaints a widget in full when its size changes. A
  widget whose lines do not depend on its height, that only grew or shrank, keeps its lines:
  only the rows between the two heights are new.
- :func:`forget_measured_size`: drop a widget's cached box model so that the layout its
  parent is about to run measures it again, without asking for a layout of its own.
"""

from __future__ import annotations

from textual.geometry import Region, Size
from textual.widget import Widget

from .gate import ENABLED

__all__ = ["NoLayoutOnResize", "RepaintsNewRowsOnly", "forget_measured_size"]

_HOOKS = ENABLED and all(hasattr(Widget, name) for name in (
    "_size_updated", "_set_dirty"))


if _HOOKS:

    class NoLayoutOnResize:
        """Mixin: a layout that resized the widget is the only one (no second layout)."""

        def _size_updated(self, size: Size, virtual_size: Size, container_size: Size,
                          layout: bool = True) -> bool:
            return super()._size_updated(  # type: ignore[misc, no-any-return]
                size, virtual_size, container_size, layout=False)

    class RepaintsNewRowsOnly:
        """Mixin for a widget whose lines do not depend on its height: a change of height
        alone repaints only the rows between the old and the new height."""

        def _size_updated(self, size: Size, virtual_size: Size, container_size: Size,
                          layout: bool = True) -> bool:
            widget: Widget = self  # type: ignore[assignment]
            old = widget._size
            if not (old.width == size.width and old.height and size.height):
                return super()._size_updated(  # type: ignore[misc, no-any-return]
                    size, virtual_size, container_size, layout=layout)
            widget._size = size  # Widget._size_updated then sees no change: no full repaint
            changed = super()._size_updated(  # type: ignore[misc]
                size, virtual_size, container_size, layout=layout)
            if old.height != size.height:
                top, bottom = sorted((old.height, size.height))
                widget._set_dirty(Region(0, top, size.width, bottom - top))
            return bool(changed) or old != size

    def forget_measured_size(widget: Widget) -> None:
        """The widget's cached size is stale: the next layout of its parent measures it anew
        (``_layout_updates`` is part of the box model cache's key)."""
        widget._layout_updates += 1

else:

    class NoLayoutOnResize:  # type: ignore[no-redef]
        """Patches off: Textual's own resize (a second layout after each resize)."""

    class RepaintsNewRowsOnly:  # type: ignore[no-redef]
        """Patches off: Textual's own resize (a full repaint after each resize)."""

    def forget_measured_size(widget: Widget) -> None:
        """Patches off: the widget asks for a layout of its own (one more layout)."""
        widget.refresh(layout=True)
