"""What tests and benchmarks need from inside a running Textual app (textual 8.2.8): events
delivered as the terminal driver delivers them, the updates the app writes to its terminal,
and the screen rendered anew.

These are no patches and need no gate: only tests and benchmarks call them, on whatever Textual
is installed, and a release that changes these internals fails those tests, not the app. They
live here so that every contact with Textual's internals is in one package.
"""

from __future__ import annotations

import time
from typing import Callable

from rich.cells import cell_len
from textual.app import App
from textual.events import Event
from textual.strip import Strip

try:
    from textual._compositor import ChopsUpdate, CompositorUpdate, LayoutUpdate
except ImportError:  # never needed by the app itself: the tests that use it fail
    ChopsUpdate = CompositorUpdate = LayoutUpdate = None  # type: ignore[assignment, misc]

__all__ = ["VirtualTerminal", "deliver", "render_screen", "watch_updates"]


def deliver(app: App, event: Event) -> None:
    """Queue ``event`` (a key, say) for ``app`` as the terminal driver does: without waiting
    for the app to be idle (``Pilot.press`` waits, which a busy app never is)."""
    event.set_sender(app)
    app._driver.send_message(event)  # type: ignore[union-attr]


def watch_updates(app: App, callback: Callable[[object], None]) -> None:
    """Call ``callback`` with each screen update (a ``CompositorUpdate``) that ``app`` writes
    to its terminal, before it is written; a headless app writes nothing, but is watched the
    same (none while updates are batched)."""
    display = app._display

    def _display(screen, update) -> None:  # type: ignore[no-untyped-def]
        if isinstance(update, CompositorUpdate) and not app._batch_count:
            callback(update)
        display(screen, update)

    app._display = _display  # type: ignore[method-assign]


def paint_times(app: App, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """A list that gets the ``clock()`` (default ``time.perf_counter()``) at which each screen
    update (as :func:`watch_updates` sees them) has been written: when the terminal shows it.
    ``time.thread_time`` there, read on the app's thread, gives the CPU the app spent."""
    times: list[float] = []
    display = app._display

    def _display(screen, update) -> None:  # type: ignore[no-untyped-def]
        display(screen, update)
        if isinstance(update, CompositorUpdate) and not app._batch_count:
            times.append(clock())

    app._display = _display  # type: ignore[method-assign]
    return times


def render_screen(app: App, *, fresh: bool = False) -> list[Strip]:
    """The current screen's lines as its compositor renders them; ``fresh``: every widget's
    cached lines (Textual's styles cache) thrown away first."""
    screen = app.screen
    if fresh:
        for widget in screen.walk_children(with_self=True):
            widget._styles_cache.clear()
    return screen._compositor.render_strips()


class VirtualTerminal:
    """The screen a terminal shows, built from the updates the app writes to it (the full and
    the partial ones, as Textual turns them into escape sequences): ``rows[y][x]`` is a
    (character, style) pair, "" for the right half of a double-width character."""

    def __init__(self, app: App, size: tuple[int, int]) -> None:
        width, height = size
        self.rows: list[list[tuple[str, object]]] = [[(" ", None)] * width
                                                     for _ in range(height)]
        watch_updates(app, self.apply)

    def apply(self, update: object) -> None:
        """Write one screen update."""
        if isinstance(update, LayoutUpdate):
            for y, line in enumerate(update.strips, update.region.y):
                x = update.region.x
                for strip in line:
                    self.put(x, y, strip)
                    x += strip.cell_length
        elif isinstance(update, ChopsUpdate):
            for y, x1, x2 in update.spans:
                for end, (x, strip) in zip(update.chop_ends[y], update.chops[y].items()):
                    if strip is None or x > x2 or end <= x1:
                        continue
                    if not (x2 > x >= x1 and end <= x2):
                        strip = strip.crop(0, min(end, x2) - x)
                    self.put(x, y, strip)

    def put(self, x: int, y: int, strip: Strip) -> None:
        row = self.rows[y]
        for text, style, control in strip:
            if control:
                continue
            for ch in text:
                row[x] = (ch, style)
                if cell_len(ch) == 2:
                    row[x + 1] = ("", style)
                x += cell_len(ch)

    @staticmethod
    def of(strips: list[Strip], size: tuple[int, int]) -> list[list[tuple[str, object]]]:
        """The rows a terminal shows after a full update with ``strips``."""
        screen = VirtualTerminal.__new__(VirtualTerminal)
        screen.rows = [[(" ", None)] * size[0] for _ in range(size[1])]
        for y, strip in enumerate(strips):
            screen.put(0, y, strip)
        return screen.rows
