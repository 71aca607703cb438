"""The conversation the app shows and transcripts store: plain, mutable, UI-free data.

A conversation is a system prompt and a tree of entries (issue 18): retry, edit,
continue-from-alternative and opening an older copy add a sibling instead of replacing, so no
reply is ever lost. Each entry's children are the alternatives for the next message and
``active`` names the one the conversation goes on with; :attr:`Conversation.entries`, the
conversation as it is shown and sent to a model, is *derived* from those choices (the chosen
child at each node, from the top), never kept beside them. A user entry has text; an assistant
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
    def token_count(self) -> int:
        """Its tokens that are not special: what its statistics line and the tree count (the
        end-of-turn token is not part of the reply)."""
        tokens = _records(self.tokens)
        return sum(1 for i in range(len(tokens)) if not tokens.is_special(i))

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


def token_key(token: Token) -> object:
    """What makes two tokens the same: the id when known, else the text (servers)."""
    return token.id if token.id is not None else ("text", token.text)


def first_divergence(replies: Sequence[Reply], start: int = 0) -> tuple[int | None, int]:
    """The first token position where the replies differ, and how far they agree so far.

    Returns ``(position, agreed)``: ``position`` is None while every reply agrees on its
    common prefix (and none has ended before another went on); ``agreed`` lets the next call
    start from there.
    """
    lists = [r.tokens for r in replies]
    n = min(len(t) for t in lists)
    i = start
    while i < n:
        key = token_key(lists[0][i])
        if any(token_key(t[i]) != key for t in lists[1:]):
            return i, i
        i += 1
    ended_short = any(r.finish_reason is not None and len(r.tokens) == n for r in replies)
    if ended_short and any(len(t) > n for t in lists):
        return n, n
    return None, n


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
    fan_out: bool = False
    """The replies are a fan-out's branches (issue 18), not yet picked from: /pick turns them
    into siblings (:meth:`Conversation.split`) rather than choosing a comparison column.
    Saved with the message, so a fan-out left unpicked is still one after a reload."""
    node: str = field(default_factory=lambda: new_node_id(), compare=False)
    """The entry's id in the tree (stable across saves: journal lines name the nodes they
    change). Not part of equality: two entries saying the same thing are equal."""
    children: list[Entry] = field(default_factory=list, compare=False, repr=False)
    """The alternatives for the next message, oldest first."""
    active: int = field(default=-1, compare=False)
    """The child the conversation goes on with (-1: it ends here, e.g. after /edit)."""

    @property
    def next(self) -> Entry | None:
        """The chosen child (None: the conversation ends here)."""
        return self.children[self.active] if 0 <= self.active < len(self.children) else None

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


def new_node_id() -> str:
    return uuid.uuid4().hex[:10]


def index_of(items: Sequence[Entry], entry: Entry) -> int:
    """The place of ``entry`` in ``items`` by identity (``list.index`` compares entries by
    what they say, and two alternatives may say the same)."""
    for i, e in enumerate(items):
        if e is entry:
            return i
    raise ValueError("the entry is not there")


def walk(tops: Sequence[Entry]) -> Iterable[tuple[Entry | None, Entry]]:
    """Every entry of a tree as (parent, entry), parents before children (no recursion: a
    conversation hundreds of messages deep is as deep a tree)."""
    stack: list[tuple[Entry | None, Entry]] = [(None, e) for e in reversed(tops)]
    while stack:
        parent, entry = stack.pop()
        yield parent, entry
        stack.extend((entry, c) for c in reversed(entry.children))


def copy_tree(tops: Sequence[Entry]) -> list[Entry]:
    """A copy of a tree that later changes do not reach (node ids and choices kept). Token
    columns are shared until either side changes them (:meth:`TokenRecords.copy`), and each
    entry and reply is copied field by field rather than through ``dataclasses.replace``:
    the autosave snapshots the whole tree on the event loop after every reply, ~10 ms after
    200 replies when the columns were copied, ~2 ms with ``replace``, ~1 ms this way
    (issue 21, ``python -m chatui.transcript.bench``)."""
    copies: dict[int, Entry] = {}
    out: list[Entry] = []
    for parent, e in walk(tops):
        c = _copy(e)
        c.replies = [_copy_reply(r) for r in e.replies]
        c.children = []
        copies[id(e)] = c
        (out if parent is None else copies[id(parent)].children).append(c)
    return out


def _copy(obj: Entry) -> Entry:
    c = object.__new__(Entry)
    c.__dict__.update(obj.__dict__)
    return c


def _copy_reply(r: Reply) -> Reply:
    c = object.__new__(Reply)
    c.__dict__.update(r.__dict__)
    c.tokens = r.tokens.copy() if isinstance(r.tokens, TokenRecords) else TokenRecords(r.tokens)
    return c


def fork_points(conv: Conversation, entry: Entry) -> dict[int, list[tuple[int, str]]]:
    """Where branches leave ``entry``'s reply (continue-from-alternative, fan-out): for each
    token position, the branches that share the reply's tokens before it and differ there,
    as (sibling index, their token's text), the reply's own first. A sibling with nothing in
    common (a plain retry) is no fork."""
    reply = entry.reply
    if reply is None:
        return {}
    mine = _records(reply.tokens)
    kids = conv.siblings(entry)
    own = index_of(kids, entry)
    out: dict[int, list[tuple[int, str]]] = {}
    for i, sibling in enumerate(kids):
        for r in sibling.replies:
            if r is reply:
                continue
            other = _records(r.tokens)
            n = min(len(mine), len(other))
            p = next((j for j in range(n) if mine.text_at(j) != other.text_at(j)
                      or mine[j].id != other[j].id), None)
            if not p:  # nothing shared, or one is the other's start
                continue
            out.setdefault(p, [(own, mine.text_at(p))]).append((i, other.text_at(p)))
    return out


def _same_tree(a: Sequence[Entry], b: Sequence[Entry]) -> bool:
    pairs = [(a, b)]
    while pairs:
        xs, ys = pairs.pop()
        if len(xs) != len(ys):
            return False
        for x, y in zip(xs, ys):
            if not (x == y and x.active == y.active):
                return False
            pairs.append((x.children, y.children))
    return True


@dataclass
class ModelRef:
    """Which model made a conversation (as recorded in a transcript)."""

    name: str = ""
    checkpoint: str = ""
    weights_hash: str = ""
    dtype: str = ""
    backend: str = "local"
    url: str = ""
    quantization: str = ""
    """The weights' format where they were quantized to decode ("int8", "int4"), else ""."""


@dataclass(init=False, eq=False)
class Conversation:
    """A whole chat: a tree of entries and the choices that make its path."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    created: float = field(default_factory=time.time)
    title: str = ""
    system_prompt: str = ""
    tops: list[Entry] = field(default_factory=list)
    """The first messages: the tree's top level (alternatives for the first message)."""
    top: int = -1
    """The top-level entry the conversation starts with (-1: it is empty)."""
    model: ModelRef = field(default_factory=ModelRef)
    parent: str = ""
    """The id of the conversation this one is a branch of ("" for none): a branch is made when
    saving under the old id would drop messages its file holds (see chatui.transcript.identity)."""
    branched_at: int = 0
    """How many messages a branch shares with its parent."""
    mode: str = "chat"
    """"chat", or "raw": a notebook's continuation (raw mode; the user message is the text
    continued, as plain text with no chat template)."""
    deleted: set[str] = field(default_factory=set, compare=False, repr=False)
    """Node ids the user removed (an explicit delete, confirmed, or a failed send given back
    to the prompt box): the only messages a save may drop from a file."""

    def __init__(self, id: str | None = None, created: float | None = None, title: str = "",
                 system_prompt: str = "", tops: list[Entry] | None = None, top: int = -1,
                 model: ModelRef | None = None, parent: str = "", branched_at: int = 0,
                 deleted: set[str] | None = None, *,
                 entries: Sequence[Entry] = (), mode: str = "chat") -> None:
        """The dataclass's fields, and ``entries``: a conversation with one branch whose
        path is those entries (each the chosen child of the one before)."""
        self.id = id if id is not None else uuid.uuid4().hex[:12]
        self.created = created if created is not None else time.time()
        self.title = title
        self.system_prompt = system_prompt
        self.tops = tops if tops is not None else []
        self.top = top
        self.model = model if model is not None else ModelRef()
        self.parent = parent
        self.branched_at = branched_at
        self.deleted = deleted if deleted is not None else set()
        self.mode = mode
        for e in entries:
            self.append(e)

    def __eq__(self, other: object) -> bool:
        """The same fields and the same tree: every entry equal, with its children and
        choices (node ids aside: two trees that say the same are equal)."""
        if not isinstance(other, Conversation):
            return NotImplemented
        return ((self.id, self.created, self.title, self.system_prompt, self.top, self.model,
                 self.parent, self.branched_at, self.mode)
                == (other.id, other.created, other.title, other.system_prompt, other.top,
                    other.model, other.parent, other.branched_at, other.mode)
                and _same_tree(self.tops, other.tops))

    __hash__ = None  # type: ignore[assignment]

    # ---- the path (derived) and the tree ----

    @property
    def entries(self) -> tuple[Entry, ...]:
        """The conversation as shown and sent: from the top, the chosen child at each node.
        A tuple: change the tree through the methods below."""
        out: list[Entry] = []
        e = self.tops[self.top] if 0 <= self.top < len(self.tops) else None
        while e is not None:
            out.append(e)
            e = e.next
        return tuple(out)

    def all_entries(self) -> list[Entry]:
        """Every entry of every branch, parents before children."""
        return [e for _, e in walk(self.tops)]

    def stop_unfinished(self) -> int:
        """Mark the replies that have no finish reason as stopped ("cancelled"); how many.
        A loaded conversation's unfinished reply was streaming when the chatui that saved it
        ended (killed, or its terminal gone): it is kept as a reply stopped, which ``/continue``
        goes on with ("finished on its own", it said, and could not be continued)."""
        n = 0
        for entry in self.all_entries():
            for reply in entry.replies:
                if reply.finish_reason is None:
                    reply.finish_reason = "cancelled"
                    n += 1
        return n

    def parent_of(self, entry: Entry) -> Entry | None:
        """The entry before ``entry`` in its branch (None for a top-level one)."""
        path = self.entries  # the common case, without walking every branch
        for i, e in enumerate(path):
            if e is entry:
                return path[i - 1] if i else None
        for parent, e in walk(self.tops):
            if e is entry:
                return parent
        raise ValueError("the entry is not in this conversation")

    def siblings(self, entry: Entry) -> list[Entry]:
        """``entry`` and its alternatives (the children of its parent), oldest first."""
        parent = self.parent_of(entry)
        return self.tops if parent is None else parent.children

    def _choose(self, parent: Entry | None, index: int) -> None:
        if parent is None:
            self.top = index
        else:
            parent.active = index

    def append(self, entry: Entry) -> Entry:
        """Add ``entry`` after the last message (a new child of it, chosen)."""
        path = self.entries
        parent = path[-1] if path else None
        kids = self.tops if parent is None else parent.children
        kids.append(entry)
        self._choose(parent, len(kids) - 1)
        return entry

    def add_sibling(self, of: Entry, entry: Entry) -> Entry:
        """Add ``entry`` as an alternative to ``of`` and go on with it."""
        parent = self.parent_of(of)
        kids = self.tops if parent is None else parent.children
        kids.append(entry)
        self._choose(parent, len(kids) - 1)
        return entry

    def rewind(self, entry: Entry) -> None:
        """End the conversation before ``entry`` (kept, with what follows, as a branch):
        what /retry and /edit do before the new reply or prompt is added as its sibling."""
        self._choose(self.parent_of(entry), -1)

    def select(self, entry: Entry) -> None:
        """Go on with ``entry``: every node above it chooses the branch that leads to it
        (below it, its own choices stand)."""
        chain: list[Entry] = []
        parent_of: dict[int, Entry | None] = {id(e): p for p, e in walk(self.tops)}
        if id(entry) not in parent_of:
            raise ValueError("the entry is not in this conversation")
        node: Entry | None = entry
        while node is not None:
            chain.append(node)
            node = parent_of[id(node)]
        chain.reverse()
        self.top = index_of(self.tops, chain[0])
        for a, b in zip(chain, chain[1:]):
            a.active = index_of(a.children, b)

    def step_sibling(self, entry: Entry, delta: int) -> Entry:
        """The sibling ``delta`` places from ``entry`` (clamped), chosen."""
        kids = self.siblings(entry)
        i = max(0, min(len(kids) - 1, index_of(kids, entry) + delta))
        self.select(kids[i])
        return kids[i]

    def discard(self, entry: Entry) -> None:
        """Take ``entry`` (and what follows it) out of the tree, leaving saves to keep it in
        the file (see :meth:`delete` for the user's own removal)."""
        parent = self.parent_of(entry)
        kids = self.tops if parent is None else parent.children
        i = index_of(kids, entry)
        chosen = self.top if parent is None else parent.active
        del kids[i]
        self._choose(parent, -1 if chosen == i else chosen - (chosen > i))

    def split(self, group: Entry) -> Entry:
        """Turn the columns of ``group`` (a fan-out) into sibling entries of one reply each,
        in its place, and go on with its chosen column (what followed the group follows
        it). The group's node leaves the tree; every reply stays."""
        parent = self.parent_of(group)
        kids = self.tops if parent is None else parent.children
        i = index_of(kids, group)
        parts = [Entry("assistant", time=group.time, replies=[r]) for r in group.replies]
        chosen = parts[group.chosen]
        chosen.children, chosen.active = group.children, group.active
        kids[i:i + 1] = parts
        self.deleted.add(group.node)
        self.select(chosen)
        return chosen

    def delete(self, entry: Entry) -> None:
        """The user's own removal (the explicit delete, confirmed, or a failed send given
        back to the prompt box): ``entry`` and its branch go, and saves may drop them from
        the file."""
        self.deleted.update(e.node for _, e in walk([entry]))
        self.discard(entry)

    def truncate(self, at: int) -> None:
        """Keep only the first ``at`` messages of the path (the rest leave the tree, as a
        rewritten copy of a conversation would have them)."""
        path = self.entries
        if at < len(path):
            self.discard(path[at])

    def snapshot(self) -> Conversation:
        """A copy that later changes to this conversation do not reach (the token columns
        are copied): what a save on another thread writes."""
        return replace(self, model=replace(self.model), tops=copy_tree(self.tops),
                       deleted=set(self.deleted))

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
        self.append(entry)
        if not self.title:
            self.title = text.strip().splitlines()[0][:80] if text.strip() else ""
        return entry

    def add_assistant(self, settings: list[SamplingParams]) -> Entry:
        entry = Entry("assistant", replies=[Reply(s) for s in settings])
        self.append(entry)
        return entry

    @property
    def last_user(self) -> Entry | None:
        return next((e for e in reversed(self.entries) if e.role == "user"), None)

    @property
    def last_assistant(self) -> Entry | None:
        return next((e for e in reversed(self.entries) if e.role == "assistant"), None)
