"""The conversation the app shows and transcripts store: plain, mutable, UI-free data.

A conversation is a system prompt and a list of entries. A user entry has text; an assistant
entry has one reply, or several (a comparison group) of which ``chosen`` continues the chat.
An assistant entry's text is derived from its chosen reply (never copied, so never stale).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Iterable, Literal, Sequence

from inference.settings import SamplingParams
from inference.types import FinishReason, Message, Token, Usage

from .token_records import TokenRecords


def visible_text(tokens: Iterable[Token], channel: str = "answer") -> str:
    """The text that ``tokens`` show in a reply's ``channel`` (special tokens are not part of
    it): the one rule by which a reply's text (its answer) and its reasoning are built from
    its tokens."""
    return "".join(t.text for t in tokens if not t.special and t.channel == channel)


@dataclass
class Reply:
    """One assistant reply (one column of a comparison)."""

    settings: SamplingParams
    text: str = ""
    tokens: TokenRecords = field(default_factory=TokenRecords)
    """The reply's tokens in columns (a list of tokens given here is converted): a finished
    reply keeps ~20 objects for its tokens instead of ~7 per token (issue 21)."""
    finish_reason: FinishReason | None = None
    """None while it is still streaming."""
    usage: Usage | None = None
    error: str = ""
    reasoning: str = ""
    """The reasoning before the answer (``<think>...</think>``, harmony's analysis channel);
    ``text`` is the answer alone."""
    reasoning_s: float | None = None
    """How long the reasoning took (first reasoning token to the first answer token); None
    when unknown (a loaded reply, a reply without reasoning)."""

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, TokenRecords):
            self.tokens = TokenRecords(self.tokens)

    @property
    def logprobs(self) -> list[float]:
        tokens = _records(self.tokens)
        return [lp for i in range(len(tokens))
                if not tokens.is_special(i) and (lp := tokens.logprob_at(i)) is not None]

    @property
    def mean_logprob(self) -> float | None:
        lps = self.logprobs
        return sum(lps) / len(lps) if lps else None

    @property
    def perplexity(self) -> float | None:
        m = self.mean_logprob
        return None if m is None else math.exp(-m)

    @property
    def least_likely(self) -> Token | None:
        tokens = _records(self.tokens)
        cands = [(lp, i) for i in range(len(tokens))
                 if not tokens.is_special(i) and (lp := tokens.logprob_at(i)) is not None]
        return tokens[min(cands)[1]] if cands else None


def reasoning_count(tokens: Sequence[Token]) -> int:
    """How many tokens of reasoning text ``tokens`` hold (markers not counted)."""
    if isinstance(tokens, TokenRecords):
        return tokens.reasoning_count()
    return sum(1 for t in tokens if t.channel == "reasoning" and not t.special)


def has_reasoning(tokens: Sequence[Token]) -> bool:
    if isinstance(tokens, TokenRecords):
        return tokens.has_reasoning
    return any(t.channel == "reasoning" for t in tokens)


def _records(tokens: Sequence[Token]) -> TokenRecords:
    """``tokens`` as columns (a reply whose tokens were set to a list after it was made)."""
    return tokens if isinstance(tokens, TokenRecords) else TokenRecords(tokens)


@dataclass
class Entry:
    """One message in the conversation."""

    role: Literal["user", "assistant"]
    text: str = ""  # a property below: stored for user entries, derived for assistant ones
    time: float = field(default_factory=time.time)
    replies: list[Reply] = field(default_factory=list)
    chosen: int = 0

    @property
    def reply(self) -> Reply | None:
        """The reply the conversation continues with (assistant entries)."""
        if self.role != "assistant" or not self.replies:
            return None
        return self.replies[self.chosen]

    @property
    def content(self) -> str:
        """What the entry says (the same as :attr:`text`)."""
        return self.text

    @property
    def is_comparison(self) -> bool:
        return len(self.replies) > 1


def _entry_text(self: Entry) -> str:
    """The user's text; for an assistant entry, the chosen reply's text (derived)."""
    reply = self.reply
    return reply.text if reply is not None else self._text  # type: ignore[attr-defined]


def _set_entry_text(self: Entry, value: str) -> None:
    # Kept for user entries (and an assistant entry without replies); an assistant entry
    # with replies shows its chosen reply's text whatever was given here.
    self._text = value  # type: ignore[attr-defined]


# After @dataclass has read the field's default: the generated __init__, __eq__ and __repr__
# go through the property, so Entry(role, text=...) keeps working and equality compares what
# the entry says.
Entry.text = property(_entry_text, _set_entry_text)  # type: ignore[assignment,method-assign]


def entry_message(entry: Entry) -> Message:
    """The message an entry sends to the model: an assistant reply's reasoning goes with it,
    for the chat template to keep or leave out (``inference.chat``)."""
    reply = entry.reply
    return Message(entry.role, entry.content, reply.reasoning if reply is not None else "")


@dataclass
class ModelRef:
    """Which model made a conversation (as recorded in a transcript)."""

    name: str = ""
    checkpoint: str = ""
    weights_hash: str = ""
    dtype: str = ""
    backend: str = "local"
    url: str = ""


@dataclass
class Conversation:
    """A whole chat."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: float = field(default_factory=time.time)
    title: str = ""
    system_prompt: str = ""
    entries: list[Entry] = field(default_factory=list)
    model: ModelRef = field(default_factory=ModelRef)
    parent: str = ""
    """The id of the conversation this one is a branch of ("" for none): a branch is made when
    saving under the old id would drop messages its file holds (see chatui.transcript.identity)."""
    branched_at: int = 0
    """How many messages a branch shares with its parent."""
    mode: str = "chat"
    """"chat", or "raw": a notebook's continuation (raw mode; the user message is the text
    continued, as plain text with no chat template)."""

    def snapshot(self) -> Conversation:
        """A copy that later changes to this conversation do not reach (the token columns
        are copied): what a save on another thread writes."""
        return replace(self, model=replace(self.model), entries=[
            replace(e, replies=[replace(r, tokens=r.tokens.copy()) for r in e.replies])
            for e in self.entries])

    def messages(self) -> tuple[Message, ...]:
        """The role/content messages to send to a model (system prompt first if any)."""
        out: list[Message] = []
        if self.system_prompt:
            out.append(Message("system", self.system_prompt))
        for e in self.entries:
            out.append(entry_message(e))
        return tuple(out)

    def add_user(self, text: str) -> Entry:
        entry = Entry("user", text)
        self.entries.append(entry)
        if not self.title:
            self.title = text.strip().splitlines()[0][:80] if text.strip() else ""
        return entry

    def add_assistant(self, settings: list[SamplingParams]) -> Entry:
        entry = Entry("assistant", replies=[Reply(s) for s in settings])
        self.entries.append(entry)
        return entry

    def clear(self) -> None:
        self.entries.clear()
        self.title = ""

    @property
    def last_user(self) -> Entry | None:
        return next((e for e in reversed(self.entries) if e.role == "user"), None)

    @property
    def last_assistant(self) -> Entry | None:
        return next((e for e in reversed(self.entries) if e.role == "assistant"), None)
