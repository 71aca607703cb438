"""A streaming reply's Markdown, drawn through the line API as it is drawn once finished.

Textual's ``Markdown`` streams by mounting a widget per block (a paragraph, a list with a widget
per item and bullet...): each new block is a mount and a layout of the whole screen, and every
layout measures and arranges every block of the reply. On this 2-core machine the default model
streams ~270 tokens a second, a paragraph every ~0.2 s, and the Markdown view cost the engine
13-16% of its speed (README, "The UI's cost to the engine"), against the token view's 3%.

:class:`StreamingMarkdown` is one widget. Its text is kept in two parts, as Textual's own
``Markdown.append`` sees it: the *settled* blocks, which the next text cannot change (every
top-level block before the last: an append parses again from the start of the last one), and
the *tail*, the last block. Settled blocks are laid out once, when they settle, and added after
the lines before them (their strips are kept); each append lays out the tail alone. The lines
are those :class:`~chatui.widgets.markdown_lines.MarkdownLines` draws for the whole text (a
layout cut between two top-level blocks is the whole layout: ``layout_markdown``'s
docstring), so the reply does not change its look when it finishes. The widget grows in
steps (:class:`~chatui.widgets.settled.GrowsInSteps`): an append that stays within the step
repaints the rows it changed, with no layout of the screen.
"""

from __future__ import annotations

from typing import Sequence

from markdown_it.token import Token as MdToken
from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.geometry import Region
from textual.style import Style

from ..textual_compat import forget_measured_size
from .markdown_lines import (BLOCK_BOTTOM, DrawnLines, LineStore, MarkdownLines, layout_tokens,
                             parse_markdown)
from .selection import Joined
from .settled import GrowsInSteps, SettledSize, round_up


class JoinedLines:
    """Two sets of drawn lines read as one, ``head`` then ``tail`` (``DrawnLines``)."""

    __slots__ = ("head", "tail", "width")

    def __init__(self, head: LineStore, tail: LineStore) -> None:
        self.head, self.tail, self.width = head, tail, head.width

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def line_text(self, y: int) -> str:
        rows = len(self.head)
        return self.head.line_text(y) if y < rows else self.tail.line_text(y - rows)

    def joined(self, y: int) -> Joined | None:
        rows = len(self.head)
        return self.head.joined(y) if y < rows else self.tail.joined(y - rows)

    def segments(self, y: int) -> list[Segment]:
        rows = len(self.head)
        return self.head.segments(y) if y < rows else self.tail.segments(y - rows)


def _last_block(tokens: Sequence[MdToken]) -> int | None:
    """Index of the token that opens the last top-level block (None: no block)."""
    for index in range(len(tokens) - 1, -1, -1):
        token = tokens[index]
        if token.level == 0 and token.map is not None:
            return index
    return None


class StreamingMarkdown(GrowsInSteps, SettledSize, MarkdownLines):
    """A reply's Markdown while it streams: :meth:`append` adds text (see the module
    docstring). ``source`` is the text shown."""

    def __init__(self, markdown: str = "", *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__("", name=name, id=id, classes=classes)
        self._settled_end = 0
        """Characters of the source in settled blocks."""
        self._pending: list[MdToken] = []
        """Settled blocks' tokens not laid out yet."""
        self._tail_tokens: list[MdToken] = []
        """The tail's tokens."""
        self._head: LineStore | None = None
        """The settled blocks' lines at the width of ``_key`` (None: lay them out)."""
        self._tail: LineStore | None = None
        """The tail's lines (None: lay it out)."""
        self._add(markdown)

    # ---- text ----

    def update(self, markdown: str) -> None:
        """Show ``markdown`` instead (laid out afresh)."""
        if markdown == self._source:
            return
        self._source, self._settled_end = "", 0
        self._pending = []
        self._add(markdown)
        self._head = None
        self._invalidate()
        self.refresh(layout=True)

    def append(self, markdown: str) -> None:
        """Add ``markdown`` at the end: the rows from the tail's first on are repainted, and
        the screen laid out only when the widget's height changes (a new step)."""
        if not markdown:
            return
        drawn = self._store if isinstance(self._store, JoinedLines) else None
        self._add(markdown)
        width = self.size.width
        if drawn is None or not self.is_mounted or not width:
            self.refresh(layout=True)
            return
        first, before = len(drawn.head), len(drawn)  # (the head grows in place)
        rows = len(self.lines(width))
        self.refresh(Region(0, first, width, max(before, rows) - first))
        if round_up(rows, self.step) != self.size.height:
            forget_measured_size(self)
            self.refresh(layout=True, repaint=False)  # the new rows are repainted (a new step)

    def _add(self, text: str) -> None:
        """Add ``text`` to the source; the blocks it settles are queued for layout."""
        self._source += text
        tail = self._source[self._settled_end:]
        tokens = parse_markdown(tail)
        last = _last_block(tokens)
        start = tokens[last].map[0] if last is not None and tokens[last].map else 0
        if last is not None and start > 0:
            self._settled_end += sum(len(line) for line in tail.splitlines(keepends=True)[:start])
            self._pending.extend(tokens[:last])
            tokens = tokens[last:]
        self._tail_tokens = tokens
        self._tail = None

    # ---- drawing ----

    def lines(self, width: int) -> DrawnLines:
        """The drawn lines at ``width``: the settled blocks' (laid out as they settle, all
        again for a new width or style), then the tail's."""
        key = self._layout_key(width)
        width, base = key[0], key[1]
        if self._head is None or key != self._key:
            self._generation += 1
            self._key = key
            self._head = LineStore(width, [])
            self._pending = parse_markdown(self._source[:self._settled_end])
            self._tail = None
        if self._pending:
            self._head.extend(self._lay_out_tokens(self._pending, width, base,
                                                   last_margin=False))
            self._pending = []
        if self._tail is None:
            self._tail = LineStore(width, self._lay_out_tokens(self._tail_tokens, width, base,
                                                               last_margin=True))
        self._store = JoinedLines(self._head, self._tail)
        return self._store

    def _lay_out_tokens(self, tokens: list[MdToken], width: int, base: Style, *,
                        last_margin: bool) -> list[list[tuple[str, RichStyle | None]]]:
        """Lines of blocks drawn after the settled lines laid out so far: their first top
        margin collapses with the bottom margin of the blocks there (a block draws at least a
        line); settled blocks leave their last bottom margin out (the next block's top margin
        collapses with it)."""
        previous = BLOCK_BOTTOM if self._head is not None and len(self._head) else 0
        return self._runs(layout_tokens(tokens, width, self._highlight, previous=previous,
                                        last_margin=last_margin), base)

    def _strip_key(self, y: int) -> tuple[int, int, int] | None:
        head = self._head
        return (self._uid, self._generation, y) if head is not None and y < len(head) else None
