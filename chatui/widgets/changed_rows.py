"""Let a partial screen update render only the rows it changes.

For a partial update Textual's compositor takes the box around the changed regions (``crop``)
and asks every visible widget whose *clip* (the container that clips it, for most widgets the
whole screen or the whole conversation) overlaps it for all of its lines, then keeps the lines
inside the changed rows. While a reply streams, a frame changes a line or two, yet the footer,
the prompt box, the status bar and every block of the conversation on screen were rendered in
full, some 150 lines through Textual's line cache and filters, on each of 10 to 20 updates a
second (textual 8.2.8).

:func:`apply` narrows each widget's clip to the rows of ``crop`` before it is rendered, so a
widget outside those rows is skipped and one across them renders just those rows. The update
is the same: the compositor writes only lines inside the changed rows, and a widget renders a
part of itself as it renders a partly scrolled-off widget. A full update (``crop`` is the whole
screen) and an export (no ``crop``) are unchanged.
"""

from __future__ import annotations

from typing import Iterable

from textual._compositor import Compositor
from textual.geometry import Region
from textual.strip import Strip

_PATCHED = "_chatui_changed_rows"


def apply() -> None:
    """Patch :class:`textual._compositor.Compositor` once (idempotent)."""
    if getattr(Compositor, _PATCHED, False):
        return
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

    get_renders_in_rows.__doc__ = get_renders.__doc__
    Compositor._get_renders = get_renders_in_rows  # type: ignore[method-assign]
    setattr(Compositor, _PATCHED, True)
