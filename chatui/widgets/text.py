"""Helpers that make model output safe to show and easy to copy.

Model output and loaded text are data: they are never parsed as Textual markup (we build
:class:`~textual.content.Content` from plain strings), and terminal control characters are
replaced by visible symbols so an ANSI escape in a reply is shown, never obeyed.
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # ␛ for ESC, etc.
    if code == 0x7F:
        return "␡"
    return f"\\x{code:02x}"


def safe_text(text: str) -> str:
    """``text`` with control characters (ANSI escapes, bells, C1 codes) made visible.

    Newlines and tabs are kept; a carriage return is shown as ␍ so it cannot overwrite a line.
    """
    return _CONTROL.sub(_visible, text)


_FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)(?:^\1[ \t]*$|\Z)", re.S | re.M)


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced code blocks of a Markdown text, in order (an unclosed last
    fence counts)."""
    return [m.group(2).rstrip("\n") for m in _FENCE.finditer(markdown)]


def shorten(text: str, width: int) -> str:
    """One line of at most ``width`` characters (with an ellipsis when cut)."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: max(0, width - 1)] + "…"


def tokens_label(n: int) -> str:
    """"1 token", "2 tokens"."""
    return f"{n} token" + ("" if n == 1 else "s")


def messages_label(n: int) -> str:
    """"1 message", "2 messages"."""
    return f"{n} message" + ("" if n == 1 else "s")


def shorten_around(text: str, width: int, mark: str = "[") -> str:
    """One line of at most ``width`` characters that keeps the first ``mark`` and a little
    after it in view (a search hit's snippet, its words found shown as ``[word]``): cut at the
    end as :func:`shorten` does, or at both ends where the mark lies past the cut."""
    line = " ".join(text.split())
    at = line.find(mark)
    if len(line) <= width or at < 0 or at < width * 2 // 3:
        return shorten(line, width)
    start = min(at - width // 3, len(line) - (width - 1))
    body = line[start + 1:]
    return "…" + (body if len(body) <= width - 1 else body[:width - 2] + "…")


def show_token(text: str) -> str:
    """A token's text for a label: quoted, whitespace made visible; in double quotes when it
    holds a single one and no double one, as Python's repr does (the token ``('`` read
    ``'(''``)."""
    shown = safe_text(text).replace("\n", "↵").replace("\t", "⇥")
    quote = '"' if "'" in shown and '"' not in shown else "'"
    return quote + shown + quote


def show_prob(prob: float, digits: int = 1) -> str:
    """A probability as a percentage that never reads 0 for a token that was chosen: below
    what ``digits`` decimals can show it keeps two significant digits ("0.0017%"; a sampled
    token 1.7e-5 likely read "0.0%"), under 1e-6 a plain number ("2.1e-07"), and an exact 0
    stays "0%"."""
    if prob <= 0:
        return "0%"
    if prob * 100 >= 10 ** -digits:
        return f"{prob:.{digits}%}"
    return f"{prob * 100:.2g}%" if prob >= 1e-6 else f"{prob:.1e}"
