"""A reply's reasoning, in a block of its own above the answer.

While the model reasons, the block streams its reasoning live under a "Reasoning…" line;
once the answer starts (or the reply ends) it folds to one line,
``▸ Reasoning · N tokens · 3.2 s``. A click on it, or F4 (``/reasoning``) for the last reply,
unfolds it (``▾``) and folds it again. The text is the recorder's ``Reply.reasoning`` (split on
token ids by the engine, see ``inference.reasoning``), drawn as plain text: model output is
data, never markup. The token view shows the same tokens in italics.
"""

from __future__ import annotations

import time

from textual import events
from textual.content import Content
from textual.widgets import Static

from ..conversation import Reply, has_reasoning, reasoning_count
from .text import safe_text, tokens_label

LIVE_TAIL = 1200
"""While the reasoning streams, the block shows its last this many characters (from a line or
word boundary): a Static re-wraps its whole text on each update (90 ms for 5,000 tokens here,
see docs), so a long reasoning redrawn 10 times a second in full would hold the screen up.
Unfolded after it ends, it shows all of it once."""


def live_tail(text: str, limit: int = LIVE_TAIL) -> str:
    """The end of ``text`` that the streaming block shows ("…" before a cut)."""
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    sep = "\n" if "\n" in tail[: limit // 2] else " "
    return "…" + tail[tail.find(sep) + 1:]  # (find gives -1 when there is no separator)


def reasoning_summary(reply: Reply, *, open_: bool, live_s: float | None = None,
                      streaming: bool = False, stable_timings: bool = False) -> str:
    """The block's first line: fold marker, token count, duration."""
    n = reasoning_count(reply.tokens)
    thinking = streaming and not reply.text and reply.finish_reason is None
    parts = ["Reasoning…" if thinking else "Reasoning", tokens_label(n)]
    seconds = reply.reasoning_s if reply.reasoning_s is not None else live_s
    if stable_timings:
        parts.append("– s")
    elif seconds is not None:
        parts.append(f"{seconds:.1f} s")
    return ("▾ " if open_ else "▸ ") + " · ".join(parts)


class ReasoningBlock(Static):
    """The reasoning of one reply (see the module docstring). The reply view calls
    :meth:`redraw` on its frames; a click toggles it."""

    DEFAULT_CSS = """
    ReasoningBlock { height: auto; padding: 0 1; color: $text-muted; }
    ReasoningBlock.-empty { display: none; }
    ReasoningBlock.-open { margin-bottom: 1; }
    ReasoningBlock > .reasoning--summary { text-style: bold; }
    """

    def __init__(self, reply: Reply, *, stable_timings: bool = False) -> None:
        super().__init__(classes="-empty")
        self.reply = reply
        self.stable_timings = stable_timings
        self.expanded: bool | None = None
        """Set by the user (click, F4); None: open until the answer starts (so a reply
        stopped inside its reasoning shows it), folded from then on."""
        self.streaming = False
        self._began: float | None = None
        self._shown: tuple[str, str] | None = None

    @property
    def has_reasoning(self) -> bool:
        return bool(self.reply.reasoning) or has_reasoning(self.reply.tokens)

    @property
    def is_open(self) -> bool:
        if self.expanded is not None:
            return self.expanded
        return not self.reply.text.strip()

    def on_mount(self) -> None:
        self.redraw()

    def toggle(self) -> None:
        """Fold or unfold."""
        self.expanded = not self.is_open
        self.redraw()

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.toggle()

    def redraw(self) -> None:
        """Show the reply's reasoning as it is now (cheap when nothing changed)."""
        has = self.has_reasoning
        self.set_class(not has, "-empty")
        if not has:
            return
        if self.streaming and self._began is None:
            self._began = time.monotonic()
        live = (time.monotonic() - self._began
                if self._began is not None and self.reply.reasoning_s is None else None)
        open_ = self.is_open
        head = reasoning_summary(self.reply, open_=open_, live_s=live, streaming=self.streaming,
                                 stable_timings=self.stable_timings)
        body = ""
        if open_:
            text = self.reply.reasoning.strip("\n")
            if self.streaming and self.expanded is None:
                text = live_tail(text)
            body = safe_text(text)
        if (head, body) == self._shown or not self.is_mounted:
            return
        self._shown = (head, body)
        self.set_class(bool(body), "-open")
        content = Content.styled(head, "bold")
        if body:
            content = Content.assemble(content, "\n", Content.styled(body, "italic"))
        self.update(content)
