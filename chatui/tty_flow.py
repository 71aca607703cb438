"""Ctrl+Q and Ctrl+S typed while the chat starts reach the app, not the terminal driver.

Until Textual puts the terminal in raw mode (0.6-1.0 s after the start on this project's
machine), the terminal driver's software flow control (IXON) takes Ctrl+Q and Ctrl+S as XON
and XOFF and never passes them on: a Ctrl+Q typed then was lost, and the app went on running
(seen in tmux: Ctrl+Q sent 0.1, 0.3 or 0.6 s after the start left chatui open every time). So
the chat clears IXON as soon as it knows it is the chat, the keys wait in the terminal with the
others typed early (``early_input``), and IXON is set again when the process ends (Textual
puts back the settings it found, which are the cleared ones).
"""

from __future__ import annotations

import atexit
import sys
import termios


def keep_flow_keys() -> bool:
    """Clear IXON on standard input while this process runs, when it is a terminal that has
    it set; returns whether it did (then it is set again at exit)."""
    try:
        fd = sys.__stdin__.fileno()  # type: ignore[union-attr]
        attrs = termios.tcgetattr(fd)
    except (AttributeError, OSError, ValueError, termios.error):
        return False  # not a terminal, or no standard input
    if not attrs[0] & termios.IXON:
        return False
    attrs[0] &= ~termios.IXON
    try:
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    except (OSError, termios.error):
        return False
    atexit.register(_set_ixon_again, fd)
    return True


def _set_ixon_again(fd: int) -> None:
    """IXON back on, the terminal's other settings as they are now (never raises: the
    terminal may be gone)."""
    try:
        attrs = termios.tcgetattr(fd)
        attrs[0] |= termios.IXON
        termios.tcsetattr(fd, termios.TCSANOW, attrs)
    except (OSError, ValueError, termios.error):
        pass
