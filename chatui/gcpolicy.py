"""Keep Python's cyclic garbage collector from walking the whole session while a reply streams.

A full (generation 2) pass walks every tracked object: the app, the conversation and every
widget. While a reply streamed, such passes came every second or so and took 100-300 ms with
the GIL held, which froze the screen, delayed keys and, with an in-process engine, stopped
decoding. The policy:

- when a reply starts, what is alive is frozen (:func:`gc.freeze`): later passes skip it;
- while a reply streams, the collector runs as usual, but after each full pass what survived
  is frozen too, so every pass walks only what is newer than the previous one: pauses stay a
  few milliseconds however long the reply grows (Textual keeps every rendered line of every
  Markdown block, about 70 tracked objects per token, which made passes grow past 200 ms
  within 2,000 tokens). The price: an object frozen while alive that later dies in a
  reference cycle (a Markdown block replaced by the stream) waits for :func:`release`;
- when the last stream ends, one full pass collects what the streams left and freezes what
  survived: a pause proportional to that reply, not to the session;
- :func:`release` unfreezes everything and collects it all, for ``/clear`` and ``/load``
  (frozen objects that later die in a reference cycle are otherwise never collected).

:mod:`chatui.textual_compat.strips` removes the main source of cyclic garbage per frame.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)

_streams = 0


def _collect_and_freeze(why: str) -> None:
    t0 = time.perf_counter()
    found = gc.collect()
    gc.freeze()
    log.debug("gc %s: %d unreachable, %.1f ms, %d frozen", why, found,
              (time.perf_counter() - t0) * 1000, gc.get_freeze_count())


def _after_pass(phase: str, info: dict) -> None:
    if phase == "stop" and info.get("generation") == 2 and _streams:
        gc.freeze()


def stream_started() -> None:
    """A reply began streaming (calls nest: compare columns each start one)."""
    global _streams
    _streams += 1
    if _streams == 1 and gc.isenabled():
        _collect_and_freeze("before stream")  # small: only what is newer than the last freeze
    if _after_pass not in gc.callbacks:
        gc.callbacks.append(_after_pass)


def stream_ended() -> None:
    """A reply ended: after the last one, collect what the streams left and freeze the rest."""
    global _streams
    _streams = max(0, _streams - 1)
    if not _streams and gc.isenabled():
        _collect_and_freeze("after stream")


def release() -> None:
    """Unfreeze and collect everything (after the conversation was cleared or replaced)."""
    if _streams or not gc.isenabled():
        return
    gc.unfreeze()
    _collect_and_freeze("release")


def streaming() -> bool:
    """Whether a reply is streaming now."""
    return _streams > 0
