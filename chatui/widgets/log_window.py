"""Virtual mounting for the conversation: only the items near the viewport have widgets.

A long chat (issue 21: 200 replies of ~330 tokens of Markdown) drawn with a widget tree per
message kept ~1,800 objects alive per reply, made every full garbage-collector pass walk all of
them (609 ms after 200 replies), every PageUp lay out ~1,000 widgets (178 ms a page), ``/load``
build them all (7.5 s) and ``/clear`` tear them down (0.5 s). Here each message is an
:class:`Item`: what it shows is the conversation's data (owned elsewhere), and it has widgets
only while it is within a few screens of the viewport. A run of items without widgets is one
:class:`Gap` widget as tall as they are: as measured when they were last drawn at this width,
else estimated from their text. When a drawn item's real height differs from its estimate, the
scroll position is corrected so that what the user looks at does not move.

Once up to date, the window draws the lines of the widgets a screen above and below the view
into Textual's line cache (:meth:`LogWindow.render_ahead`), so the first paint after PageUp or
PageDown reads them rather than drawing them (issue 21: the slowest pages drew ~60 new lines),
and then calls ``settled`` (the screen runs the garbage collector's full pass that waited for
the page there, :mod:`chatui.gcpolicy`).

The window does not know what the items are: the screen gives each one a ``build`` function
(returning the widgets to mount) and an ``estimate`` (its height at a width), and pins the ones
that must keep their widgets (a reply that streams). Everything else (which entry a widget
shows, focus, the inspector) stays the screen's business.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Callable

from textual.geometry import Region
from textual.widget import AwaitMount, Widget

from ..textual_compat.internals import follows_end

log = logging.getLogger(__name__)

SCREENS_AROUND = 1.0
"""Items within this many viewport heights above and below the viewport get widgets..."""
SCREENS_KEPT = 1.5
"""...and keep them until they are this far away (so scrolling back and forth by a page does
not rebuild them). Every layout of the log walks every widget it has: with 3 screens kept a
window held ~7 screens of items, and PageUp held down over 200 replies (``benchmarks/
bench_long.py --held 33``) drew its slowest pages behind layouts of 20-25 ms; with 1.5, p95
10.6-11.8 ms and max 24-28 ms against 12.4-23.6 and 28.5-40.5 (two runs each). Scrolled back,
a reply is mounted again from its kept layout (``MarkdownLines``' shared store)."""
SCREENS_AHEAD = 1.0
"""Lines of the widgets within this many viewport heights above and below the viewport are
drawn into Textual's line cache ahead of need, once the window is up to date: the page
PageUp or PageDown brings in is then read from the cache (see :meth:`LogWindow.render_ahead`)."""


class Gap(Widget):
    """Stands in for a run of items without widgets: as tall as they are, draws nothing."""

    DEFAULT_CSS = "Gap { height: 0; margin: 0; padding: 0; border: none; }"

    def __init__(self, height: int) -> None:
        super().__init__(classes="log-gap")
        self.styles.height = height
        self.lines = height

    def resize(self, height: int) -> None:
        if height != self.lines:
            self.lines = height
            self.styles.height = height

    def render_line(self, y: int):  # type: ignore[no-untyped-def]
        from textual.strip import Strip

        return Strip.blank(self.size.width)


@dataclass(eq=False)
class Item:
    """One message (or notice) of the log."""

    build: Callable[[], list[Widget]]
    """Makes the widgets that show it (called each time it comes near the viewport)."""
    estimate: Callable[[int], int]
    """Its height in lines at a width, before it has been drawn there (margin included)."""
    key: object = None
    """What the screen knows it by (its entry), for :meth:`LogWindow.items_of`."""
    tag: str = ""
    """What kind of item it is, for the screen (the window does not look)."""
    widgets: list[Widget] | None = None
    """Its widgets while it has them."""
    pinned: int = 0
    """Kept drawn while above zero (a reply that streams)."""
    measured: dict[int, int] = field(default_factory=dict)
    """Its height as drawn, by width."""
    mounting: AwaitMount | None = None
    """The mount of its widgets when they were added by :meth:`LogWindow.append` and co."""
    gone: bool = False
    """Removed from the log (an update that was under way skips it)."""

    def height(self, width: int) -> int:
        got = self.measured.get(width)
        return got if got is not None else max(1, self.estimate(width))

    @property
    def drawn(self) -> bool:
        return self.widgets is not None


class LogWindow:
    """Keeps the widgets of ``log`` (a vertical scroll) to the items near its viewport."""

    def __init__(self, log: Widget, *, settled: Callable[[], object] | None = None) -> None:
        self.log = log
        self.settled = settled
        """Called each time the window is up to date and has drawn ahead (nothing left to do
        until the next scroll or change): the screen runs what waited for the page to be
        drawn there (the garbage collector's full pass)."""
        self.items: list[Item] = []
        self._busy = False
        self._again = False
        self._watching = False
        self._task: asyncio.Task[None] | None = None
        self._idle: list[Callable[[], object]] = []

    @property
    def busy(self) -> bool:
        """Whether an update is scheduled or under way."""
        return self._busy

    # ---- the list of items ----

    def items_of(self, key: object) -> list[Item]:
        return [item for item in self.items if item.key is key]

    def drawn_items(self) -> list[Item]:
        return [item for item in self.items if item.widgets is not None]

    def append(self, item: Item) -> list[Widget]:
        """Add ``item`` at the end, drawn at once (the end is where the user looks when they
        add something; far from the viewport it loses its widgets on the next update)."""
        self.items.append(item)
        return self._draw_now(item)

    def add(self, item: Item) -> None:
        """Add ``item`` at the end without drawing it (``/load``: the next update draws the
        items that end up near the viewport)."""
        self.items.append(item)
        self.schedule()

    def add_before(self, item: Item, other: Item) -> None:
        """Add ``item`` just before ``other`` without drawing it (as ``add``)."""
        self.items.insert(self.items.index(other), item)
        self.schedule()

    def insert_before(self, item: Item, other: Item) -> list[Widget]:
        """Add ``item`` just before ``other`` (drawn at once)."""
        self.items.insert(self.items.index(other), item)
        return self._draw_now(item)

    def _draw_now(self, item: Item) -> list[Widget]:
        """Mount ``item``'s widgets before the next drawn item (or at the end); the next
        update puts the gaps around it right."""
        widgets = item.widgets = item.build()
        after = self._next_drawn_widget(item)
        if after is not None:
            item.mounting = self.log.mount_all(widgets, before=after)
        else:
            item.mounting = self.log.mount_all(widgets)
        self.schedule()
        return widgets

    def draw(self, item: Item) -> list[Widget]:
        """``item``'s widgets, mounting them now if it has none."""
        return item.widgets if item.widgets is not None else self._draw_now(item)

    def _next_drawn_widget(self, item: Item) -> Widget | None:
        index = self.items.index(item)
        for later in self.items[index + 1:]:
            if later.widgets:
                return later.widgets[0]
        return None

    async def remove(self, item: Item) -> None:
        item.gone = True
        if item in self.items:
            self.items.remove(item)
        if item.widgets is not None:
            widgets, item.widgets, item.mounting = item.widgets, None, None
            await self.log.remove_children(widgets)
        self.schedule()

    async def clear(self) -> None:
        for item in self.items:
            item.gone = True
            item.widgets = item.mounting = None
        self.items.clear()
        await self.log.remove_children()

    # ---- keeping the widgets to the viewport ----

    def watch(self) -> None:
        """Update whenever the log scrolls or changes size (called once it is mounted)."""
        if not self._watching:
            self._watching = True
            self.log.watch(self.log, "scroll_y", lambda _old, _new: self.schedule(),
                           init=False)
            self.log.watch(self.log, "size", lambda _old, _new: self.schedule(), init=False)

    def schedule(self) -> None:
        """Update after the next refresh (many calls in one frame make one update)."""
        if self._busy:
            self._again = True
            return
        self._busy = True
        # a task of its own, not a callback on the log's queue: the update awaits mounts and
        # a layout of the log, which that queue would have to process first
        self.log.call_after_refresh(self._start)

    def when_idle(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` once no update is scheduled or under way (at once if none is):
        the items added last are then placed (the log's height holds each of them), and a
        scroll's page is drawn. Once; a callback may scroll and ask again."""
        if self._busy:
            self._idle.append(callback)
        else:
            callback()

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                await self.update()
                if not self._again:
                    await self.render_ahead()
                if not self._again:
                    if self.settled is not None:
                        self.settled()
                    break
                # scrolled meanwhile: that page is painted before the next update (which
                # mounts and lays out in one batch of screen updates, holding the page back)
                await self._after_layout()
        except Exception:  # noqa: BLE001 - a failed update must not stop the next ones
            log.exception("updating the conversation's window failed")
        finally:
            self._busy = False
            waiting, self._idle = self._idle, []
            for callback in waiting:
                try:
                    callback()
                except Exception:  # noqa: BLE001 - one failed callback must not stop the rest
                    log.exception("a callback after the conversation's window update failed")

    def width(self) -> int:
        return self.log.scrollable_content_region.width

    def _measure(self, width: int) -> None:
        """Record the height of every drawn item as laid out now (margins collapse: an item
        reaches from its first widget's top margin to the next item's)."""
        tops: list[tuple[int, Item | None]] = []
        owner = {id(w): item for item in self.items if item.widgets for w in item.widgets}
        for child in self.log.children:
            if not child.region and not child.virtual_region.height and child.display:
                return  # not laid out yet
            item = owner.get(id(child))
            if item is None and not isinstance(child, Gap):
                continue  # a widget the window does not manage ends no item
            if item is not None and child is not item.widgets[0]:  # type: ignore[index]
                continue
            if not child.display:
                continue
            tops.append((child.virtual_region.y - child.styles.margin.top, item))
        # the content's end, not the log's virtual height: a log shorter than its viewport is
        # as tall as the viewport, and the last item measured to there was taken for as tall
        # as the empty space under it
        end = max((child.virtual_region.bottom + child.styles.margin.bottom
                   for child in self.log.children if child.display), default=0)
        for (top, item), (next_top, _) in zip(tops, tops[1:] + [(end, None)]):
            if item is not None and next_top > top:
                item.measured[width] = next_top - top

    async def update(self) -> None:
        """Give widgets to the items near the viewport, take them from those far from it,
        and size the gaps; what is on screen stays where it is."""
        log_widget = self.log
        if not log_widget.is_mounted or not self.items:
            return
        width = self.width()
        view = log_widget.scrollable_content_region.height
        if width <= 0 or view <= 0:
            return
        self._measure(width)
        following = follows_end(log_widget)
        heights = [item.height(width) for item in self.items]
        # following the end, the view shows the last lines (after /load nothing is drawn yet:
        # the scroll offset would say the top)
        y0 = max(0, sum(heights) - view) if following else log_widget.scroll_offset.y
        near_lo, near_hi = y0 - SCREENS_AROUND * view, y0 + (1 + SCREENS_AROUND) * view
        kept_lo, kept_hi = y0 - SCREENS_KEPT * view, y0 + (1 + SCREENS_KEPT) * view
        wanted: list[bool] = []
        top = 0
        for item, h in zip(self.items, heights):
            bottom = top + h
            near = bottom >= near_lo and top <= near_hi
            kept = item.drawn and bottom >= kept_lo and top <= kept_hi
            wanted.append(bool(near or kept or item.pinned))
            top = bottom
        if following:  # the end is on screen: the items that fill the last screen
            wanted[-1] = True
        # items may be added or removed while this awaits: decide by item, not by index
        want = {id(item): w for item, w in zip(self.items, wanted)}
        changed = any(item.drawn != w for item, w in zip(self.items, wanted))
        anchor = None if following else self._anchor(y0, heights)
        # one layout for all of it (each mount, removal and gap change laid the log out
        # again: 3 layouts of ~15 ms a page)
        with log_widget.app.batch_update():
            if changed:
                await self._swap(want)
            rebuilt = await self._place_gaps(width)
        if not changed and not rebuilt:
            return
        if following:
            if follows_end(log_widget):  # (not if the user scrolled away meanwhile)
                log_widget.scroll_end(animate=False, immediate=True)
        elif anchor is not None:
            await self._restore(anchor)

    async def _swap(self, want: dict[int, bool]) -> None:
        """Take the widgets of the items not wanted, give widgets to those wanted."""
        log_widget = self.log
        going: list[Widget] = []
        for item in self.items:
            if item.widgets is not None and not want.get(id(item), True):
                going.extend(item.widgets)
                item.widgets = item.mounting = None  # (a mount holds its widgets)
        if going:
            for widget in going:  # their drawn lines die now, not with the widgets' cycles
                for part in widget.walk_children(with_self=True):
                    part.refresh()
            await log_widget.remove_children(going)
        next_widget: Widget | None = None
        for item in reversed(list(self.items)):
            if item.gone:
                continue
            if want.get(id(item)) and item.widgets is None:
                item.widgets = item.build()
                if next_widget is not None:
                    await log_widget.mount_all(item.widgets, before=next_widget)
                else:
                    await log_widget.mount_all(item.widgets)
            if item.widgets:
                next_widget = item.widgets[0]

    async def _place_gaps(self, width: int) -> bool:
        """One gap for each run of items without widgets, just before the drawn item that
        follows the run (or at the end); True when gaps were added or removed."""
        runs: list[tuple[int, Widget | None]] = []
        run = 0
        for item in self.items:
            if item.widgets is None:
                run += item.height(width)
            elif run:
                runs.append((run, item.widgets[0] if item.widgets else None))
                run = 0
        if run:
            runs.append((run, None))
        children = list(self.log.children)
        gaps = [c for c in children if isinstance(c, Gap)]
        placed = [(children[children.index(g) + 1] if children.index(g) + 1 < len(children)
                   else None) for g in gaps]
        if len(gaps) == len(runs) and all(
                after is want for after, (_, want) in zip(placed, runs)):
            for gap, (h, _) in zip(gaps, runs):
                gap.resize(h)
            return False
        if gaps:
            await self.log.remove_children(gaps)
        for h, before in runs:
            if before is not None:
                await self.log.mount(Gap(h), before=before)
            else:
                await self.log.mount(Gap(h))
        return True

    async def render_ahead(self) -> int:
        """Draw the lines of the drawn items' widgets that lie within :data:`SCREENS_AHEAD`
        screens above and below the view, off screen, into Textual's line cache (public
        ``Widget.render_lines``); how many widgets were drawn. A scroll or change meanwhile
        (another update scheduled) stops it.

        The first paint of a page used to draw every line of the replies it brought in: the
        reply's container, its Markdown lines, its header and statistics (~60 of the ~95 lines
        a PageUp drew, two thirds of its time; 60 replies, ``benchmarks/bench_long.py``).
        Drawn here, after the window has mounted and laid out what came into reach, while
        the user reads, the page reads them from the cache. Textual keeps a widget's cached
        lines until it is refreshed or resized; :class:`~.markdown_lines.MarkdownLines` drops
        those of widgets drawn long ago (``DRAWN_WIDGETS``), so what is kept stays bounded.

        Not while an item is pinned (a reply streams): its frames refresh it anyway, and the
        window updates after each of its steps; the update after it ends draws ahead."""
        log_widget = self.log
        if not log_widget.is_mounted or any(item.pinned for item in self.items):
            return 0
        await self._after_layout()  # where the update's scrolls and mounts put everything
        if self._again or not log_widget.is_mounted:
            return 0
        view = log_widget.scrollable_content_region
        if not view:
            return 0
        reach = int(SCREENS_AHEAD * view.height)
        band = Region(view.x, view.y - reach, view.width, view.height + 2 * reach)
        drawn = 0
        for item in list(self.items):
            if self._again:
                break
            if not item.widgets or item.gone:
                continue
            for top in item.widgets:
                if not top.is_mounted or not top.display:
                    continue
                for widget in top.walk_children(with_self=True):
                    if self._again or not widget.is_mounted:
                        break
                    region = widget.region  # where it is, on screen or not (Textual's map)
                    part = region.intersection(band)
                    if not part or view.contains_region(part):
                        continue  # out of reach, or on screen: the compositor draws it
                    widget.render_lines(part.translate((-region.x, -region.y)))
                    drawn += 1
                await asyncio.sleep(0)  # a key that came meanwhile goes first
        return drawn

    def _anchor(self, y0: float, heights: list[int]) -> tuple[Item, int, float] | None:
        """The item at the top of the view (drawn or not), where it starts, and the view's
        offset then."""
        top = 0
        for item, h in zip(self.items, heights):
            if top + h > y0:
                return item, top, y0
            top += h
        return None

    async def _restore(self, anchor: tuple[Item, int, float]) -> None:
        """Move the view by as much as the item at its top moved (items above it drawn in
        place of their estimates), so that what the user looks at stays where it was; a
        scroll the user made meanwhile (``scroll_target_y``) is kept.

        While widgets were swapped for gaps the log was briefly shorter than the offset, and
        Textual, clamping the offset to the end, took the user back to following the end
        (the anchor re-engaged, and the next layout scrolled there): then the view goes back
        to the anchor item and the anchor is released again."""
        item, old_top, y0 = anchor
        await asyncio.sleep(0)
        self.log.refresh(layout=True)
        await self._after_layout()
        if item not in self.items:
            return
        width = self.width()
        self._measure(width)
        top = 0
        for other in self.items:
            if other is item:
                break
            top += other.height(width)
        if follows_end(self.log):
            self.log.release_anchor()
            moved = 0.0
        else:
            moved = self.log.scroll_target_y - y0
        # (clamped: Textual takes an offset above the top as it is, and drew the log that many
        # blank lines down)
        target = max(0.0, min(top + (y0 - old_top) + moved, self.log.max_scroll_y))
        if abs(target - self.log.scroll_y) >= 1:
            self.log.scroll_to(y=target, animate=False, immediate=True)

    async def _after_layout(self) -> None:
        done = asyncio.get_running_loop().create_future()
        # (not scheduled when the log is gone: nothing will be drawn, nothing to wait for)
        if self.log.call_after_refresh(lambda: done.done() or done.set_result(None)):
            await done
