"""Keys typed before the terminal left line mode, told apart from later ones.

Until Textual puts the terminal in raw mode, the terminal driver keeps what is typed as a line
and turns its Enter into a line feed, which arrives as Ctrl+J (the prompt's newline key). The
app holds every key until the prompt box exists and turns those line feeds back into Enter
(``ChatApp.on_input_ready``). Textual's input thread reads the terminal on its own schedule,
though: when it read the held bytes only after the prompt box existed (seen once in a full
test run, and in every run with the input thread's start delayed by 1.5 s), the message typed
at start got a newline instead of being sent. So the app hands the held keys over only once
the terminal has nothing left unread and has stayed so for ``QUIET_S``, polling every
``POLL_S``, for ``MAX_S`` at most (an input thread that stopped reading must not hold the keys
for ever).
"""

from __future__ import annotations

import fcntl
import struct
import sys
import termios

POLL_S = 0.02
QUIET_S = 0.1
MAX_S = 3.0


def unread_bytes() -> int:
    """How many bytes typed into the terminal (standard input) nobody has read yet; 0 where
    that cannot be told (not a terminal, no standard input)."""
    try:
        fd = sys.__stdin__.fileno()  # type: ignore[union-attr]
        raw = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
    except (AttributeError, OSError, ValueError):
        return 0
    return max(0, struct.unpack("i", raw)[0])


class QuietWatch:
    """Whether the terminal has been quiet (nothing unread) for ``QUIET_S``, or ``MAX_S`` have
    passed since the first look: ``settled(now)`` at each poll."""

    def __init__(self) -> None:
        self._first: float | None = None
        self._quiet_since: float | None = None

    def settled(self, now: float, unread: int) -> bool:
        if self._first is None:
            self._first = now
        if unread:
            self._quiet_since = None
        elif self._quiet_since is None:
            self._quiet_since = now
        quiet = self._quiet_since is not None and now - self._quiet_since >= QUIET_S
        return quiet or now - self._first >= MAX_S
