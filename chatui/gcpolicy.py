"""The cyclic garbage collector around streaming replies: it runs as Python runs it; nothing is
frozen.

The policy this module had (freeze everything alive when a reply starts, and after each full
pass while it streams) kept pauses short by hiding objects from the collector, but a Markdown
block or widget frozen while alive and later dead inside a reference cycle was never collected
again until ``/clear``: 100,000 dead objects per reply, 2.9 million after 30 replies, 8-20 s to
release (issue 21, docs/long-sessions.md). Its cause is gone: a finished reply keeps ~2,000
tracked objects alive (MarkdownLines, TokenRecords, a token view that keeps nothing while
hidden), so a full pass over a long session is short, and with Python's thresholds full passes
are rare (one runs only when the objects that survived the young generations since the last
full pass reach a quarter of those that are long-lived): a streaming reply makes far fewer
survivors than that.

What is left:

- while a reply streams, full (generation 2) passes wait: the generation-2 threshold is raised
  for as long as one streams and restored when the last one ends (young passes run as usual,
  so a stream's own short-lived cycles are still collected). A full pass walks every object
  of the session (~250,000 after 60 replies: measured 294 ms on the loaded 2-core machine
  while the 60th reply streamed, docs/long-sessions.md); deferred, it runs when Python next
  wants one after the reply, not while tokens and keystrokes arrive. Nothing is frozen, so
  whatever dies is found by that pass;
- :func:`freeze_imports` (called by ``run_chat`` before the app is built) hides what the
  imports made from every full pass: it lives as long as the process, so freezing it hides
  no garbage;
- while the user scrolls the conversation, full passes wait too, and the one that came due
  runs when the page has been drawn (the conversation's window calls :func:`page_drawn`
  once it has drawn the page and what is around it, and the pass runs once no scroll has come
  for :data:`SCROLL_QUIET_S`: a key held down repeats faster), not inside the next key's
  frame. PageUp
  from the bottom to the top of 60 replies (``benchmarks/bench_long.py``, the loaded 2-core
  machine) met a full pass every ~8 pages, 150-330 ms each (walking ~80,000 live objects and
  collecting the ~25,000 that the widgets scrolled away left), and those were all of the
  pages over 30 ms. Nothing waits longer than :data:`SCROLL_SETTLE_S` after the last scroll
  or :data:`SCROLL_MAX_YOUNG` young passes (a key held down through a very long chat), so
  what scrolling leaves behind is collected;
- :func:`release` collects the old conversation's widgets (reference cycles) at once after
  ``/clear`` or ``/load`` instead of at some later pass, when no reply streams.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger(__name__)

_streams = 0


DEFERRED = 1_000_000
"""The generation-2 threshold while a reply streams or the user scrolls (young passes between
two full passes): more than any reply or scroll makes."""

SCROLL_SETTLE_S = 2.0
"""Full passes wait at most this long after the last scroll of the conversation, if nothing
called :func:`scroll_settled` before..."""
SCROLL_QUIET_S = 0.075
"""The window having drawn the page and what is around it (:func:`page_drawn`) settles the
scrolling only once no scroll came for this long: a key held down repeats every 20-50 ms in a
terminal (a repeat rate of 14 a second or more), and a window that finished its work between
two keys would otherwise let the due pass (~100 ms after 200 replies) run in front of the next
key. A key pressed once at a time comes 100 ms or more apart, and its window work takes about
that long: the pass runs when it is done, as before."""
SCROLL_MAX_YOUNG = 400
"""...and no longer than this many generation-1 passes since the last full pass: then the
due pass runs, wherever that falls. Python's own schedule considers one every 10 and runs it
when the objects that survived since the last one reach a quarter of the rest. PageUp held
from the bottom to the top of 200 replies (``benchmarks/bench_long.py --held 33``, 262 pages)
makes ~1.3 young passes a page: with a limit of 60 a full pass (47-70 ms, ~98,000 live
objects) landed every ~45 pages, and those passes and the pages queued behind them were most
of the pages over 30 ms. 400 covers ~300 pages of a held key; the pass that runs once it is
released found the ~210,000 objects the whole scroll left (~1,000 per exchange scrolled
past: its widgets, 10 an exchange then; 5 now) in 323 ms."""

_saved: tuple[int, int, int] | None = None
_scrolling = False
_last_scroll = 0.0
_settle: asyncio.TimerHandle | None = None
_settle_loop: asyncio.AbstractEventLoop | None = None
_drawn = False
"""The window has drawn everything since the last scroll (then :data:`SCROLL_QUIET_S` of
quiet settles the scrolling, else :data:`SCROLL_SETTLE_S`)."""


def _hold() -> None:
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(_saved[0], _saved[1], DEFERRED)


def _release() -> tuple[int, int, int] | None:
    """Python's thresholds back when nothing holds full passes; the restored ones (or None)."""
    global _saved
    if _streams or _scrolling or _saved is None:
        return None
    saved, _saved = _saved, None
    gc.set_threshold(*saved)
    return saved


def stream_started() -> None:
    """A reply began streaming (calls nest: compare columns each start one): full passes
    wait until the last stream ends."""
    global _streams
    _streams += 1
    _hold()


def stream_ended() -> None:
    """A reply ended: after the last one, full passes run as Python schedules them again."""
    global _streams
    _streams = max(0, _streams - 1)
    _release()


def streaming() -> bool:
    """Whether a reply streams now (full passes wait)."""
    return _streams > 0


def scrolled() -> None:
    """The user scrolled the conversation (called on every change of its offset): full passes
    wait until the scrolling has settled, when :func:`scroll_settled` runs the one that is
    due (needs a running event loop; without one nothing waits)."""
    global _scrolling, _last_scroll, _drawn
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    _last_scroll = time.monotonic()
    _drawn = False
    if gc.get_count()[2] >= SCROLL_MAX_YOUNG:  # a very long scroll: the due pass may run
        if _scrolling:
            _scrolling = False
            _release()
        return
    # (a timer left by an app whose loop has ended is replaced; a live one re-checks)
    if _settle is None or _settle.cancelled() or _settle_loop is not loop:
        _arm(loop, SCROLL_SETTLE_S)
    _scrolling = True
    _hold()


def _arm(loop: asyncio.AbstractEventLoop, delay: float) -> None:
    """Check whether the scrolling has settled in ``delay`` seconds (the one timer)."""
    global _settle, _settle_loop
    if _settle is not None:
        _settle.cancel()
    _settle = loop.call_later(delay, _check_settled)
    _settle_loop = loop


def _quiet_left() -> float:
    """Seconds until the scrolling counts as settled: :data:`SCROLL_QUIET_S` after the last
    scroll once the window has drawn it, :data:`SCROLL_SETTLE_S` otherwise."""
    return _last_scroll + (SCROLL_QUIET_S if _drawn else SCROLL_SETTLE_S) - time.monotonic()


def _check_settled() -> None:
    global _settle
    _settle = None
    left = _quiet_left()
    if _scrolling and left > 0.01:
        _arm(asyncio.get_running_loop(), left)
        return
    scroll_settled()


def page_drawn() -> bool:
    """The conversation's window has drawn the page and what is around it: the due full
    pass runs once no scroll has come for :data:`SCROLL_QUIET_S` (now, or on a timer; a key
    held down never leaves that long between pages); whether it ran now."""
    global _drawn
    if not _scrolling:
        return False
    _drawn = True
    left = _quiet_left()
    if left <= 0.01:
        return scroll_settled()
    _arm(asyncio.get_running_loop(), left)  # (a scroll was recorded on this loop)
    return False


def scroll_settled(*, collect: bool = True) -> bool:
    """Scrolling has stopped: full passes run as Python schedules them again, and with
    ``collect`` the one that came due meanwhile runs now (unless a reply streams); whether it
    ran. :func:`page_drawn` calls it once the window has drawn and the scrolling has been
    quiet; the screen, without ``collect``, when it goes (nothing waits for a loop that
    stopped)."""
    global _scrolling, _settle
    if _settle is not None:
        _settle.cancel()
        _settle = None
    if not _scrolling:
        return False
    _scrolling = False
    restored = _release()
    if not collect or restored is None or not gc.isenabled() or \
            gc.get_count()[2] < restored[2]:
        return False
    t0 = time.perf_counter()
    found = gc.collect()
    log.debug("gc after scrolling: %d unreachable, %.1f ms", found,
              (time.perf_counter() - t0) * 1000)
    return True


def scrolling() -> bool:
    """Whether full passes wait for scrolling to settle."""
    return _scrolling


def freeze_imports() -> int:
    """Move what the imports made (modules, classes, functions, constants: ~45,000 objects
    for the chat UI, alive until the process ends) out of the collector's sight, so that a
    full pass walks only what the session made; how many were frozen. Call it once, after
    the imports and before the app is built: nothing frozen then dies before exit."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def release() -> None:
    """Collect what the old conversation left (after it was cleared or replaced)."""
    if _streams or not gc.isenabled():
        return
    t0 = time.perf_counter()
    found = gc.collect()
    log.debug("gc release: %d unreachable, %.1f ms", found, (time.perf_counter() - t0) * 1000)
