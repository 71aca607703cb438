"""A view of one assistant reply: streamed Markdown, the token view, and its statistics.

The same widget serves one reply in the chat and one column of a comparison: the parent
hands it a :class:`~chatui.conversation.Reply` (which the screen's
:class:`~chatui.recorder.ReplyRecorder` alone changes) and shows each
:class:`~chatui.recorder.TokensAdded` delta with :meth:`ReplyView.add`; the view never reaches
up into its parent. The process-wide GC policy is the streaming loop's business, not a view's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.timer import Timer
from textual.widget import AwaitMount, Widget
from textual.widgets import Static

from inference.types import Token, finish_words

from ..conversation import Reply
from ..recorder import Delta, TokensAdded
from ..token_records import TokenRecords
from .markdown_lines import MarkdownLines
from .parts_line import PartsLine
from .reasoning import ReasoningBlock
from .settled import SettledSize
from .streaming_markdown import StreamingMarkdown
from .text import safe_text, show_prob, show_token, tokens_label
from .token_view import REFRESH_S, TokenView

FRAME_S = REFRESH_S
"""While a reply streams, everything it shows changes on one clock of this period (10 per
second): the token view, the Markdown and the statistics line go to the screen together, so
each frame costs one layout and one render of the screen, not one per part."""
MARKDOWN_S = FRAME_S
"""Smallest interval between two Markdown appends while streaming (10 per second)."""

FINISH_LABELS = {
    "stop": "",
    "length": "✂ cut off at the token limit — /continue to go on",
    "cancelled": "■ stopped — /continue to go on",
    "error": "✗ failed",
}


COLUMN_FINISH_LABELS = {
    **FINISH_LABELS,
    "length": "✂ cut off at the token limit — /pick it, then /continue",
    "cancelled": "■ stopped — /pick it, then /continue",
}
"""A column's markers (a comparison's or a fan-out's): /continue goes on with the column picked
(/pick N, F6), not with all of them (one request has one prefix for all its rows). A fan-out's
branch picked becomes a reply of its own; a comparison's column goes on as a new alternative to
the comparison."""


STEP_FRACTION = 4
"""While a reply streams it grows in steps of a quarter of the height it scrolls in..."""
STEP_RANGE = (2, 12)
"""...within these bounds (lines)."""

STATS_S = 0.5
"""Smallest interval between two updates of the statistics line while streaming (each one is
a layout of the conversation)."""
FENCE_LINES = 40
"""Inside an open code fence the Markdown is re-highlighted in full on each append, so appends
are spaced by MARKDOWN_S for every FENCE_LINES lines of the fence..."""
MARKDOWN_MAX_S = 1.0
"""...up to this interval."""


@dataclass
class RunningStats:
    """A reply's statistics, updated with each batch (work per token, not per reply)."""

    seen: int = 0
    count: int = 0
    """Tokens that are not special."""
    reasoning: int = 0
    """Of them, tokens of the reasoning."""
    logprob_sum: float = 0.0
    logprob_count: int = 0
    least: Token | None = None

    def sync(self, tokens: Sequence[Token]) -> RunningStats:
        """Take the tokens appended since the last call (start over if the list shrank)."""
        if len(tokens) < self.seen:
            self.__init__()  # type: ignore[misc]
        if isinstance(tokens, TokenRecords):
            return self._sync_columns(tokens)
        for tok in tokens[self.seen:]:
            if tok.special:
                continue
            self.count += 1
            self.reasoning += tok.channel == "reasoning"
            if tok.logprob is not None:
                self.logprob_sum += tok.logprob
                self.logprob_count += 1
                if self.least is None or tok.logprob < self.least.logprob:  # type: ignore[operator]
                    self.least = tok
        self.seen = len(tokens)
        return self

    def _sync_columns(self, tokens: TokenRecords) -> RunningStats:
        """:meth:`sync` from the columns, making only the least likely token (a finished
        reply drawn again as the user scrolls back: 8 ms for 330 tokens made one by one)."""
        least_at = -1
        least = self.least.logprob if self.least is not None else None
        for i in range(self.seen, len(tokens)):
            if tokens.is_special(i):
                continue
            self.count += 1
            self.reasoning += tokens.is_reasoning(i)
            logprob = tokens.logprob_at(i)
            if logprob is not None:
                self.logprob_sum += logprob
                self.logprob_count += 1
                if least is None or logprob < least:
                    least, least_at = logprob, i
        if least_at >= 0:
            self.least = tokens[least_at]
        self.seen = len(tokens)
        return self

    @property
    def mean_logprob(self) -> float | None:
        return self.logprob_sum / self.logprob_count if self.logprob_count else None


class FenceTracker:
    """Whether streamed Markdown is inside an open code fence, and how long it is so far."""

    def __init__(self) -> None:
        self.open = False
        self.lines = 0
        self._partial = ""

    def feed(self, text: str) -> None:
        *complete, self._partial = (self._partial + text).split("\n")
        for line in complete:
            if line.lstrip().startswith(("```", "~~~")):
                self.open = not self.open
                self.lines = 0
            elif self.open:
                self.lines += 1

    def interval(self) -> float:
        """Smallest interval between two Markdown appends now."""
        if not self.open:
            return MARKDOWN_S
        return min(MARKDOWN_MAX_S, MARKDOWN_S * max(1.0, self.lines / FENCE_LINES))


def token_label(text: str) -> str:
    """A token for the statistics line, never invisible (issue 14: the least likely token
    showed as ``''``): an empty token (part of a character) is ``∅``, a whitespace token shows
    its spaces as ``·``."""
    if not text:
        return "∅"
    return show_token(text.replace(" ", "·") if not text.strip() else text)


def reply_stats(reply: Reply, *, live_rate: float | None = None,
                stable_timings: bool = False, running: RunningStats | None = None) -> str:
    """One line of statistics: tokens, mean logprob, perplexity, least likely token, speed.

    ``running`` (kept by a streaming view) saves walking all of ``reply.tokens``."""
    return " · ".join(reply_stats_parts(reply, live_rate=live_rate,
                                        stable_timings=stable_timings, running=running))


def reply_stats_parts(reply: Reply, *, live_rate: float | None = None,
                      stable_timings: bool = False,
                      running: RunningStats | None = None) -> list[str]:
    """:func:`reply_stats`'s parts (the view wraps the line between them)."""
    if not reply.tokens and reply.text and reply.finish_reason is not None \
            and reply.usage is None:  # (opened from a messages file: "0 tokens", it said)
        return ["text only: no tokens were recorded with it"]
    running = running.sync(reply.tokens) if running is not None \
        else RunningStats().sync(reply.tokens)
    parts = [tokens_label(running.count)]
    if running.reasoning:  # "21 tokens + 26 reasoning"
        parts = [f"{tokens_label(running.count - running.reasoning)} + "
                 f"{running.reasoning} reasoning"]
    mean = running.mean_logprob
    if mean is not None:
        ppl = math.exp(-mean)
        parts.append(f"mean logprob {mean:.2f}")
        parts.append(f"ppl {ppl:.2f}")
    least = running.least
    if least is not None and least.logprob is not None:
        parts.append(f"least likely {token_label(least.text)} {show_prob(math.exp(least.logprob))}")
    if reply.usage is not None and not reply.usage.completion_tokens and not reply.tokens:
        parts.append("stopped before its first token")  # ("0.0 tok/s · TTFT 0.00s", it said)
    elif stable_timings:
        parts.append("– tok/s")
    elif reply.usage is not None:
        if reply.usage.decode_rate is not None:
            parts.append(f"{reply.usage.decode_rate:.1f} tok/s")
        parts.append(f"TTFT {reply.usage.ttft_s:.2f}s")
    elif live_rate is not None:
        parts.append(f"{live_rate:.1f} tok/s")
    return parts


class ReplyView(SettledSize, Vertical):
    """One assistant reply. Set ``token_mode``/``raw`` to switch views (attributes down)."""

    DEFAULT_CSS = """
    ReplyView { height: auto; }
    ReplyView > .reply-header { color: $text-muted; height: 1; }
    ReplyView > .reply-stats { color: $text-muted; height: auto; }
    ReplyView > .reply-finish { color: $warning; height: auto; }
    ReplyView > .reply-finish.-error { color: $error; }
    ReplyView > MarkdownLines { margin: 0; padding: 0 1; background: transparent; }
    ReplyView > TokenView { display: none; }
    ReplyView.-tokens > MarkdownLines { display: none; }
    ReplyView.-tokens > TokenView { display: block; }
    ReplyView.-tokens > ReasoningBlock { display: none; }
    """

    token_mode: reactive[bool] = reactive(False, init=False)
    raw: reactive[bool] = reactive(False, init=False)

    def __init__(self, reply: Reply, *, label: str = "assistant", stable_timings: bool = False,
                 token_mode: bool = False, id: str | None = None,
                 classes: str | None = None,
                 finish_labels: dict[str, str] = FINISH_LABELS) -> None:
        super().__init__(id=id, classes=classes)
        self.reply = reply
        self.label = label
        self.finish_labels = finish_labels
        """What the marker under a finished reply says, by finish reason."""
        self.stable_timings = stable_timings
        self._streaming = False
        """Between :meth:`begin` and :meth:`end`."""
        self._markdown: StreamingMarkdown | MarkdownLines | None = None
        """What draws the text: the streaming Markdown, or (finished) MarkdownLines. Kept
        here, never found with ``query_one``: its cache would keep a removed one alive."""
        self._restoring: AwaitMount | None = None
        """The streaming Markdown being mounted again (``/continue``)."""
        self._first_token_at: float | None = None
        self._streamed = 0
        self._last_stats = 0.0
        self._pending: list[str] = []
        self._last_write = 0.0
        self._clock: Timer | None = None
        """The frame clock while streaming (see FRAME_S)."""
        self._stats = RunningStats()
        self._shown: tuple[str | None, str | None] = (None, None)
        """The finish label and statistics line on screen."""
        self._stats_fit: tuple[int, int] | None = None
        """The width the statistics line was last measured at, and its height there."""
        self._fence = FenceTracker()
        self._fence.feed(safe_text(reply.text))
        self._reasoning = ReasoningBlock(reply, stable_timings=stable_timings)
        self._token_view: TokenView | None = None
        """The token view once made (see :attr:`token_view`)."""
        self.forks: frozenset[int] = frozenset()
        """Token positions where another branch of the conversation leaves this reply (set
        by the screen before mounting; the token view underlines them)."""
        self.set_reactive(ReplyView.token_mode, token_mode)
        self.set_class(token_mode, "-tokens")

    # ---- typed accessors ----

    @property
    def markdown(self) -> StreamingMarkdown | MarkdownLines:
        """The widget that shows the reply's text (``source`` is the text shown)."""
        assert self._markdown is not None
        return self._markdown

    @property
    def token_view(self) -> TokenView:
        """The reply's token view. A finished reply shown as text has none until something
        asks for it (token mode, the inspector, a fork's cursor): then it is made and mounted
        here. Issue 21: every reply that PageUp brings back into a long chat is mounted, laid
        out and collected again once scrolled away, and a token view it never shows was one
        of its seven widgets."""
        view = self._token_view
        if view is None:
            view = self._new_token_view()
            if self.is_mounted:
                self.mount(view, before=self.query_one(".reply-finish"))
        return view

    def _new_token_view(self) -> TokenView:
        view = TokenView(self.reply.tokens, raw=self.raw)
        view.active = self.token_mode
        view.owner_id = self.id or ""
        view.forks = self.forks
        self._token_view = view
        return view

    @property
    def reasoning_block(self) -> ReasoningBlock:
        """The reply's reasoning (made with the view, so it can be set before mounting;
        mounted only while it has something to show: :meth:`_redraw_reasoning`)."""
        return self._reasoning

    def _wants_reasoning(self) -> bool:
        block = self._reasoning
        return block.streaming or self.reply.finish_reason is None or block.has_reasoning

    def _redraw_reasoning(self) -> None:
        """Redraw the reasoning block, mounting it under the header first if it now has
        something to show. A finished reply without reasoning has none mounted: one widget
        fewer to mount, lay out and collect for every reply that PageUp brings back (issue
        21)."""
        block = self._reasoning
        if block.parent is None and self.is_mounted and self._wants_reasoning():
            self.mount(block, after=self.children[0])
        block.redraw()

    def compose(self) -> ComposeResult:
        yield Static(Content(self.label), classes="reply-header")
        if self._wants_reasoning():
            yield self._reasoning
        text = safe_text(self.reply.text)
        # a finished reply is drawn from its text (issue 21: a streaming Markdown keeps
        # ~12,000 objects alive per reply); one still streaming, or empty, streams
        self._markdown = (MarkdownLines(text) if self.reply.finish_reason is not None
                          else StreamingMarkdown(text))
        yield self._markdown
        if self._token_view is not None:
            yield self._token_view
        elif self.token_mode or self.reply.finish_reason is None:  # shown, or streams
            yield self._new_token_view()
        yield Static(classes="reply-finish")
        yield PartsLine(classes="reply-stats")

    def on_mount(self) -> None:
        if self._token_view is not None:
            self._token_view.sync()
        self.refresh_stats()

    # ---- streaming ----

    def begin(self) -> None:
        """Start (or resume, for /continue) streaming into this view."""
        self._streaming = True
        if self._markdown is not None and not isinstance(self._markdown, StreamingMarkdown):
            self._restoring = self._swap_markdown(StreamingMarkdown(safe_text(self.reply.text)))
        self._first_token_at = None
        self._streamed = 0
        self.reasoning_block.streaming = True
        self._redraw_reasoning()
        self.token_view.set_active(self.token_mode)  # the stream's tokens go there (made now)
        if self._clock is None:
            self._clock = self.set_interval(FRAME_S, self._frame, name="reply-frame")
        self._set_step(self._growth_step())
        self.refresh_stats()

    def _growth_step(self) -> int:
        """Lines a streaming reply grows by at once: a part of the height it scrolls in."""
        scroller = next((a for a in self.ancestors if isinstance(a, Widget)
                         and a.is_scrollable), None)
        height = scroller.scrollable_content_region.height if scroller is not None else 0
        low, high = STEP_RANGE
        return max(low, min(high, (height or self.app.size.height) // STEP_FRACTION))

    def _set_step(self, step: int) -> None:
        if isinstance(self._markdown, StreamingMarkdown):
            self._markdown.set_step(step)
        if self._token_view is not None:
            self._token_view.set_step(step)

    def _swap_markdown(self, new: StreamingMarkdown | MarkdownLines) -> AwaitMount:
        """Show the text with ``new`` instead of the widget that shows it now."""
        old = self._markdown
        self._markdown = new
        mounted = self.mount(new, before=old) if old is not None and old.parent is self \
            else self.mount(new, after=self._reasoning if self._reasoning.parent is self
                            else self.children[0])
        if old is not None:
            old.remove()
        return mounted

    async def add(self, delta: TokensAdded) -> None:
        """Show tokens the recorder just added to the reply; they reach the screen on the
        next frame of the streaming clock (or at once when the view is not streaming)."""
        if self._first_token_at is None:
            self._first_token_at = time.perf_counter()
        self._streamed += len(delta.tokens)
        self.token_view.append(delta.tokens)
        text = delta.text
        if text:
            self._pending.append(text)
            self._fence.feed(text)
        if self.token_mode:
            self.token_view.sync(redraw=self._clock is None)
        if self._clock is None:  # not streaming (a caller outside begin/end): show it now
            await self._frame(force=True)

    async def show(self, delta: Delta) -> None:
        """Show one delta of the streaming loop (a single reply is row 0 of its generation;
        its end is shown by :meth:`end`, after the loop)."""
        if isinstance(delta, TokensAdded):
            await self.add(delta)

    async def _frame(self, force: bool = False) -> None:
        """One frame of a streaming reply: what changed since the last one goes to the screen
        together (the token view, then the Markdown when its interval is up, then the
        statistics line when STATS_S is up)."""
        now = time.monotonic() + FRAME_S / 2  # due within half a frame: now
        if not self.token_mode:
            self._redraw_reasoning()
        if self.token_mode:
            self.token_view.flush()
        elif self._pending and (force or now >= self._last_write + self._fence.interval()):
            # the Markdown is appended at most every MARKDOWN_S (more rarely inside a long
            # open code fence, which is re-highlighted in full per append); a hidden Markdown
            # waits until it is shown
            await self._write_pending()
        if force or now >= self._last_stats + STATS_S:
            self.refresh_stats()

    async def _write_pending(self) -> None:
        self._last_write = time.monotonic()
        if self._pending and self._streaming:
            text = "".join(self._pending)
            self._pending.clear()
            markdown = self._markdown
            assert isinstance(markdown, StreamingMarkdown)
            markdown.append(safe_text(text))

    async def end(self) -> None:
        """The reply finished: its text is drawn from ``reply.text`` by a
        :class:`MarkdownLines` from now on (the streaming Markdown goes)."""
        try:
            if self._clock is not None:
                self._clock.stop()
                self._clock = None
            await self._write_pending()
            if self._restoring is not None:
                restoring, self._restoring = self._restoring, None
                await restoring
            self._streaming = False
            self.reasoning_block.streaming = False
            self._redraw_reasoning()
            view = self.token_view
            view.sync()
            view.tokens.compact()
            self._set_step(0)
            await self._swap_markdown(MarkdownLines(safe_text(self.reply.text)))
            self.token_view.flush()
            self.refresh_stats()
        finally:
            self._streaming = False
            self._set_step(0)  # exactly as tall as the reply again

    def on_unmount(self) -> None:
        if self._clock is not None:
            self._clock.stop()
            self._clock = None

    async def rebuild(self) -> None:
        """Show ``reply`` afresh (its tokens were replaced, e.g. continue-from-alternative)."""
        self.markdown.update(safe_text(self.reply.text))
        self._stats = RunningStats()
        self._fence = FenceTracker()
        self._fence.feed(safe_text(self.reply.text))
        if self._token_view is not None:  # (one made later reads the reply's tokens)
            self._token_view.set_tokens(self.reply.tokens)
        self._redraw_reasoning()
        self.refresh_stats()

    # ---- stats ----

    def refresh_stats(self) -> None:
        """Redraw the finish marker and the statistics line."""
        self._last_stats = time.monotonic()
        reply = self.reply
        live = None
        if self._first_token_at is not None and self._streamed > 1:
            elapsed = time.perf_counter() - self._first_token_at
            live = (self._streamed - 1) / elapsed if elapsed > 0 else None
        finish = self.query_one(".reply-finish", Static)
        if reply.finish_reason is None:
            label = "generating…" if self._streaming else ""
        elif reply.finish_reason == "error":
            label = f"✗ {reply.error or 'failed'}"
        elif reply.finish_reason == "length" and reply.usage and reply.usage.filled_context:
            # ended at the context's end: /continue goes on only as far as older turns can be
            # left out (a one-turn reply has no room left), so it is not offered
            label = "✂ " + finish_words("length", reply.usage)
        else:
            label = self.finish_labels.get(reply.finish_reason, "")
        if label != self._shown[0]:  # an update is a layout: only when it changed
            finish.update(Content(label))
            finish.set_class(reply.finish_reason == "error", "-error")
            finish.display = bool(label)
        stats = self.query_one(".reply-stats", PartsLine)
        parts = reply_stats_parts(reply, live_rate=live, running=self._stats,
                                  stable_timings=self.stable_timings)
        line = " · ".join(parts)
        if line != self._shown[1]:
            pieces = [(p, " · ") for p in parts[:-1]] + [(parts[-1], "")]
            # a layout of the conversation only when the line's height changes
            width = stats.content_region.width
            fit = (width, stats.height_at(width, pieces)) if width > 0 else None
            same = fit is not None and fit == self._stats_fit and stats.display
            stats.show(pieces, layout=not same)
            self._stats_fit = fit
        stats.display = bool(reply.tokens) or reply.finish_reason is not None
        self._shown = (label, line)

    # ---- view switches ----

    def watch_token_mode(self, on: bool) -> None:
        self.set_class(on, "-tokens")
        if not on:
            self._redraw_reasoning()
        if on or self._token_view is not None:
            self.token_view.set_active(on)  # hidden, it keeps no units; shown, makes them
        if not on and self._pending:
            self.call_later(self._write_pending)

    def watch_raw(self, on: bool) -> None:
        if self._token_view is not None:  # (one made later reads ``raw``)
            self._token_view.reset(raw=on)
