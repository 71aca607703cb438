"""Autosaving off the event loop.

Saving a transcript serialises, checks and fsyncs the whole conversation: about 100 ms for
three replies of 2,000 tokens with their alternatives, growing with the conversation. Done on
the event loop after every reply, that froze the app for as long (a keypress answered in
55 ms). :class:`Autosaver` takes a snapshot of the conversation on the loop (a copy of its
lists, well under a millisecond) and writes it on a thread of its own; a newer snapshot of the
same conversation replaces one not yet written, and :meth:`Autosaver.flush` waits for the
writes (before quitting, listing the saved conversations, or an explicit ``/save``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from . import transcript
from .conversation import Conversation

log = logging.getLogger(__name__)


class Autosaver:
    """Writes conversations' autosaves on its own thread, newest snapshot first."""

    def __init__(self, on_error: Callable[[Exception], None]) -> None:
        """``on_error`` is called on the writer's thread with what a save raised."""
        self._on_error = on_error
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, Path | None], Conversation] = {}
        self._busy = False
        self._thread: threading.Thread | None = None

    def save(self, conv: Conversation, directory: Path | None) -> None:
        """Queue a save of ``conv`` as it is now (to :func:`transcript.autosave_path`)."""
        snapshot = conv.snapshot()
        with self._cond:
            self._pending[(conv.id, directory)] = snapshot
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="chatui-autosave",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued save is written; False if ``timeout`` ran out first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                key, conv = next(iter(self._pending.items()))
                del self._pending[key]
                self._busy = True
            try:
                transcript.autosave(conv, key[1])
            except Exception as exc:  # noqa: BLE001 - reported; saving never ends the chat
                log.exception("autosave failed")
                self._on_error(exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
