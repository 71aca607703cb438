"""The token view: a reply's tokens coloured on the theme's heat scale, with a token cursor.

Work per token is bounded, whatever the length of the reply:

- tokens become display units incrementally (a glyph made of several tokens is one unit);
- units are wrapped into lines incrementally: wrapping is greedy, so appending units only
  extends the last line or adds lines, and earlier lines never change (a resize re-wraps once);
- the view draws through Textual's line API (:meth:`TokenView.render_line`): only the lines on
  screen are rendered, each once into a cached :class:`~textual.strip.Strip`, and appending
  invalidates only the tail line;
- the view redraws at most every :data:`REFRESH_S`, and asks for a new layout only when its
  height changed; while a reply streams it grows in steps of several lines
  (:class:`~chatui.widgets.settled.GrowsInSteps`), so most new lines are only a repaint.
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

from rich.cells import cell_len
from rich.segment import Segment
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.selection import Selection
from textual.strip import Strip
from textual.style import Style
from textual.widget import Widget

from inference.types import Token
from themes import heat_bin

from ..token_records import TokenRecords

from ..messages import AlternativeChosen, FanOutRequested, TokenSelected
from .settled import GrowsInSteps, SettledSize, round_up
from .selection import with_selection
from .text import safe_text

_REASONING_STYLE = Style(italic=True)
"""Reasoning tokens are drawn in italics on the same heat scale."""
REFRESH_S = 0.1
"""Smallest interval between two redraws of the same view while streaming (10 per second)."""
LINE_CACHE = 512
"""Rendered lines kept per view (those on screen and around it)."""


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
    reasoning: bool = False
    """Part of the reply's reasoning (drawn in italics)."""


class UnitBuilder:
    """Turns a growing token list into display units, incrementally.

    In the normal view special tokens are skipped and tokens with empty text wait for the token
    that completes their glyph. In the raw view every token is a unit showing ``Token.raw``.
    """

    def __init__(self, raw: bool = False) -> None:
        self.raw = raw
        self._pending: list[tuple[int, float | None]] = []  # (position, logprob)

    def feed(self, tokens: TokenRecords, start: int) -> list[TokenUnit]:
        """Units completed by the tokens from position ``start`` on (read column by column:
        no :class:`Token` is made)."""
        out: list[TokenUnit] = []
        for pos in range(start, len(tokens)):
            logprob = tokens.logprob_at(pos)
            if self.raw:
                text = tokens.raw_at(pos) or tokens.text_at(pos).replace("\n", "↵\n")
                out.append(TokenUnit(pos, pos, safe_text(text), logprob,
                                     tokens.is_reasoning(pos)))
                continue
            if tokens.is_special(pos):
                continue
            text = tokens.text_at(pos)
            if not text:
                self._pending.append((pos, logprob))
                continue
            first = self._pending[0][0] if self._pending else pos
            glyph = tokens.glyph_start_at(pos)
            if glyph is not None:
                first = min(first, glyph)
            lps = [lp for _, lp in self._pending if lp is not None]
            if logprob is not None:
                lps.append(logprob)
            self._pending.clear()
            out.append(TokenUnit(first, pos, safe_text(text), min(lps) if lps else None,
                                 tokens.is_reasoning(pos)))
        UnitBuilder.built += len(out)
        return out

    built = 0
    """Units made by every builder (a count of work, for tests: toggling views must not
    rebuild every reply's units)."""


def build_units(tokens: Sequence[Token], raw: bool = False) -> list[TokenUnit]:
    """All display units of a token list (see :class:`UnitBuilder`)."""
    records = tokens if isinstance(tokens, TokenRecords) else TokenRecords(tokens)
    return UnitBuilder(raw).feed(records, 0)


class Piece(NamedTuple):
    """A part of one unit on one line."""

    unit: int
    """Index of the unit."""
    text: str
    """The part of the unit's text on this line (tabs expanded, no newline)."""
    newline: bool
    """The unit's text breaks the line after this part."""


@dataclass
class _Line:
    pieces: list[Piece] = field(default_factory=list)
    width: int = 0
    """Cells used."""


class LineWrapper:
    """Greedy wrapping of units into lines of ``width`` cells, one unit at a time.

    A unit goes on the current line if it fits, else on a new line; a unit wider than a line is
    cut at character boundaries (double-width characters are never split); a newline in a unit
    ends the line. A unit that starts with a space and does not fit leaves the space at the end
    of the line (the next line starts with the rest; on a full line the space hangs one cell
    past the width, where drawing crops it), so nothing is dropped: the lines joined give the text back, and every unit has a piece to
    click and to select. Because the wrapping is greedy, adding units never changes the lines
    before the last one.
    """

    def __init__(self, width: int) -> None:
        self.width = max(1, width)
        self.lines: list[_Line] = [_Line()]
        self.first_unit: list[int] = [0]
        """Index of the first unit that has a piece on each line (for the cursor's line)."""

    def _new_line(self, unit: int) -> _Line:
        line = _Line()
        self.lines.append(line)
        self.first_unit.append(unit)
        return line

    def add(self, index: int, text: str) -> None:
        """Append unit ``index`` with ``text``."""
        width = self.width
        line = self.lines[-1]
        if not line.pieces:
            self.first_unit[-1] = index
        parts = text.split("\n")
        for n, part in enumerate(parts):
            ends_line = n < len(parts) - 1
            if "\t" in part:
                part = part.expandtabs(4)
            size = cell_len(part)
            if line.width + size > width and line.width and size <= width:
                if part[0] == " ":
                    # wrap at the space, which ends this line (the text is kept: joined, the
                    # lines give it back, and the token keeps its space); on a full line it
                    # hangs one cell past the edge, where drawing crops it, as editors do,
                    # rather than starting the next line with a space
                    line.pieces.append(Piece(index, " ", False))
                    line.width += 1
                    part = part[1:]
                    size -= 1
                    line = self._new_line(index)
                else:  # take the start of the word along, if the word fits on a line
                    line = self._wrap_word(line, index, size)
            while line.width + size > width:  # longer than the room left: cut it
                room = width - line.width
                head, part = _cut(part, room)
                if not head and not line.pieces:
                    head, part = part[0], part[1:]  # a wide glyph on a 1-cell line
                if head:
                    line.pieces.append(Piece(index, head, False))
                    line.width += cell_len(head)
                line = self._new_line(index)
                size = cell_len(part)
            if part or ends_line:
                if not line.pieces:
                    self.first_unit[-1] = index
                line.pieces.append(Piece(index, part, ends_line))
                line.width += size
            if ends_line:
                line = self._new_line(index + 1)


    def _wrap_word(self, line: _Line, index: int, size: int) -> _Line:
        """A new line for unit ``index`` (``size`` cells, no leading space), with the pieces
        at the end of ``line`` that start its word moved along when the word fits."""
        moved: list[Piece] = []
        cells = size
        for k in range(len(line.pieces) - 1, -1, -1):
            piece = line.pieces[k]
            cut = max(piece.text.rfind(" "), piece.text.rfind("\t"))
            tail = piece.text[cut + 1:]
            cells += cell_len(tail)
            if cells > self.width:
                moved = []
                break
            if tail:
                moved.insert(0, Piece(piece.unit, tail, False))
            if cut >= 0:  # the word starts in this piece
                del line.pieces[k + 1:]
                if cut + 1 < len(piece.text):
                    line.pieces[k] = Piece(piece.unit, piece.text[:cut + 1], False)
                break
        else:
            moved = []  # the whole line is one word: break between units
        if moved:
            line.width -= sum(cell_len(p.text) for p in moved)
        new = self._new_line(moved[0].unit if moved else index)
        new.pieces.extend(moved)
        new.width = sum(cell_len(p.text) for p in moved)
        return new


def _cut(text: str, cells: int) -> tuple[str, str]:
    """Split ``text`` after at most ``cells`` cells."""
    used = 0
    for i, ch in enumerate(text):
        used += cell_len(ch)
        if used > cells:
            return text[:i], text[i:]
    return text, ""


def _records(tokens: Sequence[Token]) -> TokenRecords:
    """Own columns for ``tokens`` (a copy: the view never shares the reply's)."""
    return tokens.copy() if isinstance(tokens, TokenRecords) else TokenRecords(tokens)


def wrap_units(units: Sequence[TokenUnit], width: int) -> LineWrapper:
    """All units wrapped at ``width`` (see :class:`LineWrapper`)."""
    wrapper = LineWrapper(width)
    for i, unit in enumerate(units):
        if unit.text:
            wrapper.add(i, unit.text)
    return wrapper


class TokenView(GrowsInSteps, SettledSize, Widget, can_focus=True):
    """A reply's tokens on the heat scale, with a keyboard and mouse token cursor.

    The view keeps its own list of the tokens it shows (never the reply's list): the parent
    hands it tokens with :meth:`append` (or all of them anew with :meth:`set_tokens`) and calls
    :meth:`sync` to turn what was appended into units; the view posts :class:`TokenSelected`
    when the cursor moves and :class:`AlternativeChosen` for the digit keys.

    A view that is not shown (``active`` False, see :meth:`set_active`) keeps no units, lines
    or strips, only its tokens in columns (issue 21: a hidden view of a ~330-token reply kept
    ~2,700 objects). Shown again, it makes its units when it is first drawn or asked for them;
    its height at a width it was wrapped at before is remembered (one number), so showing the
    token view of a long conversation lays out every reply without building them all: only
    the replies drawn build units (toggling Ctrl+T costs the screen's worth, not the
    conversation's).
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
        Binding("f", "fan_out", "Fan out", show=False,
                tooltip="Decode the top alternatives at this token as branches, side by side"),
        *[Binding(str(k), f"choose({k})", f"Continue with alternative {k}", show=False)
          for k in range(1, 10)],
    ]

    cursor: reactive[int | None] = reactive(None, init=False, always_update=True)
    forks: frozenset[int] = frozenset()
    """Token positions where a branch of the conversation leaves this reply (issue 18):
    underlined."""
    """Selected unit index, or None."""

    def __init__(self, tokens: Sequence[Token] = (), *, raw: bool = False,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.tokens: TokenRecords = _records(tokens)
        """The tokens shown (this view's own columns)."""
        self.raw = raw
        self.active = True
        """Whether the view is shown, and so keeps units (see :meth:`set_active`)."""
        self._units: list[TokenUnit] = []
        self._heights: dict[tuple[int, bool], tuple[int, int]] = {}
        """Wrapped line count by (width, raw), with the token count it was for."""
        self._builder = UnitBuilder(raw)
        self._seen = 0
        self._wrapper: LineWrapper | None = None
        self._shown_lines = 0
        """Lines the last layout was given (a layout is asked for only when this changes)."""
        self._strips: LRUCache[int, Strip] = LRUCache(LINE_CACHE)
        self._strip_key: object = None
        self._heat: tuple[str, list[Style]] | None = None
        self._dirty_from: int | None = None
        self._last_render = 0.0
        self._timer_pending = False
        self._typing_away = False
        self.owner_id = ""
        """The id of the reply view this belongs to (sent in messages)."""

    # ---- data in ----

    def append(self, tokens: Sequence[Token]) -> None:
        """Take tokens appended to the reply; :meth:`sync` turns them into units."""
        self.tokens.extend(tokens)

    def set_tokens(self, tokens: Sequence[Token]) -> None:
        """Show ``tokens`` instead of what was shown (a reply whose tokens were replaced).

        The cursor stays on the token position it was on, if there still is one, and says so
        (:class:`TokenSelected`): after continuing from an alternative the side panel shows
        the chosen token, not the one it replaced (issue 14)."""
        position = None
        if self.cursor is not None and 0 <= self.cursor < len(self._units):
            position = self._units[self.cursor].start
        self.tokens = _records(tokens)
        self._heights.clear()
        self.reset()
        if position is not None and position < len(self.tokens) and self.active:
            units = self.units
            at = next((i for i, u in enumerate(units) if u.start <= position <= u.end), None)
            if at is not None:
                self.cursor = at

    def set_active(self, on: bool) -> None:
        """Shown (units are made when needed) or hidden (units, lines and strips go)."""
        if on == self.active:
            return
        self.active = on
        if not on:
            self._drop_units()
            self.cursor = None
        else:
            self._mark_dirty(0)

    def _drop_units(self) -> None:
        self._builder = UnitBuilder(self.raw)
        self._units = []
        self._seen = 0
        self._wrapper = None
        self._strips.clear()
        self._dirty_from = None

    @property
    def units(self) -> list[TokenUnit]:
        """The display units (made now if the view is shown and has not made them)."""
        if self.active and self._seen < len(self.tokens):
            self.sync(redraw=False)
        return self._units

    def _built(self) -> bool:
        return self._seen >= len(self.tokens)

    def sync(self, redraw: bool = True) -> None:
        """Take the tokens appended to ``tokens`` since the last call.

        With ``redraw`` the view redraws on its own timer (at most every REFRESH_S); without,
        the caller calls :meth:`flush` (a streaming reply does, on its frame clock). A hidden
        view makes no units."""
        if not self.active or self._seen >= len(self.tokens):
            return
        units = self._builder.feed(self.tokens, self._seen)
        self._seen = len(self.tokens)
        if not units:
            return
        first = len(self._units)
        self._units.extend(units)
        wrapper = self._wrapper
        if wrapper is not None:
            line = len(wrapper.lines) - 1
            for i, unit in enumerate(units, first):
                if unit.text:
                    wrapper.add(i, unit.text)
            self._mark_dirty(line)
        else:
            self._mark_dirty(0)  # wrapped at the next layout
        if redraw:
            self._schedule()

    def reset(self, raw: bool | None = None) -> None:
        """Rebuild every unit from ``tokens`` (after a raw toggle or a replaced reply)."""
        if raw is not None:
            self.raw = raw
        self._drop_units()
        self.cursor = None
        self.sync()
        self._dirty_from = 0
        self._schedule()

    @property
    def text(self) -> str:
        """The text shown (all units, as displayed)."""
        return "".join(u.text for u in self.units)

    def plain_lines(self) -> list[str]:
        """The wrapped lines as plain text (for tests and copying; a hidden view wraps its
        units for the call and keeps nothing)."""
        width = self._content_width()
        wrapper = self._wrap(width) if self.active else wrap_units(
            UnitBuilder(self.raw).feed(self.tokens, 0), width)
        return ["".join(p.text for p in line.pieces) for line in wrapper.lines]

    # ---- layout ----

    def _content_width(self) -> int:
        return self.content_region.width or self.size.width or 80

    def _wrap(self, width: int) -> LineWrapper:
        wrapper = self._wrapper
        if wrapper is None or wrapper.width != max(1, width) or not self._built():
            units = self.units
            wrapper = self._wrapper = wrap_units(units, width)
            self._strips.clear()
        return wrapper

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        """The wrapped lines, rounded up to a multiple of ``step`` while streaming (a view
        shown again whose units are not made yet answers from its remembered height)."""
        if not self.tokens:
            return 0
        known = self._heights.get((width, self.raw))
        if known is not None and known[0] == len(self.tokens) and not self._built():
            count = known[1]
        else:
            if not self.units:
                return 0
            count = self._line_count(self._wrap(width))
            self._heights = {(width, self.raw): (len(self.tokens), count)}
        self._shown_lines = round_up(count, self.step)
        return self._shown_lines

    @staticmethod
    def _line_count(wrapper: LineWrapper) -> int:
        lines = wrapper.lines
        return len(lines) - (1 if not lines[-1].pieces else 0)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    # ---- rendering ----

    def _mark_dirty(self, line: int) -> None:
        self._dirty_from = line if self._dirty_from is None else min(self._dirty_from, line)

    def _schedule(self) -> None:
        if self._timer_pending or not self.is_mounted:
            return
        delay = max(0.0, self._last_render + REFRESH_S - time.monotonic())
        self._timer_pending = True
        self.set_timer(max(delay, 0.001), self.flush)

    def flush(self) -> None:
        """Redraw what changed (called by the refresh timer; bounded work)."""
        self._timer_pending = False
        if not self.display or not self.is_mounted:
            return  # hidden views redraw when shown
        dirty, self._dirty_from = self._dirty_from, None
        if dirty is None:
            return
        self._last_render = time.monotonic()
        wrapper = self._wrapper
        if wrapper is None:
            self.refresh(layout=True)
            return
        count = self._line_count(wrapper)
        for y in range(dirty, len(wrapper.lines)):
            self._strips.discard(y)
        changed = Region(0, dirty, self.size.width, max(1, count - dirty))
        # taller (past the room of its step): the conversation needs a new layout; the lines
        # above ``dirty`` are unchanged and stay cached either way
        self.refresh(changed, layout=round_up(count, self.step) != self._shown_lines)

    def on_show(self) -> None:
        self._strips.clear()
        self.refresh(layout=True)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._heat = None

    def _heat_styles(self) -> list[Style]:
        theme = self.app.theme
        if self._heat is None or self._heat[0] != theme:
            self._heat = (theme, [Style.parse(f"$heat-{b}") for b in range(5)])
        return self._heat[1]

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.visual_style
        key = (width, base, self.app.theme)
        if key != self._strip_key:
            self._strip_key = key
            self._strips.clear()
        strip = self._strips.get(y)
        if strip is None:
            strip = self._render_strip(y, width, base)
            self._strips[y] = strip
        return with_selection(self, strip, y, self._line_text)

    def _line_text(self, y: int) -> str:
        wrapper = self._wrapper
        if wrapper is None or not 0 <= y < len(wrapper.lines):
            return ""
        return "".join(p.text for p in wrapper.lines[y].pieces)

    # ---- selection and copying ----

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The text under a mouse selection: lines broken by the wrapping join without a
        break (a space where a line broke ends that line), lines the text breaks with one."""
        wrapper = self._wrapper
        if wrapper is None:
            return None
        out: list[str] = []
        for y, line in enumerate(wrapper.lines):
            span = selection.get_span(y)
            if span is None:
                continue
            text = "".join(p.text for p in line.pieces)
            start, end = span
            out.append(text[start:] if end == -1 else text[start:end])
            if end == -1 and line.pieces and line.pieces[-1].newline:
                out.append("\n")
        return "".join(out), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()

    @property
    def selected_text(self) -> str:
        """What Ctrl+C copies here: a mouse selection in the view, else the token (or glyph)
        under the cursor as it is shown, with its leading space."""
        if self.text_selection is not None:
            found = self.get_selection(self.text_selection)
            if found is not None and found[0]:
                return found[0]
        if self.cursor is not None and 0 <= self.cursor < len(self.units):
            return self.units[self.cursor].text
        return ""

    def _render_strip(self, y: int, width: int, base: Style) -> Strip:
        wrapper = self._wrap(width)
        rich_base = base.rich_style
        if y >= len(wrapper.lines):
            return Strip.blank(width, rich_base)
        heat = self._heat_styles()
        cursor = self.cursor
        cursor_style = Style(reverse=True, bold=True)
        units = self.units
        segments: list[Segment] = []
        used = 0
        for piece in wrapper.lines[y].pieces:
            unit = units[piece.unit]
            text = piece.text
            # (no logprob: a server that sends none, a scored text's first token; no heat
            # colour then, where it took the "sure" one)
            style = base if unit.logprob is None else \
                base + heat[heat_bin(math.exp(unit.logprob))]
            if unit.reasoning:
                style += _REASONING_STYLE
            if self.forks and any(unit.start <= p <= unit.end for p in self.forks):
                style += Style(underline=True)
            if piece.unit == cursor:
                style += cursor_style
                if not unit.text.strip():  # make a whitespace unit visible (same width)
                    text = text.replace(" ", "·")
                    if piece.newline and used + cell_len(text) < width:
                        text += "↵"
            if text:
                segments.append(Segment(text, style.rich_style))
                used += cell_len(text)
        return Strip(segments, used).adjust_cell_length(width, rich_base).apply_offsets(0, y)

    def _lines_of(self, unit: int) -> range:
        """The lines on which unit ``unit`` has pieces."""
        wrapper = self._wrapper
        if wrapper is None:
            return range(0)
        first = bisect.bisect_right(wrapper.first_unit, unit) - 1
        first = max(0, first)
        while first > 0 and any(p.unit == unit for p in wrapper.lines[first - 1].pieces):
            first -= 1
        last = first
        while last + 1 < len(wrapper.lines) and any(
                p.unit == unit for p in wrapper.lines[last + 1].pieces):
            last += 1
        return range(first, last + 1)

    # ---- cursor ----

    def watch_cursor(self, old: int | None, new: int | None) -> None:
        width = self.size.width
        for u in (old, new):
            if u is not None and 0 <= u < len(self.units):
                for y in self._lines_of(u):
                    self._strips.discard(y)
                    self.refresh(Region(0, y, width, 1))
        if new is not None:
            lines = self._lines_of(new)
            if lines:
                self._scroll_lines_into_view(lines)
            self.post_message(TokenSelected(self.owner_id, new))

    def _scroll_lines_into_view(self, lines: range) -> None:
        """Scroll the nearest scrolling ancestor so that ``lines`` are on screen."""
        # the first ancestor that scrolls vertically (``is_scrollable`` is true of any
        # container: it found the reply view, which scrolls nothing; issue 14)
        container = next((a for a in self.ancestors if isinstance(a, Widget)
                          and a.styles.overflow_y in ("auto", "scroll")), None)
        if container is None:
            return
        window = container.scrollable_content_region
        top = self.content_region.y + lines.start
        bottom = top + len(lines)
        if top < window.y:
            delta = top - window.y
        elif bottom > window.bottom:
            delta = min(bottom - window.bottom, top - window.y)
        else:
            return
        container.scroll_to(y=container.scroll_y + delta, animate=False, immediate=True)

    def unit_at(self, x: int, y: int) -> int | None:
        """The unit drawn at content offset (``x``, ``y``), or None."""
        wrapper = self._wrapper
        if wrapper is None or not 0 <= y < len(wrapper.lines):
            return None
        used = 0
        for piece in wrapper.lines[y].pieces:
            used += cell_len(piece.text)
            if x < used:
                return piece.unit
        return None

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

    def action_fan_out(self) -> None:
        if self.cursor is None or self.cursor >= len(self.units):
            self.app.bell()
            return
        self.post_message(FanOutRequested(self.owner_id, self.units[self.cursor].start))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        unit = None if offset is None else self.unit_at(offset.x, offset.y)
        if unit is not None:
            self.focus()
            self.cursor = unit

    @property
    def type_into(self) -> Callable[[str, bool], None] | None:
        """Where typed text goes (``(text, submit)``): the ``type_into`` of the nearest
        container that has one (the conversation's, set by the chat screen: the prompt), so
        that every token view in it has it, a reply's, a comparison's column's, a scored
        message's (those two had none, and after /score the text typed was dropped and its
        letters ran the view's keys: ``r`` the raw view, a digit a branch; seen in tmux).
        None keeps the keys here (the notebook's)."""
        for node in self.ancestors:
            target = getattr(node, "type_into", None)
            if target is not None:
                return target
        return None

    def on_key(self, event: events.Key) -> None:
        """Typing that does not start with one of the view's keys goes to ``type_into`` (after
        Esc stopped a reply here, ``/continue`` must reach the prompt, and its ``n`` must not
        jump the cursor).

        Keys that were on their way here before the focus moved (a fast typist, a terminal
        delivering a burst) follow them, bound or not, in order; Enter submits.
        """
        type_into = self.type_into
        if type_into is None:
            return
        away = self._typing_away or not self.has_focus
        if away and event.key == "enter":
            type_into("", True)
        elif event.is_printable and event.character and (
                away or event.key not in self.screen.active_bindings):
            self._typing_away = True
            type_into(event.character, False)
        else:
            return
        event.stop()
        event.prevent_default()

    def on_focus(self) -> None:
        self._typing_away = False
        if self.cursor is None and self.units:
            self.cursor = len(self.units) - 1
