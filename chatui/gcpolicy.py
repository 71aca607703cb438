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
- :func:`release` collects the old conversation's widgets (reference cycles) at once after
  ``/clear`` or ``/load`` instead of at some later pass, when no reply streams.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

_streams = 0


DEFERRED = 1_000_000
"""The generation-2 threshold while a reply streams (young passes between two full passes):
more than any reply makes."""

_saved: tuple[int, int, int] | None = None


def stream_started() -> None:
    """A reply began streaming (calls nest: compare columns each start one): full passes
    wait until the last stream ends."""
    global _streams, _saved
    _streams += 1
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(_saved[0], _saved[1], DEFERRED)


def stream_ended() -> None:
    """A reply ended: after the last one, full passes run as Python schedules them again."""
    global _streams, _saved
    _streams = max(0, _streams - 1)
    if not _streams and _saved is not None:
        gc.set_threshold(*_saved)
        _saved = None


def streaming() -> bool:
    """Whether a reply streams now (full passes wait)."""
    return _streams > 0


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


def streaming() -> bool:
    """Whether a reply is streaming now."""
    return _streams > 0
