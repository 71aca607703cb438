"""The token view: a reply's tokens coloured on the theme's heat scale, with a token cursor.

Work per token is bounded: tokens are grouped into display units (a glyph made of several
tokens is one unit), units into chunks of about a paragraph, and only chunks that changed are
re-rendered, at most :data:`REFRESH_S` apart. A reply of any length therefore costs the same
per token as a short one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content, Span
from textual.reactive import reactive
from textual.style import Style
from textual.widgets import Static

from inference.types import Token
from themes import heat_bin

from ..messages import AlternativeChosen, TokenSelected
from .text import safe_text

REFRESH_S = 0.08
"""Smallest interval between two renders of the same view (12.5 per second)."""
CHUNK_SOFT = 60
"""A chunk ends at the first line break after this many units..."""
CHUNK_HARD = 240
"""...or at this many units in any case."""


@dataclass
class TokenUnit:
    """What the cursor moves over: one token, or the tokens of one multi-token glyph."""

    start: int
    """Position of its first token in the reply's token list."""
    end: int
    """Position of its last token (inclusive)."""
    text: str
    """The text to display (safe: control characters made visible)."""
    logprob: float | None
    """The lowest logprob among its tokens (a glyph is as surprising as its least likely part)."""


class UnitBuilder:
    """Turns a growing token list into display units, incrementally.

    In the normal view special tokens are skipped and tokens with empty text wait for the token
    that completes their glyph. In the raw view every token is a unit showing ``Token.raw``.
    """

    def __init__(self, raw: bool = False) -> None:
        self.raw = raw
        self._pending: list[tuple[int, float | None]] = []  # (position, logprob)

    def feed(self, tokens: Sequence[Token], offset: int) -> list[TokenUnit]:
        """Units completed by ``tokens`` (which sit at ``offset`` in the reply's list)."""
        out: list[TokenUnit] = []
        for i, tok in enumerate(tokens):
            pos = offset + i
            if self.raw:
                text = tok.raw or tok.text.replace("\n", "↵\n")
                out.append(TokenUnit(pos, pos, safe_text(text), tok.logprob))
                continue
            if tok.special:
                continue
            if not tok.text:
                self._pending.append((pos, tok.logprob))
                continue
            start = self._pending[0][0] if self._pending else pos
            if tok.glyph_start is not None:
                start = min(start, tok.glyph_start)
            lps = [lp for _, lp in self._pending if lp is not None]
            if tok.logprob is not None:
                lps.append(tok.logprob)
            self._pending.clear()
            out.append(TokenUnit(start, pos, safe_text(tok.text), min(lps) if lps else None))
        return out


def build_units(tokens: Sequence[Token], raw: bool = False) -> list[TokenUnit]:
    """All display units of a token list (see :class:`UnitBuilder`)."""
    return UnitBuilder(raw).feed(tokens, 0)


class TokenChunk(Static):
    """A run of units rendered as one wrapped text (one widget per paragraph or so)."""

    DEFAULT_CSS = """
    TokenChunk { height: auto; width: 1fr; }
    """


class TokenView(Vertical, can_focus=True):
    """A reply's tokens on the heat scale, with a keyboard and mouse token cursor.

    The parent sets ``tokens`` (the reply's list, shared) and calls :meth:`sync` when it grew;
    the view posts :class:`TokenSelected` when the cursor moves and :class:`AlternativeChosen`
    for the digit keys.
    """

    DEFAULT_CSS = """
    TokenView { height: auto; padding: 0 1; }
    TokenView:focus { background: $boost; }
    """

    BINDINGS = [
        Binding("left", "move(-1)", "Prev token", show=False),
        Binding("right", "move(1)", "Next token", show=False),
        Binding("up", "move(-10)", "Back 10", show=False),
        Binding("down", "move(10)", "Forward 10", show=False),
        Binding("home", "jump(0)", "First token", show=False),
        Binding("end", "jump(-1)", "Last token", show=False),
        Binding("n", "least_likely", "Least likely", tooltip="Jump to the least likely token"),
        *[Binding(str(k), f"choose({k})", f"Continue with alternative {k}", show=False)
          for k in range(1, 10)],
    ]

    cursor: reactive[int | None] = reactive(None, init=False, always_update=True)
    """Selected unit index, or None."""

    def __init__(self, tokens: list[Token], *, raw: bool = False, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.tokens = tokens
        self.raw = raw
        self.units: list[TokenUnit] = []
        self._builder = UnitBuilder(raw)
        self._seen = 0
        self._chunk_starts: list[int] = [0]
        self._chunks: list[TokenChunk] = []
        self._dirty: set[int] = set()
        self._last_render = 0.0
        self._timer_pending = False
        self.owner_id = ""
        """The id of the reply view this belongs to (sent in messages)."""

    # ---- data in ----

    def sync(self) -> None:
        """Take the tokens appended to ``tokens`` since the last call."""
        new = self.tokens[self._seen:]
        if not new:
            return
        units = self._builder.feed(new, self._seen)
        self._seen = len(self.tokens)
        for unit in units:
            self.units.append(unit)
            self._dirty.add(len(self._chunk_starts) - 1)
            size = len(self.units) - self._chunk_starts[-1]
            if size >= CHUNK_HARD or (size >= CHUNK_SOFT and unit.text.endswith("\n")):
                self._chunk_starts.append(len(self.units))
        self._schedule()

    def reset(self, raw: bool | None = None) -> None:
        """Rebuild every unit from ``tokens`` (after a raw toggle or a replaced reply)."""
        if raw is not None:
            self.raw = raw
        self._builder = UnitBuilder(self.raw)
        self.units = []
        self._seen = 0
        self._chunk_starts = [0]
        self._dirty = set(range(len(self._chunks)))
        self.cursor = None
        self.sync()
        self._dirty.update(range(len(self._chunks)))
        self._schedule()

    # ---- rendering ----

    def _schedule(self) -> None:
        if self._timer_pending or not self.is_mounted:
            return
        delay = max(0.0, self._last_render + REFRESH_S - time.monotonic())
        self._timer_pending = True
        self.set_timer(max(delay, 0.001), self.flush)

    def flush(self) -> None:
        """Render the chunks that changed (called by the refresh timer)."""
        self._timer_pending = False
        if not self.display:
            return  # hidden views render when shown
        self._last_render = time.monotonic()
        count = len(self._chunk_starts)
        if len(self.units) == self._chunk_starts[-1] and count > 1:
            count -= 1  # the last chunk is empty so far
        new_widgets = []
        while len(self._chunks) < count:
            chunk = TokenChunk()
            self._chunks.append(chunk)
            new_widgets.append(chunk)
            self._dirty.add(len(self._chunks) - 1)
        for index in sorted(self._dirty):
            if index < len(self._chunks):
                content = self.render_chunk(index) if index < count else Content("")
                self._chunks[index].update(content)
        self._dirty.clear()
        if new_widgets:
            self.mount_all(new_widgets)

    def on_show(self) -> None:
        self._dirty.update(range(len(self._chunk_starts)))
        self._schedule()

    def render_chunk(self, index: int) -> Content:
        """The text of chunk ``index`` with a heat colour and a mouse target per unit."""
        start = self._chunk_starts[index]
        end = (self._chunk_starts[index + 1] if index + 1 < len(self._chunk_starts)
               else len(self.units))
        parts: list[str] = []
        spans: list[Span] = []
        pos = 0
        cursor = self.cursor
        for ui in range(start, end):
            unit = self.units[ui]
            text = unit.text
            prob = None if unit.logprob is None else _exp(unit.logprob)
            style = f"$heat-{heat_bin(prob)}"
            if ui == cursor:
                style += " reverse bold"
                if text.strip() == "":
                    text = text.replace("\n", "↵\n").replace(" ", "·") or "·"
            if not text:
                continue
            parts.append(text)
            spans.append(Span(pos, pos + len(text), style))
            spans.append(Span(pos, pos + len(text), Style.from_meta({"unit": ui})))
            pos += len(text)
        return Content("".join(parts), spans)

    def _chunk_of(self, unit: int) -> int:
        import bisect

        return bisect.bisect_right(self._chunk_starts, unit) - 1

    # ---- cursor ----

    def watch_cursor(self, old: int | None, new: int | None) -> None:
        for u in (old, new):
            if u is not None and 0 <= u < len(self.units):
                self._dirty.add(self._chunk_of(u))
        self.flush()
        if new is not None:
            chunk = self._chunk_of(new)
            if chunk < len(self._chunks):
                self._chunks[chunk].scroll_visible(animate=False)
            self.post_message(TokenSelected(self.owner_id, new))

    def action_move(self, delta: int) -> None:
        if not self.units:
            return
        if self.cursor is None:
            self.cursor = 0 if delta > 0 else len(self.units) - 1
        else:
            self.cursor = max(0, min(len(self.units) - 1, self.cursor + delta))

    def action_jump(self, where: int) -> None:
        if self.units:
            self.cursor = where % len(self.units)

    def action_least_likely(self) -> None:
        cands = [(u.logprob, i) for i, u in enumerate(self.units) if u.logprob is not None]
        if cands:
            self.cursor = min(cands)[1]

    def action_choose(self, rank: int) -> None:
        if self.cursor is None or self.cursor >= len(self.units):
            self.app.bell()
            return
        self.post_message(AlternativeChosen(self.owner_id, self.units[self.cursor].start, rank))

    def on_click(self, event: events.Click) -> None:
        unit = event.style.meta.get("unit")
        if unit is not None:
            self.focus()
            self.cursor = int(unit)

    def on_focus(self) -> None:
        if self.cursor is None and self.units:
            self.cursor = len(self.units) - 1


def _exp(x: float) -> float:
    import math

    return math.exp(x)
