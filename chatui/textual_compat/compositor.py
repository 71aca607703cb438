"""Two patches to Textual's private compositor, so that a streaming reply's frames repaint only
what changed (written against textual 8.2.8; applied only where :mod:`.gate` allows).

**Rows.** For a partial update Textual's compositor takes the box around the changed regions (``crop``)
and asks every visible widget whose *clip* (the container that clips it, for most widgets the
whole screen or the whole conversation) overlaps it for all of its lines, then keeps the lines
inside the changed rows. While a reply streams, a frame changes a line or two, yet the footer,
the prompt box, the status bar and every block of the conversation on screen were rendered in
full, some 150 lines through Textual's line cache and filters, on each of 10 to 20 updates a
second.

:func:`apply` narrows each widget's clip to the rows of ``crop`` before it is rendered, so a
widget outside those rows is skipped and one across them renders just those rows. The update
is the same: the compositor writes only lines inside the changed rows, and a widget renders a
part of itself as it renders a partly scrolled-off widget. A full update (``crop`` is the whole
screen) and an export (no ``crop``) are unchanged.

**Reorders.** A layout repaints every widget whose place in the compositor's map changed,
and the place includes a painting order counted from the end of the parent's children: when
a streaming reply mounts a new paragraph, every earlier block on screen "changes" and is
repainted, though none moved. :func:`apply` leaves those out of the repaint when nothing but
that number changed and the widgets that were there before still paint in the same order
relative to each other (then no overlap between them can look different); any other change
repaints as before. Textual's own reflow repaints these widgets for nothing but is not wrong.

Without the patches (another Textual release, ``CHATUI_TEXTUAL_PATCHES=off``) each frame
renders the whole width of every widget that touches the changed rows, and a new paragraph
repaints the blocks above it: the same screen, more work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from textual.geometry import Region, Size
from textual.strip import Strip
from textual.widget import Widget

try:
    from textual._compositor import Compositor
except ImportError:  # a release that moved it: nothing to patch
    Compositor = None  # type: ignore[assignment, misc]

if TYPE_CHECKING:
    from textual._compositor import CompositorMap, MapGeometry, ReflowResult

_PATCHED = "_chatui_partial_updates"
_REPLACES = ("_get_renders", "reflow")


def apply() -> bool:
    """Patch :class:`textual._compositor.Compositor` once (idempotent); whether it is patched.

    Only call it where :mod:`.gate` allows: it checks that the names it replaces exist, not
    that they still mean what they meant in the releases it was tested on."""
    if Compositor is None or not all(hasattr(Compositor, name) for name in _REPLACES):
        return False
    if getattr(Compositor, _PATCHED, False):
        return True
    get_renders = Compositor._get_renders

    def get_renders_in_rows(self: Compositor, crop: Region | None = None
                            ) -> Iterable[tuple[Region, Region, list[Strip]]]:
        if crop is None or crop.contains_region(self.size.region):
            yield from get_renders(self, crop)
            return
        top, bottom = crop.y, crop.bottom
        overlaps = crop.overlaps
        for widget, (region, clip) in self.visible_widgets.items():
            if not overlaps(clip):
                continue
            y1, y2 = max(clip.y, top), min(clip.bottom, bottom)
            rows = Region(clip.x, y1, clip.width, y2 - y1)  # the clip, within crop's rows
            x, y, width, height = region.intersection(rows)
            if width and height:
                yield region, rows, widget.render_lines(
                    Region(x - region.x, y - region.y, width, height))

    reflow = Compositor.reflow

    def reflow_without_reorders(self: Compositor, parent: Widget, size: Size) -> ReflowResult:
        old_map = self._full_map
        before = set(self._dirty_regions)
        result = reflow(self, parent, size)
        if size.region in self._dirty_regions:
            return result
        new_map = self._full_map
        reordered = {widget for widget, geometry in new_map.items()
                     if (old := old_map.get(widget)) is not None and old != geometry
                     and _same_but_order(old, geometry)}
        if not reordered or not _same_relative_order(old_map, new_map):
            return result
        dirty = before
        for widget, geometry in new_map.items() ^ old_map.items():
            if widget not in reordered and (region := geometry.clip.intersection(
                    geometry.region)):
                dirty.add(region)
        self._dirty_regions.clear()
        self._dirty_regions.update(dirty)
        return result

    get_renders_in_rows.__doc__ = get_renders.__doc__
    reflow_without_reorders.__doc__ = reflow.__doc__
    Compositor._get_renders = get_renders_in_rows  # type: ignore[method-assign]
    Compositor.reflow = reflow_without_reorders  # type: ignore[method-assign]
    setattr(Compositor, _PATCHED, True)
    return True


def _same_but_order(old: MapGeometry, new: MapGeometry) -> bool:
    return old.region == new.region and old.clip == new.clip and old[3:] == new[3:]


def _same_relative_order(old_map: CompositorMap, new_map: CompositorMap) -> bool:
    """Whether the widgets in both maps paint in the same order relative to each other."""
    common = [widget for widget in new_map if widget in old_map]
    return (sorted(common, key=lambda w: old_map[w].order)
            == sorted(common, key=lambda w: new_map[w].order))
