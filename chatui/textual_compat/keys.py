"""Esc followed quickly by a key: both keys, never a lost Esc or a stray "^".

A terminal sends Esc as the byte ESC, and Alt+key as ESC followed by the key, so Textual's
input parser waits ``ESCAPE_DELAY`` (0.1 s) after an ESC to tell them apart. In Textual 8.2.8
(``XTermParser.parse`` and ``_sequence_to_key_events``, both private) a key typed within that
time after Esc loses the Esc: ESC "/" arrives as "/" alone, ESC Enter as Enter (so Alt+Enter,
the prompt's newline in terminals that send it as ESC CR, sent the message), and when a third
key follows as quickly the Esc is typed as "^" (seen in tmux: "^/compare off" after Esc, and a
search box that took "/export md" instead of closing). chatui binds no Alt+letter, so ESC and
a printable character is read as Esc and that character at once; ESC CR is Alt+Enter. The
two-byte sequences Textual knows (ESC b / f: word left / right, ESC DEL: delete a word, the
macOS Option characters) keep their meaning, and ESC "[", "O", "]", "P", "_" and "\\" stay the
starts of the terminal's own sequences (keys, mouse, paste, reports).

Patches ``XTermParser._sequence_to_key_events`` where the gate allows (see :mod:`.gate`).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from .gate import ENABLED

ESC = "\x1b"
SEQUENCE_STARTS = frozenset("[O]P_\\^")
"""Characters that begin a terminal sequence after ESC (CSI, SS3, OSC, DCS, APC, ST, PM)."""

_original: Callable[..., Iterable[Any]] | None = None


def split_escape_keys(original: Callable[..., Iterable[Any]]) -> Callable[..., Iterable[Any]]:
    """``XTermParser._sequence_to_key_events`` (``original``) reading ESC and a key as both."""
    from textual import events
    from textual._ansi_sequences import ANSI_SEQUENCES_KEYS

    def sequence_to_key_events(self: Any, sequence: str, alt: bool = False) -> Iterable[Any]:
        if len(sequence) == 2 and sequence[0] == ESC and sequence not in ANSI_SEQUENCES_KEYS:
            key = sequence[1]
            if key == "\r":
                yield events.Key("alt+enter", None)
                return
            if key.isprintable() and key not in SEQUENCE_STARTS:
                yield events.Key("escape", ESC)
                yield from original(self, key)
                return
        if alt and len(sequence) == 1 and sequence.isprintable():
            # (ESC and a sequence start that led nowhere, reissued after the wait)
            yield events.Key("escape", ESC)
            yield from original(self, sequence)
            return
        yield from original(self, sequence, alt)

    return sequence_to_key_events


def unpatched() -> Callable[..., Iterable[Any]]:
    """Textual's own ``XTermParser._sequence_to_key_events``, patched or not."""
    from textual._xterm_parser import XTermParser

    return _original if _original is not None else XTermParser._sequence_to_key_events


def apply() -> bool:
    """Patch the parser (idempotent); whether it is patched."""
    global _original
    if not ENABLED:
        return False
    if _original is not None:
        return True
    try:
        from textual._xterm_parser import XTermParser

        _original = XTermParser._sequence_to_key_events
    except (ImportError, AttributeError):
        return False
    patched = split_escape_keys(_original)
    XTermParser._sequence_to_key_events = patched  # type: ignore[method-assign]
    return True
