"""A finished reply's Markdown drawn through Textual's line API, light enough for a day of chat.

Today a finished reply stays a tree of Textual Markdown widgets: ~46 widgets per reply of ~330
tokens (a widget per paragraph, list item, bullet, their Horizontal/Vertical containers...),
each with its message queue, styles, box-model and render caches, and every rendered line as a
``Strip`` with seven ``FIFOCache`` objects. Measured (``benchmarks/bench_long.py --types``,
docs/long-sessions.md): ~12,000 objects tracked by the garbage collector per reply for the
Markdown alone.

:class:`MarkdownLines` is one widget per reply. It keeps the source text and, for the width it
was last drawn at, a :class:`LineStore`: the lines' plain text as one string and their style
runs in ``array`` objects (which the collector does not track) with a small table of styles.
:meth:`MarkdownLines.render_line` builds a line's ``Strip`` on demand; strips live in one
bounded LRU cache shared by every :class:`MarkdownLines` (:data:`STRIP_CACHE`), so a widget
off screen keeps no strip at all. A width, theme or style change rebuilds the store once.

The layout imitates Textual's Markdown (textual 8.2.8, its DEFAULT_CSS) so that a finished
reply looks as it did while it streamed: headers with a margin of 2 above (h1, h2) or 1
(h3-h6) and 1 below, in the theme's ``$markdown-hN-*`` colours; top-level paragraphs and lists
followed by a blank line (margins collapse as in a vertical layout); bullets ``• ▪ ‣ ⭑ ◦`` by
depth and right-aligned numbers; fenced code highlighted by Textual's own highlighter, padded
1 2, on the fence's background; quotes with a ``▌`` border and the ``$boost`` background;
inline code, emphasis, strong and strikethrough styled as Textual styles them. Differences
(documented in docs/long-sessions.md): translucent backgrounds (inline code, quotes) blend a
few colour steps apart; links are not clickable (the reply view opens none either); a wide
table has no horizontal scroll; a line of code wider than its fence goes on in the next line,
under a ``↪`` (Textual's fence scrolls it sideways with no scroll bar, and cropped, as it was
here, its end was on screen nowhere: a comparison's columns cut most lines of code); a single
newline inside a paragraph breaks the line (Textual's Markdown makes it a space).

``MarkdownFence.highlight`` (a public classmethod of Textual's Markdown fence) colours code,
so fences look as they do while streaming.
"""

from __future__ import annotations

import itertools
import re
import weakref
from array import array
from dataclasses import dataclass
from typing import Callable, ClassVar, Iterable, Protocol, Sequence

from markdown_it import MarkdownIt
from markdown_it.token import Token as MdToken
from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.cache import LRUCache
from textual.content import Content, Span
from textual.geometry import Size
from textual.selection import Selection
from textual.strip import Strip
from textual.style import Style
from textual.widget import Widget
from textual.widgets.markdown import MarkdownFence

from ..textual_compat.internals import visible_regions
from .selection import JOINS, Joined, joined_at, selected_text, with_selection, wrap_marked

DRAWN_WIDGETS = 8
"""Widgets that keep Textual's cache of their drawn lines: those on screen, and the most
recently drawn others up to this count."""
STRIP_CACHE = 128
"""Rendered lines kept for all :class:`MarkdownLines` together (a few screens' worth)."""
STORE_CACHE = 256
"""Laid-out replies (:class:`LineStore`, a few kB each) kept for all :class:`MarkdownLines`
together, by text, width and style: a reply whose widgets the conversation's window mounts
again (PageUp back over it, or the reply that just streamed at the bottom) is not laid out
again. Issue 21, held PageUp over 60 replies (``benchmarks/bench_long.py``): laying out the
Markdown of the replies each page brought in was ~11 % of a page's work."""

HIGHLIGHT_CACHE = 64
"""Highlighted fences kept for all :class:`MarkdownLines` together: a reply that finishes is
laid out again from its text (its fences were highlighted as they streamed), and so is a reply
at a new width or theme."""

BLOCK_BOTTOM = 1
"""The bottom margin of every top-level block (as Textual's Markdown CSS sets them)."""

BULLETS = ("• ", "▪ ", "‣ ", "⭑ ", "◦ ")
"""Bullets by list depth, as Textual's Markdown draws them."""

QUOTE_BORDER = "▌"

_PARSER = MarkdownIt("gfm-like")
"""The parser Textual's Markdown uses (on the event loop only: its linkify state is not
thread-safe)."""


# ---- layout: Markdown source -> lines of styled Content ----


@dataclass
class _Block:
    """A laid-out block: its lines and its vertical margins (collapsed with its neighbours')."""

    top: int
    lines: list[Content]
    bottom: int


def inline_content(token: MdToken) -> Content:
    """An inline token as Content, with the span names Textual's MarkdownBlock uses
    (``.code_inline``, ``.em``, ``.strong``, ``.s``); links keep their text."""
    if token.children is None:
        return Content(token.content or "")
    parts: list[str] = []
    spans: list[Span] = []
    stack: list[tuple[str | None, int]] = []
    position = 0

    def add(text: str) -> None:
        nonlocal position
        parts.append(text)
        position += len(text)

    for child in token.children:
        kind = child.type
        if kind == "text":
            add(re.sub(r"\s+", " ", child.content))
        elif kind in ("hardbreak", "softbreak"):
            # A single newline inside a paragraph breaks the line too (CommonMark, and Textual's
            # Markdown, make it a space): models write poems, lyrics, addresses and steps one a
            # line with no Markdown around them, and a four-line poem ran together as one
            # paragraph. GitHub's comments and chat apps draw a message this way.
            add("\n")
        elif kind == "code_inline":
            start = position
            add(child.content)
            spans.append(Span(start, position, ".code_inline"))
        elif kind in ("em_open", "strong_open", "s_open"):
            stack.append(("." + kind[:-5], position))
        elif kind in ("link_open",):
            stack.append((None, position))
        elif kind == "image":
            add("🖼  " + (f"({child.attrs.get('alt', '')})" if child.attrs.get("alt") else ""))
        elif kind == "html_inline":
            add(child.content)
        elif kind.endswith("_close") and stack:
            style, start = stack.pop()
            if style is not None and position > start:
                spans.append(Span(start, position, style))
    return Content("".join(parts), spans=spans)


def _pad(line: Content, width: int) -> Content:
    return line.pad_right(max(0, width - line.cell_length))


def _center(line: Content, width: int) -> Content:
    return line.pad_left(max(0, (width - line.cell_length) // 2))


def _crop(line: Content, width: int) -> Content:
    if line.cell_length <= width:
        return line
    cut, used = 0, 0
    for ch in line.plain:
        used += cell_len(ch)
        if used > width:
            break
        cut += 1
    return line[:cut]


MIN_CODE_ROOM = 8
"""Narrowest code a fence wraps to; below it (a window dragged tiny) its lines are cropped."""
WRAP_MARK = Content("↪ ").stylize(".fence_wrap")
"""The left padding of a code line's continuation (the line was wider than the fence)."""


FENCE_PAD = "  "
"""A fence's padding left and right of its code (``selection.JOINS`` drops the right one
where a line of code goes on in the next)."""


def _wrap_cells(line: Content, width: int) -> list[Content]:
    """``line`` cut into pieces of at most ``width`` cells (character by character, as code
    is: no word breaks), a wide character never split."""
    if line.cell_length <= width:
        return [line]
    pieces, start, used = [], 0, 0
    for i, ch in enumerate(line.plain):
        cells = cell_len(ch)
        if used + cells > width and i > start:
            pieces.append(line[start:i])
            start, used = i, 0
        used += cells
    pieces.append(line[start:])
    return pieces


def _join(blocks: Sequence[_Block], *, previous: int = 0,
          last_margin: bool = True) -> list[Content]:
    """Blocks stacked with collapsed margins (the larger of two neighbouring margins); the
    first block's top margin is kept (collapsed with ``previous``, the bottom margin of a block
    drawn before these), and the last one's bottom margin with ``last_margin``."""
    out: list[Content] = []
    for block in blocks:
        gap = max(previous, block.top)
        out.extend(Content("") for _ in range(gap))
        out.extend(block.lines)
        previous = block.bottom
    if blocks and last_margin:
        out.extend(Content("") for _ in range(previous))
    return out


def _closing(tokens: Sequence[MdToken], start: int) -> int:
    """Index of the token that closes the one at ``start``."""
    level = 0
    for i in range(start, len(tokens)):
        level += tokens[i].nesting
        if level == 0:
            return i
    return len(tokens) - 1


class _Layout:
    """Lays out parsed Markdown at a width (see the module docstring for the rules)."""

    def __init__(self, highlight: Callable[[str, str], Content]) -> None:
        self.highlight = highlight

    def blocks(self, tokens: Sequence[MdToken], width: int, *, top_level: bool,
               in_list: bool, depth: int) -> list[_Block]:
        width = max(1, width)
        out: list[_Block] = []
        i = 0
        while i < len(tokens):
            token = tokens[i]
            kind = token.type
            end = _closing(tokens, i) if token.nesting == 1 else i
            inner = tokens[i + 1:end]
            if kind == "heading_open":
                level = int(token.tag[1:])
                text = inline_content(inner[0]) if inner else Content("")
                # the header's style on its text only (Textual underlines no padding)
                lines = [_pad(_center(line.stylize(f".h{level}"), width) if level == 1
                              else line.stylize(f".h{level}"), width)
                         for line in wrap_marked(text, width)]
                out.append(_Block(2 if level <= 2 else 1, lines, 1))
            elif kind == "paragraph_open":
                text = inline_content(inner[0]) if inner else Content("")
                out.append(_Block(0, wrap_marked(text, width), 1 if top_level else 0))
            elif kind in ("bullet_list_open", "ordered_list_open"):
                lines = self._list(inner, width, ordered=kind == "ordered_list_open",
                                   depth=depth)
                out.append(_Block(0, lines, 0 if in_list else 1))
            elif kind in ("fence", "code_block"):
                out.append(_Block(1, self._fence(token, width), 1))
            elif kind == "blockquote_open":
                out.append(_Block(1, self._quote(inner, width, depth), 1))
            elif kind == "hr":
                out.append(_Block(0, [Content(""), Content("─" * width).stylize(".hr")], 1))
            elif kind == "table_open":
                out.append(_Block(0, self._table(inner, width), 1))
            elif kind == "html_block":
                out.append(_Block(0, Content(token.content.rstrip("\n")).wrap(width),
                                  1 if top_level else 0))
            i = end + 1
        return out

    def lines(self, tokens: Sequence[MdToken], width: int, *, top_level: bool = True,
              in_list: bool = False, depth: int = 0, previous: int = 0,
              last_margin: bool = True) -> list[Content]:
        return _join(self.blocks(tokens, width, top_level=top_level, in_list=in_list,
                                 depth=depth), previous=previous, last_margin=last_margin)

    def _list(self, tokens: Sequence[MdToken], width: int, *, ordered: bool,
              depth: int) -> list[Content]:
        items: list[Sequence[MdToken]] = []
        infos: list[str] = []
        i = 0
        while i < len(tokens):
            end = _closing(tokens, i)
            if tokens[i].type == "list_item_open":
                items.append(tokens[i + 1:end])
                infos.append(tokens[i].info)
            i = end + 1
        if ordered:
            try:
                first = int(infos[0]) if infos else 1
            except ValueError:
                first = 1
            labels = [f"{n}. " for n in range(first, first + len(items))]
            size = max((len(label) for label in labels), default=0)
            symbols = [label.rjust(size + 1) for label in labels]
        else:
            symbols = [BULLETS[depth % len(BULLETS)]] * len(items)
        out: list[Content] = []
        for symbol, item in zip(symbols, items):
            room = width - cell_len(symbol)
            body = self.lines(item, room, top_level=False, in_list=True,
                              depth=depth + (not ordered))
            body = body or [Content("")]
            for n, line in enumerate(body):
                head = Content(symbol).stylize(".bullet") if n == 0 else \
                    Content(" " * cell_len(symbol))
                out.append(head + line)
        return out

    def _fence(self, token: MdToken, width: int) -> list[Content]:
        code = token.content[:-1] if token.content.endswith("\n") else token.content
        highlighted = self.highlight(code, token.info.strip().split(" ")[0] if token.info else "")
        # padding (1 2) in its own spans with the background only, the code and its fill in
        # the fence's style: the segments Textual draws for a fence widget
        blank = Content(" " * width).stylize(".fence_pad")
        pad = Content(FENCE_PAD).stylize(".fence_pad")
        room = width - 2 * len(FENCE_PAD)
        lines = [blank]
        for line in highlighted.split("\n"):
            code = line.expand_tabs(4).stylize_before(".fence")
            if room < MIN_CODE_ROOM:  # too narrow to wrap usefully: cropped at the width
                lines.append(_crop(pad + code, width))
                continue
            # a line wider than the fence goes on under ``WRAP_MARK`` (cropped, the end of a
            # line of code was not on screen anywhere: the compare columns cut every line)
            for n, piece in enumerate(_wrap_cells(code, room)):
                fill = room - piece.cell_length
                if fill > 0:
                    piece += Content(" " * fill).stylize(".fence_pad")
                if n:
                    piece = piece.stylize(".join_code", 0, 1)
                lines.append((WRAP_MARK if n else pad) + piece + pad)
        lines.append(blank)
        return lines

    def _quote(self, tokens: Sequence[MdToken], width: int, depth: int) -> list[Content]:
        body = self.lines(tokens, max(1, width - 3), top_level=False, depth=depth)
        border = Content(QUOTE_BORDER).stylize(".quote").stylize(".quote_border")
        return [border + _pad(Content(" ") + line, width - 1).stylize_before(".quote")
                for line in body]

    def _table(self, tokens: Sequence[MdToken], width: int) -> list[Content]:
        """A grid of equal columns across the width, as Textual's Markdown draws tables."""
        rows: list[tuple[bool, list[Content]]] = []
        cells: list[Content] = []
        header = False
        for token in tokens:
            if token.type == "thead_open":
                header = True
            elif token.type == "tbody_open":
                header = False
            elif token.type == "tr_open":
                cells = []
            elif token.type == "inline":
                cells.append(inline_content(token))
            elif token.type == "tr_close":
                rows.append((header, cells))
        columns = max((len(r) for _, r in rows), default=0)
        if not columns:
            return []
        # each column as wide as its widest cell (padded 0 1), then all scaled together to
        # fill the room between the keylines, as Textual's grid (auto, expand, shrink) does
        room = max(columns, width - columns - 1)
        natural = [max((row[c].cell_length + 2 for _, row in rows if c < len(row)), default=2)
                   for c in range(columns)]
        total = sum(natural)
        bounds = [0]
        for c in range(columns):
            bounds.append(sum(natural[:c + 1]) * room // total)
        widths = [max(1, b - a) for a, b in zip(bounds, bounds[1:])]

        # every corner, run of rule, padding and cell text its own span: drawn as Textual
        # draws them (one segment each), a screenshot of the reply stays the same
        def piece(text: str, style: str) -> Content:
            return Content(text).stylize(style)

        def rule(left: str, mid: str, right: str) -> Content:
            parts = [piece(left, ".table_lines")]
            for c, w in enumerate(widths):
                if c:
                    parts.append(piece(mid, ".table_lines"))
                parts.append(piece("─" * w, ".table_lines"))
            parts.append(piece(right, ".table_lines"))
            return Content("").join(parts)

        bar = piece("│", ".table_lines")
        out = [rule("┌", "┬", "┐")]
        for n, (is_header, row) in enumerate(rows):
            wrapped = [(row[c] if c < len(row) else Content("")).wrap(max(1, widths[c] - 2))
                       for c in range(columns)]
            for y in range(max(len(w) for w in wrapped)):
                parts = [bar]
                for c, cell_lines in enumerate(wrapped):
                    text = cell_lines[y] if y < len(cell_lines) else Content("")
                    text = text.stylize(".table_cell")
                    cell = Content(" ") + text
                    if is_header:
                        cell = cell.stylize(".table_header")
                    parts.append(cell)
                    pad = widths[c] - cell.cell_length
                    for blank in (pad - 1, 1) if pad > 1 else (pad,):  # fill, then padding
                        if blank > 0:
                            parts.append(piece(" " * blank, ".table_header" if is_header
                                               else ".table_cell"))
                    parts.append(bar)
                out.append(Content("").join(parts))
            if is_header and n + 1 < len(rows) and not rows[n + 1][0]:
                out.append(rule("├", "┼", "┤"))
        out.append(rule("└", "┴", "┘"))
        return [line.stylize_before(".table") for line in out]


def layout_markdown(source: str, width: int,
                    highlight: Callable[[str, str], Content] | None = None, *,
                    previous: int = 0, last_margin: bool = True) -> list[Content]:
    """The lines of ``source`` at ``width`` cells, as Content whose span styles are names
    resolved when drawn (``.h2``, ``.code_inline``, ``.fence``... and the highlighter's
    ``$variables``). ``highlight(code, language)`` colours fenced code (default: Textual's
    highlighter with its dark theme). ``previous`` is the bottom margin of what is drawn
    above (the first block's top margin collapses with it); without ``last_margin`` the last
    block's bottom margin (blank lines) is left out.

    Top-level blocks end where the next begins, so source cut between two of them lays out in
    two parts as in one: ``layout(a + b) == layout(a, last_margin=False) + layout(b,
    previous=BLOCK_BOTTOM)`` (every top-level block's bottom margin is ``BLOCK_BOTTOM``)."""
    return layout_tokens(_PARSER.parse(source), width, highlight, previous=previous,
                         last_margin=last_margin)


def layout_tokens(tokens: Sequence[MdToken], width: int,
                  highlight: Callable[[str, str], Content] | None = None, *,
                  previous: int = 0, last_margin: bool = True) -> list[Content]:
    """:func:`layout_markdown` of parsed Markdown (top-level blocks' tokens, whole)."""
    if highlight is None:
        def highlight(code: str, language: str) -> Content:
            return MarkdownFence.highlight(code, language, dark=True)
    return _Layout(highlight).lines(tokens, width, previous=previous, last_margin=last_margin)


def parse_markdown(source: str) -> list[MdToken]:
    """``source`` parsed as Textual's Markdown parses it (on the event loop only)."""
    return _PARSER.parse(source)


# ---- compact storage of rendered lines ----


class Runs(list):  # type: ignore[type-arg]
    """A laid-out line's runs of text and Rich style, with where its text goes on from the
    line above (``selection.joined_at``; None: it does not)."""

    __slots__ = ("joined",)

    def __init__(self, runs: Iterable[tuple[str, RichStyle | None]],
                 joined: Joined | None = None) -> None:
        super().__init__(runs)
        self.joined = joined


class LineStore:
    """Rendered lines in a few objects: one string of all the lines' text, and style runs in
    arrays (untracked by the garbage collector) indexing a small table of Rich styles."""

    __slots__ = ("width", "text", "line_starts", "run_starts", "run_offsets", "run_styles",
                 "styles", "joins")

    def __init__(self, width: int, lines: Iterable[Sequence[tuple[str, RichStyle | None]]]):
        self.width = width
        self.text = ""
        self.line_starts = array("I", [0])
        self.run_starts = array("I", [0])
        self.run_offsets = array("I")
        self.run_styles = array("H")
        self.styles: tuple[RichStyle | None, ...] = ()
        self.joins: dict[int, Joined] = {}
        """The lines that go on from the line above (``Runs.joined``), by line."""
        self.extend(lines)

    def extend(self, lines: Iterable[Sequence[tuple[str, RichStyle | None]]]) -> None:
        """Add ``lines`` after the last line (the lines before are left as they are)."""
        texts: list[str] = [self.text]
        table: dict[RichStyle | None, int] = {style: n for n, style in enumerate(self.styles)}
        offset = self.line_starts[-1]
        for line in lines:
            joined = getattr(line, "joined", None)
            if joined is not None:
                self.joins[len(self.line_starts) - 1] = joined
            within = 0
            for text, style in line:
                if not text:
                    continue
                self.run_offsets.append(within)
                self.run_styles.append(table.setdefault(style, len(table)))
                texts.append(text)
                within += len(text)
            offset += within
            self.line_starts.append(offset)
            self.run_starts.append(len(self.run_offsets))
        self.text = "".join(texts)
        self.styles = tuple(table)

    def __len__(self) -> int:
        return len(self.line_starts) - 1

    def line_text(self, y: int) -> str:
        if not 0 <= y < len(self):
            return ""
        return self.text[self.line_starts[y]:self.line_starts[y + 1]]

    def joined(self, y: int) -> Joined | None:
        """Where line ``y``'s text starts and how it joins the line above, if it goes on from
        it (a wrapped paragraph or line of code), else None."""
        return self.joins.get(y)

    def segments(self, y: int) -> list[Segment]:
        """Line ``y`` as Rich segments."""
        if not 0 <= y < len(self):
            return []
        line = self.line_text(y)
        first, last = self.run_starts[y], self.run_starts[y + 1]
        out: list[Segment] = []
        for r in range(first, last):
            start = self.run_offsets[r]
            end = self.run_offsets[r + 1] if r + 1 < last else len(line)
            out.append(Segment(line[start:end], self.styles[self.run_styles[r]]))
        return out


class DrawnLines(Protocol):
    """Drawn lines as :class:`MarkdownLines` reads them (a :class:`LineStore`, or several)."""

    width: int

    def __len__(self) -> int: ...

    def line_text(self, y: int) -> str: ...

    def joined(self, y: int) -> Joined | None: ...

    def segments(self, y: int) -> list[Segment]: ...


# ---- the widget ----

STYLES: dict[tuple[str, str], str] = {
    **{(f"h{n}", ""): f"$markdown-h{n}-color on $markdown-h{n}-background "
                      f"$markdown-h{n}-text-style" for n in range(1, 7)},
    ("code_inline", "dark"): "$text-warning 95% on $warning 10%",
    ("code_inline", "light"): "$text-error 95% on $error 5%",
    ("code_inline", "ansi"): "$text-warning 95%",
    ("em", ""): "italic",
    ("strong", ""): "bold",
    ("s", ""): "strike",
    ("bullet", ""): "$text-primary",
    ("bullet", "light"): "$text-secondary",
    ("fence", ""): "rgb(210,210,210) on black 10%",
    ("fence", "light"): "rgb(210,210,210) on white 30%",
    ("fence", "ansi"): "rgb(210,210,210)",
    ("fence_pad", ""): "on black 10%",
    ("fence_pad", "light"): "on white 30%",
    ("fence_pad", "ansi"): "",
    ("fence_wrap", ""): "$foreground 40% on black 10%",
    ("fence_wrap", "light"): "$foreground 40% on white 30%",
    ("fence_wrap", "ansi"): "dim",
    ("quote", ""): "on $boost",
    ("quote_border", ""): "$text-primary 50%",
    ("quote_border", "light"): "$text-secondary",
    ("hr", ""): "$secondary",
    ("table_header", ""): "$primary",
    ("table_lines", ""): "$foreground 20%",
    ("table", "light"): "on white 30%",
}
"""The style of each named span by (name, variant: "dark", "light", "ansi" or "" for all),
as Textual's Markdown CSS sets them (textual 8.2.8). Resolved through the app's stylesheet
(theme variables) rather than component classes: each component class costs a widget its
own styles node (~50 tracked objects each)."""


class MarkdownLines(Widget):
    """A finished reply's Markdown, drawn line by line from its text (see the module
    docstring). Set new text with :meth:`update`; ``source`` is the text shown."""

    DEFAULT_CSS = """
    MarkdownLines { height: auto; color: $foreground; }
    """

    _strips: ClassVar[LRUCache[tuple[int, int, int], Strip]] = LRUCache(STRIP_CACHE)
    """Rendered lines of every MarkdownLines, keyed by (widget, generation, line)."""
    _stores: ClassVar[LRUCache[tuple[object, ...], LineStore]] = LRUCache(STORE_CACHE)
    """Laid-out lines of every MarkdownLines, keyed by (text, width, style, theme)."""
    _highlighted: ClassVar[LRUCache[tuple[str, str, bool, bool], Content]] = LRUCache(
        HIGHLIGHT_CACHE)
    """Highlighted code of fences, by (code, language, ANSI colours, dark theme)."""
    _serial: ClassVar[Iterable[int]] = itertools.count()
    _drawn: ClassVar[dict[int, weakref.ref[MarkdownLines]]] = {}
    """The widgets that drew lines, the most recent last (see :meth:`_drawn_now`)."""

    def __init__(self, markdown: str = "", *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._source = markdown
        self._store: DrawnLines | None = None
        self._key: object = None
        self._uid = next(self._serial)  # type: ignore[call-overload]
        self._generation = 0

    @property
    def source(self) -> str:
        """The Markdown shown."""
        return self._source

    def update(self, markdown: str) -> None:
        """Show ``markdown`` instead."""
        if markdown == self._source:
            return
        self._source = markdown
        self._invalidate()
        self.refresh(layout=True)

    def _invalidate(self) -> None:
        self._store = None
        self._key = None
        self._generation += 1

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._invalidate()

    def _drawn_now(self) -> None:
        """Note that this widget drew lines; the widgets that drew longest ago and are off
        screen now drop Textual's own cache of their drawn lines (``refresh`` clears it), and
        so do their containers: a reply scrolled away keeps no strip at all."""
        drawn = MarkdownLines._drawn
        drawn.pop(self._uid, None)
        drawn[self._uid] = weakref.ref(self)
        if len(drawn) <= DRAWN_WIDGETS:
            return
        for uid, ref in list(drawn.items())[:-1]:
            widget = ref()
            if widget is None or not widget.is_attached:
                del drawn[uid]
            elif not widget._visible():
                del drawn[uid]
                widget._forget_drawn_lines()
            if len(drawn) <= DRAWN_WIDGETS:
                break

    def _forget_drawn_lines(self) -> None:
        """Drop Textual's caches of drawn lines here and in the containers up to the one that
        scrolls (a reply view with a border keeps a strip per line of its height)."""
        self.refresh()
        for ancestor in self.ancestors:
            if not isinstance(ancestor, Widget) or \
                    ancestor.styles.overflow_y in ("auto", "scroll"):
                break
            ancestor.refresh()

    def _visible(self) -> bool:
        """Whether any of this widget is on screen now.

        Read from the compositor's map of visible widgets
        (:func:`chatui.textual_compat.internals.visible_regions`, behind the gate): ``find_widget`` of a widget off screen
        builds the map of every widget on the screen, ~20 ms with 60 replies, and PageUp
        asked it for each reply that scrolled away (docs/long-sessions.md)."""
        try:
            screen = self.screen
        except Exception:  # noqa: BLE001 - not on a screen (any more)
            return False
        visible = visible_regions(screen)
        if visible is not None:
            where = visible.get(self)
            return where is not None and bool(where[0].intersection(where[1]))
        try:
            found = screen.find_widget(self)
        except Exception:  # noqa: BLE001 - not laid out (any more)
            return False
        return bool(found.region.intersection(found.clip))

    # ---- layout and drawing ----

    def _parse_style(self, style: str | Style) -> Style:
        if isinstance(style, Style):
            return style
        if style.startswith("."):
            app = self.app
            variant = "ansi" if app.native_ansi_color else (
                "dark" if app.current_theme.dark else "light")
            named = STYLES.get((style[1:], variant)) or STYLES.get((style[1:], ""), "")
            return app.stylesheet.parse_style(named) if named else Style.null()
        return self.app.stylesheet.parse_style(style)

    def _highlight(self, code: str, language: str) -> Content:
        app = self.app
        key = (code, language, app.native_ansi_color, app.current_theme.dark)
        highlighted = self._highlighted.get(key)
        if highlighted is None:
            highlighted = self._highlighted[key] = MarkdownFence.highlight(
                code, language, ansi=app.native_ansi_color, dark=app.current_theme.dark)
        return highlighted

    def _layout_key(self, width: int) -> tuple[int, Style, str, bool]:
        """What the lines' layout depends on: the width (at least 1), the base style, the
        theme and whether colours are the terminal's own."""
        app = self.app
        return max(1, width), self.visual_style, app.theme, app.native_ansi_color

    def lines(self, width: int) -> DrawnLines:
        """The rendered lines at ``width`` (laid out once per text, width, theme and base
        style, and shared by every widget showing the same text: :data:`STORE_CACHE`)."""
        key = self._layout_key(width)
        width, base = key[0], key[1]
        if self._store is None or key != self._key:
            self._generation += 1
            shared = (self._source, *key)
            store = self._stores.get(shared)
            if store is None:
                store = self._stores[shared] = self._lay_out(width, base)
            self._store = store
            self._key = key
        return self._store

    def _lay_out(self, width: int, base: Style) -> LineStore:
        return LineStore(width, self._runs(layout_markdown(self._source, width,
                                                           self._highlight), base))

    def _runs(self, laid_out: list[Content], base: Style) -> list[Runs]:
        """Laid-out lines as runs of text and Rich style, on the ``base`` style."""
        rich_base = base.rich_style
        rendered = []
        for line in laid_out:
            joined = joined_at(line)
            if joined is not None:  # (the mark drawn would split a run in two)
                line = Content(line.plain, [s for s in line.spans
                                           if not (isinstance(s.style, str) and s.style in JOINS)])
            rendered.append(Runs(((text, (base + style).rich_style if style is not None
                                   else rich_base)
                                  for text, style in line.render(Style.null(), "",
                                                                 self._parse_style)),
                                 joined))
        return rendered

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return container.width

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self.lines(width)) if self._source else 0

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        store = self.lines(width)
        cache_key = self._strip_key(y)
        strip = self._strips.get(cache_key) if cache_key is not None else None
        if y == 0 or strip is None:
            self._drawn_now()
        if strip is None:
            rich_base = self.visual_style.rich_style
            segments = store.segments(y)
            # with the offsets Textual reads where a mouse selection starts and ends (without
            # them a drag over part of a reply selected all of it)
            strip = Strip(segments).adjust_cell_length(width, rich_base).apply_offsets(0, y)
            if cache_key is not None and y < len(store):  # (a line past the end may be
                self._strips[cache_key] = strip  # drawn once it is there)
        return with_selection(self, strip, y, store.line_text)

    def _strip_key(self, y: int) -> tuple[int, int, int] | None:
        """The key of line ``y``'s strip in :data:`STRIP_CACHE` (None: not kept there)."""
        return (self._uid, self._generation, y)

    # ---- selection and copying ----

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        """The text under a mouse selection, one line per line of the text: a paragraph
        wrapped at the width is copied as one line, and a line of code wrapped under
        ``WRAP_MARK`` whole, as it was written."""
        store = self._store
        if store is None:
            return None
        text, ending = selected_text(selection, len(store), store.line_text, trim=str,
                                     joined=store.joined)
        return "\n".join(line.rstrip() for line in text.split("\n")), ending

    def selection_updated(self, selection: Selection | None) -> None:
        self.refresh()
