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

A paste that holds ESC (text copied from a coloured terminal: ``ls --color``, a log, a
diff) is pasted whole. Textual 8.2.8's parser ended a bracketed paste's text at its first ESC
and read everything after it as keys, typed after the pasted part (seen in tmux: "colour
codes: \\e[31mred\\e[0m and done /clear" pasted as "^[31mred^[0m and done /clearcolour
codes: "; a pasted line break after an ESC would have sent the message). :func:`paste_whole`
hands the parser a paste's ESC bytes as ``␛`` (U+241B, how chatui shows control characters)
and only the paste's closing sequence as ESC, then takes the colour and other CSI sequences
out of the pasted text: the text as it was seen on the terminal.

Patches ``XTermParser._sequence_to_key_events`` and ``XTermParser.feed`` where the gate allows
(see :mod:`.gate`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

from .gate import ENABLED

ESC = "\x1b"
SHOWN_ESC = "\u241b"
"""What an ESC inside a paste is handed on as (``safe_text`` shows ESC so too)."""
PASTE_START = "\x1b[200~"
PASTE_END = "\x1b[201~"
_CSI_IN_PASTE = re.compile("\u241b\\[[0-?]*[ -/]*[@-~]")
"""A CSI sequence (colours, cursor moves) in pasted text, its ESC already shown as ``␛``."""
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


class _PasteState:
    """Where a parser's input stands: inside a paste or not, and the characters held back
    because they may begin the paste's closing sequence (or, outside, its opening one)."""

    __slots__ = ("inside", "held", "opening")

    def __init__(self) -> None:
        self.inside = False
        self.held = ""  # inside: a prefix of PASTE_END, not yet handed on
        self.opening = 0  # outside: how much of PASTE_START the input has just matched


def _mark_paste_escapes(state: _PasteState, data: str) -> str:
    """``data`` as the parser should see it: ESC inside a paste as ``␛``, except the ESC that
    closes it. Handles the markers split over several reads (a large paste arrives in
    pieces); outside a paste nothing is held back or changed (Esc's timing is the parser's)."""
    out: list[str] = []
    for c in data:
        if not state.inside:
            out.append(c)
            if c == PASTE_START[state.opening]:
                state.opening += 1
                if state.opening == len(PASTE_START):
                    state.inside, state.opening = True, 0
            else:
                state.opening = 1 if c == ESC else 0
            continue
        if state.held or c == ESC:
            if c == ESC and state.held:  # the one held was no closing sequence
                out.append(SHOWN_ESC + state.held[1:])
                state.held = ""
            state.held += c
            if state.held == PASTE_END:
                out.append(PASTE_END)
                state.held, state.inside = "", False
            elif not PASTE_END.startswith(state.held):
                out.append(SHOWN_ESC + state.held[1:])
                state.held = ""
            continue
        out.append(c)
    return "".join(out)


def paste_whole(original: Callable[..., Iterable[Any]]) -> Callable[..., Iterable[Any]]:
    """``Parser.feed`` (``original``) passing a paste's ESC bytes on as text (see above), its
    Paste events without the CSI sequences they held."""
    from textual import events

    def feed(self: Any, data: str) -> Iterable[Any]:
        state = self.__dict__.get("_chatui_paste")
        if state is None:
            state = self.__dict__["_chatui_paste"] = _PasteState()
        marked = _mark_paste_escapes(state, data) if data else data
        if data and not marked:  # all held back ("" would be the end of the input)
            return
        for event in original(self, marked):
            if isinstance(event, events.Paste) and SHOWN_ESC in event.text:
                event = events.Paste(_CSI_IN_PASTE.sub("", event.text))
            yield event

    return feed


_original_feed: Callable[..., Iterable[Any]] | None = None


def unpatched() -> Callable[..., Iterable[Any]]:
    """Textual's own ``XTermParser._sequence_to_key_events``, patched or not."""
    from textual._xterm_parser import XTermParser

    return _original if _original is not None else XTermParser._sequence_to_key_events


def unpatched_feed() -> Callable[..., Iterable[Any]]:
    """Textual's own ``XTermParser.feed``, patched or not."""
    from textual._xterm_parser import XTermParser

    return _original_feed if _original_feed is not None else XTermParser.feed


def apply() -> bool:
    """Patch the parser (idempotent); whether it is patched."""
    global _original, _original_feed
    if not ENABLED:
        return False
    if _original is not None:
        return True
    try:
        from textual._xterm_parser import XTermParser

        _original = XTermParser._sequence_to_key_events
        _original_feed = XTermParser.feed
    except (ImportError, AttributeError):
        return False
    patched_keys = split_escape_keys(_original)
    XTermParser._sequence_to_key_events = patched_keys  # type: ignore[method-assign]
    XTermParser.feed = paste_whole(_original_feed)  # type: ignore[method-assign]
    return True
