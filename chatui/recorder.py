"""The only code that changes replies from engine events: :class:`ReplyRecorder`.

A generation is a comparison of N rows; a single reply is a comparison of one row, so the
chat and compare mode share this recorder and the screen's one loop over engine events. Each
event is applied to the replies here, and comes out as an immutable delta that the widgets
render (they never read the events, nor build a reply's text themselves). UI-free.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Sequence

from inference.types import AssistantPrefix, Failed, RowDone, Started, Token, TokenBatch, Usage

from .conversation import Reply, visible_text
from .token_records import TokenRecords


@dataclass(frozen=True)
class TokensAdded:
    """Tokens appended to row ``row``'s reply (positions counted in the whole reply)."""

    row: int
    tokens: tuple[Token, ...]
    text: str
    """The text they add to the reply's answer (built by :func:`visible_text`, once)."""
    reasoning: str = ""
    """The text they add to the reply's reasoning."""


@dataclass(frozen=True)
class RowEnded:
    """Row ``row`` left the batch (its finish reason and usage are on its reply)."""

    row: int


@dataclass(frozen=True)
class ContextReported:
    """The engine said how the prompt fitted the context (once, before the first token)."""

    prompt_tokens: int
    context_limit: int
    dropped_messages: int


Delta = TokensAdded | RowEnded | ContextReported


def joined_usage(before: Usage, now: Usage) -> Usage:
    """A continued reply's usage: its first request's prompt, cache and time to first token,
    the two parts' tokens, and its decode rate over both parts' decoding (each part's tokens
    after its first; the continuation's first token came after a prefill of the reply so far,
    as a first token does). The continuation's own usage alone made a reply continued after a
    cut-off read "TTFT 0.01s" (from the cached prefix), not the 0.2 s its first token took."""
    def spent(u: Usage) -> tuple[int, float]:
        n = max(u.completion_tokens - 1, 0)
        return (n, n / u.decode_tokens_per_s) if n and u.decode_tokens_per_s > 0 else (0, 0.0)

    (n1, t1), (n2, t2) = spent(before), spent(now)
    return Usage(before.prompt_tokens, before.completion_tokens + now.completion_tokens,
                 before.cached_tokens, before.ttft_s,
                 (n1 + n2) / (t1 + t2) if t1 + t2 > 0 else 0.0, now.context_limit)


class ReplyRecorder:
    """Applies one generation's engine events to its replies (one per row).

    A reply that already has tokens (``/continue``, continue-from-alternative) is continued:
    new tokens are numbered after the ones it has, and a row's final text (``RowDone.text``,
    which may be the engine's detokenisation of the new tokens only, or of the whole reply)
    is put after the text it had.
    """

    def __init__(self, replies: Sequence[Reply]) -> None:
        self.replies = list(replies)
        self._base_tokens = [len(r.tokens) for r in self.replies]
        self._base_text = [r.text for r in self.replies]
        self._reasoning_from: list[float | None] = [None] * len(self.replies)
        """When each row's reasoning began streaming (until its answer starts)."""
        self._ended_as = [(r.finish_reason, r.usage, r.error) for r in self.replies]
        """How each reply had ended before this generation (None: it had not)."""

    def begin(self) -> None:
        """The generation starts: every reply is unfinished again."""
        for reply in self.replies:
            reply.finish_reason, reply.usage, reply.error = None, None, ""

    def apply(self, event: object) -> Delta | None:
        """Apply one engine event; returns what changed, or None (nothing to show)."""
        if isinstance(event, TokenBatch):
            if not 0 <= event.row < len(self.replies):
                return None
            reply = self.replies[event.row]
            tokens = _reindex(event.tokens, self._base_tokens[event.row])
            text = visible_text(tokens)
            reasoning = ""
            if any(t.channel == "reasoning" for t in tokens):
                reasoning = visible_text(tokens, "reasoning")
                reply.reasoning += reasoning
                if self._reasoning_from[event.row] is None:
                    self._reasoning_from[event.row] = time.monotonic()
            reply.tokens.extend(tokens)
            reply.text += text
            if any(t.channel == "answer" and not t.special for t in tokens):
                self._reasoning_ended(event.row)
            return TokensAdded(event.row, tokens, text, reasoning)
        if isinstance(event, RowDone):
            if not 0 <= event.row < len(self.replies):
                return None
            reply = self.replies[event.row]
            self._reasoning_ended(event.row)
            reply.tokens.compact()  # finished: its strings joined, one per column
            reply.finish_reason = event.finish_reason
            before = self._ended_as[event.row][1]
            reply.usage = (joined_usage(before, event.usage)
                           if before is not None and self._base_tokens[event.row]
                           else event.usage)
            base = self._base_text[event.row]
            if event.text and event.text != reply.text[len(base):]:
                reply.text = (event.text if base and event.text.startswith(base)
                              else base + event.text)
            return RowEnded(event.row)
        if isinstance(event, Started):
            return ContextReported(event.prompt_tokens, event.context_limit,
                                   event.dropped_messages)
        if isinstance(event, Failed):
            self.fail(event.message)
        return None

    def _reasoning_ended(self, row: int) -> None:
        """The row's answer began (or the row ended): its reasoning took until now."""
        began = self._reasoning_from[row]
        if began is not None:
            reply = self.replies[row]
            reply.reasoning_s = (reply.reasoning_s or 0.0) + time.monotonic() - began
            self._reasoning_from[row] = None

    def fail(self, message: str) -> None:
        """The generation failed: every row still running ends with ``message``."""
        for reply in self.replies:
            if reply.finish_reason is None:
                reply.finish_reason, reply.error = "error", message

    def keep_unchanged(self) -> bool:
        """After a generation that failed before any row's first token: each reply that had
        ended before it (``/continue`` of a stopped or cut-off reply) ends as it did, its
        finish reason, usage and error back (a continuation the context had no room for marked
        the reply "failed" and it was saved so). True if any reply was put back."""
        if self.produced:
            return False
        kept = False
        for reply, (reason, usage, error) in zip(self.replies, self._ended_as):
            if reason is not None and reply.finish_reason == "error":
                reply.finish_reason, reply.usage, reply.error = reason, usage, error
                kept = True
        return kept

    def finish(self) -> bool:
        """The generation is over: rows still running were stopped. True if there were any
        (the caller cancels the stream)."""
        running = [r for r in self.replies if r.finish_reason is None]
        for row in range(len(self.replies)):
            self._reasoning_ended(row)
        for reply in running:
            reply.finish_reason = "cancelled"
        for reply in self.replies:
            reply.tokens.compact()
        return bool(running)

    @property
    def produced(self) -> bool:
        """Whether any row got a token in this generation."""
        return any(len(r.tokens) > base for r, base in zip(self.replies, self._base_tokens))

    @property
    def failed_rows(self) -> list[int]:
        return [i for i, r in enumerate(self.replies) if r.finish_reason == "error"]


WITNESSES = 8
"""How many of a prefix's tokens give their alternatives as :func:`spellings`."""


def prefix_of(reply: Reply, witnesses: TokenRecords | None = None) -> AssistantPrefix:
    """What the engine continues ``reply`` from: its token ids when every one is known, with
    :func:`spellings` from its tokens (or from ``witnesses``, tokens of the same model)."""
    ids = reply.tokens.ids()
    if any(i is None for i in ids):
        return AssistantPrefix(reply.text)
    spelled = spellings(reply.tokens if witnesses is None else witnesses)
    return AssistantPrefix(reply.text, ids, spelled)  # type: ignore[arg-type]


def spellings(tokens: TokenRecords, end: int | None = None) -> tuple[tuple[int, str], ...]:
    """The alternatives (id, spelling) of up to :data:`WITNESSES` tokens among the first
    ``end``, spread over them, the last one always: the engine takes a prefix's ids only
    where its tokenizer spells these alike (a reply loaded from a conversation made with
    another model carries that model's ids; see ``AssistantPrefix.spellings``)."""
    n = len(tokens) if end is None else min(end, len(tokens))
    picks = sorted({n - 1 - (i * n) // WITNESSES for i in range(min(n, WITNESSES))})
    return tuple((a.id, a.text) for i in picks for a in tokens.alternatives(i)
                 if a.id is not None and a.text is not None)


def branch(reply: Reply, position: int, rank: int) -> AssistantPrefix:
    """Cut ``reply`` after token ``position``, replaced by its alternative ``rank``
    (1-based, checked by the caller), and return the prefix to continue from."""
    token = reply.tokens[position]
    alt = token.top[rank - 1]
    chosen = Token(index=position, id=alt.id, text=alt.text, logprob=alt.logprob,
                   entropy=token.entropy, top=token.top, channel=token.channel)
    reply.tokens.truncate(position)
    reply.tokens.append(chosen)
    reply.text = reply.tokens.text()
    reply.reasoning = reply.tokens.text(channel="reasoning")
    reply.finish_reason = None
    reply.usage = None
    return prefix_of(reply)


def _reindex(tokens: tuple[Token, ...], offset: int) -> tuple[Token, ...]:
    """Tokens with positions counted from the start of the whole reply, not the request."""
    if offset == 0:
        return tuple(tokens)
    return tuple(dataclasses.replace(
        t, index=t.index + offset,
        glyph_start=None if t.glyph_start is None else t.glyph_start + offset) for t in tokens)
