"""Whether the chat can open where ``chatui`` was started: its window needs a terminal on both
standard input and standard output. Text piped in is answered as ``chatui generate`` answers it
(``echo TEXT | chatui``, as ollama's ``run`` does); anything else without a terminal is refused
in one sentence. Without this a chat started from a pipe or a script drew its escape codes into
the pipe and spun on a CPU core until killed (the tests' runs of it waited for a timeout)."""

from __future__ import annotations

import os
import stat
import sys
from typing import IO, Any

SERVED = "TEXTUAL_DRIVER"
"""Set where something else draws the app (``textual serve``'s web driver): no terminal needed."""


def _mode(stream: IO[Any]) -> int | None:
    try:
        return os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError, AttributeError):  # (closed, or no file behind it)
        return None


def _is_terminal(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError, AttributeError):
        return False


def piped_input() -> bool:
    """Whether standard input brings text from a pipe, a file or a socket (not a terminal,
    and not /dev/null or nothing at all)."""
    if os.environ.get(SERVED) or _is_terminal(sys.stdin):
        return False
    mode = _mode(sys.stdin)
    return mode is not None and (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)
                                 or stat.S_ISSOCK(mode))


def no_terminal() -> str | None:
    """Why the chat's window cannot open here, as the end of a sentence (None: it can)."""
    if os.environ.get(SERVED):
        return None
    for name, stream in (("input", sys.stdin), ("output", sys.stdout)):
        if not _is_terminal(stream):
            return f"standard {name} is not a terminal"
    return None
