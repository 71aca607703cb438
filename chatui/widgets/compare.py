"""A comparison group: N replies to the same conversation side by side, one column each.

Each column reuses :class:`~chatui.widgets.reply.ReplyView` (streamed Markdown, the token view,
the per-reply statistics) under a header with the column's number, the settings that differ
between columns, a "deterministic" mark for greedy rows and the finish state. The group marks
the first token position where the columns diverge, in every column.

Attributes down, messages up: the chat screen's streaming loop hands each delta of the
:class:`~chatui.recorder.ReplyRecorder` to :meth:`CompareView.show`; the screen calls
:meth:`CompareView.refresh_chosen` after ``entry.chosen`` (the one owner of the choice)
changed; a click on a column's header posts :class:`CompareView.Picked`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Awaitable, Sequence

from textual import events
from textual.app import ComposeResult
from textual.containers import HorizontalScroll, Vertical
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Static

from inference.settings import SamplingParams, does_nothing, setting_words

from ..conversation import Entry, Reply, first_divergence
from ..recorder import Delta, RowEnded, TokensAdded
from .reply import COLUMN_FINISH_LABELS, ReplyView
from .text import show_token

MIN_COLUMN = 30
"""Narrowest a column gets side by side; below two of these the columns stack."""

_STATE = {None: "…", "stop": "✓ stop", "length": "✂ length", "cancelled": "■ stopped",
          "error": "✗ error"}


def column_labels(settings: Sequence[SamplingParams]) -> tuple[list[str], str]:
    """(one label per column with only the settings that differ, the shared settings), in the
    status bar's words (``temp 0.2``, ``max 512``: what ``/set`` and ``/compare`` take); a
    shared setting that does nothing (top_p 1, rep 1...) is left out, a differing one is not
    ("top_p 0.9" against "top_p 1")."""
    names = [f.name for f in dataclasses.fields(SamplingParams)]
    varying = [n for n in names if len({repr(getattr(s, n)) for s in settings}) > 1]
    labels = [", ".join(setting_words(n, getattr(s, n)) for n in varying
                         if not (n in ("seed", "reasoning_budget") and getattr(s, n) is None))
              or "same settings" for s in settings]
    first = settings[0]
    shared = ", ".join(setting_words(n, getattr(first, n)) for n in names
                       if n not in varying and not does_nothing(n, getattr(first, n)))
    return labels, shared


class DivergenceLine(Widget):
    """A column's "⑂ diverges at token N: ' custom'": the token moves to a line of its own
    where the column is too narrow for both, instead of the line wrapping at the token's own
    leading space ("⑂ diverges at token 2: '" above "custom'", seen in tmux at 100 columns)."""

    DEFAULT_CSS = "DivergenceLine { height: auto; }"

    parts: reactive[tuple[Content, Content]] = reactive((Content(""), Content("")), layout=True)
    """The lead ("⑂ diverges at token 2: ") and the token label ("' custom'", bold)."""

    def render(self) -> Content:
        lead, token = self.parts
        width = self.content_region.width
        if not width or lead.cell_length + token.cell_length <= width or not token:
            return lead + token
        return Content.assemble(lead.rstrip(), "\n", token)


class CompareColumn(Vertical):
    """One column: header, divergence mark, and the reply view."""

    DEFAULT_CSS = """
    CompareColumn { height: auto; width: 30; padding: 0 1 0 0; }
    CompareColumn > .column-header { height: auto; color: $text-muted; }
    CompareColumn > .column-meta { height: auto; color: $text-muted; }
    CompareColumn > .column-divergence { height: auto; color: $text-muted; }
    CompareColumn.-chosen > .column-header { color: $accent; text-style: bold; }
    CompareColumn > ReplyView > .reply-header { display: none; }
    """

    def __init__(self, entry: Entry, index: int, label: str, view: ReplyView) -> None:
        super().__init__(classes="compare-column")
        self.entry = entry
        self.index = index
        self.reply = entry.replies[index]
        self.label = label
        self.view = view
        self.divergence: int | None = None

    def compose(self) -> ComposeResult:
        yield Static(classes="column-header")
        yield Static(classes="column-meta")
        yield DivergenceLine(classes="column-divergence")
        yield self.view

    def on_mount(self) -> None:
        self.refresh_header()
        self.refresh_divergence()

    @property
    def chosen(self) -> bool:
        """Whether the conversation continues with this column (``entry.chosen``)."""
        return self.entry.chosen == self.index

    def refresh_header(self) -> None:
        """Redraw the header (number, settings, chosen mark) and the meta line."""
        mark = " ★" if self.chosen else ""
        self.query_one(".column-header", Static).update(
            Content(f"[{self.index + 1}]{mark} {self.label}"))
        self.set_class(self.chosen, "-chosen")
        self.refresh_meta()

    def refresh_meta(self) -> None:
        """The finish state, the deterministic mark and where the columns diverge."""
        parts: list[Content | str] = [_STATE.get(self.reply.finish_reason, "")]
        if self.reply.settings.greedy:
            parts.append("deterministic")
        self.query_one(".column-meta", Static).update(Content(" · ").join(parts))
        self.refresh_divergence()

    def refresh_divergence(self) -> None:
        """Mark the first token where the columns differ (this column's token there)."""
        pos = self.divergence
        tokens = self.reply.tokens
        line = self.query_one(".column-divergence", DivergenceLine)
        if pos is not None:
            what = ("ends here" if pos >= len(tokens)
                    else show_token(tokens[pos].raw if tokens[pos].special else tokens[pos].text))
            line.parts = (Content.assemble(("⑂ ", "$warning"), f"diverges at token {pos + 1}: "),
                          Content.styled(what, "bold"))
        elif self.reply.finish_reason is not None and tokens:
            line.parts = (Content("= same tokens as every column"), Content(""))
        else:
            line.parts = (Content(""), Content(""))

    def on_click(self, event: events.Click) -> None:
        if event.widget is not None and event.widget.has_class("column-header"):
            event.stop()
            self.post_message(CompareView.Picked(self.parent_view, self.index))

    @property
    def parent_view(self) -> CompareView:
        node = self.parent
        while node is not None and not isinstance(node, CompareView):
            node = node.parent
        assert node is not None
        return node


class CompareView(Vertical):
    """The columns of one comparison group (an assistant entry with several replies).

    Args:
        entry: the assistant entry; its ``replies`` are the columns (shared, not copied).
        view_ids: an id for each column's reply view (the chat screen's ids).
    """

    DEFAULT_CSS = """
    CompareView { height: auto; }
    CompareView > .compare-header { height: auto; color: $text-muted; }
    CompareView > HorizontalScroll { height: auto; scrollbar-size-horizontal: 1; }
    CompareView.-stacked > HorizontalScroll { layout: vertical; }
    CompareView.-stacked CompareColumn { margin: 0 0 1 0; }
    CompareView.-rows > HorizontalScroll { layout: grid; grid-rows: auto; grid-gutter: 1 0; }
    """

    @dataclass
    class Picked(Message):
        """The user clicked a column's header to continue with that reply."""

        view: CompareView
        column: int

    def __init__(self, entry: Entry, *, view_ids: Sequence[str], stable_timings: bool = False,
                 token_mode: bool = False, raw: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.entry = entry
        labels, self.shared = column_labels([r.settings for r in entry.replies])
        if entry.fan_out:  # one setting; the columns are the alternatives, most likely first
            labels = [f"alternative {i + 1}" for i in range(len(entry.replies))]
        views = []
        for reply, vid in zip(entry.replies, view_ids):
            view = ReplyView(reply, label="", stable_timings=stable_timings,
                             token_mode=token_mode, id=vid,
                             finish_labels=COLUMN_FINISH_LABELS)
            view.raw = raw
            views.append(view)
        self.columns = [CompareColumn(entry, i, labels[i], views[i])
                        for i in range(len(entry.replies))]
        self._agreed = 0
        self._ended: set[int] = set()
        self.mounting: Awaitable[None] | None = None
        """Set by whoever mounts this view, so a worker can wait for the columns to exist."""
        self.divergence: int | None = None

    @property
    def chosen(self) -> int:
        """The column the conversation continues with (``entry.chosen``; read-only here)."""
        return self.entry.chosen

    @property
    def views(self) -> list[ReplyView]:
        return [c.view for c in self.columns]

    def compose(self) -> ComposeResult:
        yield Static(classes="compare-header")
        with HorizontalScroll():
            yield from self.columns

    def on_mount(self) -> None:
        self._refresh_group_header()
        self.update_divergence()

    def on_resize(self, event: events.Resize) -> None:
        self._fit(self.size.width)  # the content width (event.size counts the border)

    def _fit(self, width: int) -> None:
        """Side by side in equal widths where every column gets MIN_COLUMN; else in rows of
        as many as fit, the rows as even as can be (4 columns in 2 rows of 2, not 3 and 1);
        stacked when not even two fit. Every column is in view as the conversation scrolls:
        side by side with a horizontal scroll, the columns past the screen's edge were hidden
        and a long one left the screen blank, its scrollbar at the bottom of the comparison
        (seen in tmux at 80 columns). Widths are set, not ``1fr``: a token view would
        otherwise widen its column to the whole scroll area."""
        n = max(1, len(self.columns))
        fit = max(1, width // MIN_COLUMN)
        if fit >= n:
            per_row = n
        elif fit >= 2:
            row_count = math.ceil(n / fit)
            per_row = math.ceil(n / row_count)
        else:
            per_row = 1
        stacked, rows = per_row == 1 and n > 1, 1 < per_row < n
        self.set_class(stacked, "-stacked")
        self.set_class(rows, "-rows")
        each = max(1, width // per_row)
        scroller = self.query_one(HorizontalScroll)
        if rows:
            scroller.styles.grid_size_columns = per_row
            scroller.styles.grid_columns = f"{each}"
        for col in self.columns:
            col.styles.width = "100%" if stacked else each

    def _refresh_group_header(self) -> None:
        n = len(self.columns)
        what = (f"{n} alternatives of a token decoded in one batch · settings"
                if self.entry.fan_out else f"{n} settings on one prefill · shared")
        text = (f"{what}: {self.shared or '–'} · continuing with [{self.chosen + 1}] "
                "(/pick N, F6 or click a header)")
        self.query_one(".compare-header", Static).update(Content(text))

    # ---- streaming (the screen calls these) ----

    def begin(self) -> None:
        self._ended.clear()
        for c in self.columns:
            c.view.begin()
            c.refresh_header()

    async def show(self, delta: Delta) -> None:
        """Show one delta of the streaming loop in its column."""
        if isinstance(delta, TokensAdded):
            await self.columns[delta.row].view.add(delta)
            self.update_divergence()
        elif isinstance(delta, RowEnded):
            await self.end_column(delta.row)

    async def end_column(self, column: int) -> None:
        """Column ``column`` finished (its row left the batch)."""
        col = self.columns[column]
        self._ended.add(column)
        await col.view.end()
        col.refresh_header()
        self.update_divergence(force=True)

    async def end(self) -> None:
        """Every column finished (or the comparison was stopped)."""
        for col in self.columns:
            if col.index not in self._ended:
                self._ended.add(col.index)
                await col.view.end()
            col.refresh_header()
        self.update_divergence(force=True)

    def update_divergence(self, force: bool = False) -> None:
        """Recompute the first divergent position (incrementally) and mark it in each column."""
        if self.divergence is not None and not force:
            return
        if self.divergence is None:
            pos, self._agreed = first_divergence(self.entry.replies, self._agreed)
            self.divergence = pos
        for col in self.columns:
            if col.divergence != self.divergence or force:
                col.divergence = self.divergence
                if col.is_mounted:
                    col.refresh_divergence()

    # ---- picking ----

    def refresh_chosen(self) -> None:
        """Show ``entry.chosen`` (after it changed)."""
        for c in self.columns:
            c.refresh_header()
        self._refresh_group_header()

    def jump_to_divergence(self) -> None:
        """Put each column's token cursor on the divergent token (token view)."""
        if self.divergence is None:
            return
        for col in self.columns:
            units = col.view.token_view.units
            for i, unit in enumerate(units):
                if unit.end >= self.divergence:
                    col.view.token_view.cursor = i
                    break
