"""A reply's per-token data in a few flat arrays instead of an object per token and per
alternative.

Today a reply keeps a :class:`~inference.types.Token` per token and an
:class:`~inference.types.Alternative` per top-k alternative, with a tuple holding them: with
top-5 alternatives, 7 objects tracked by the garbage collector per token (~2,300 for a reply
of ~330 tokens; measured in docs/long-sessions.md), each walked by every full collection for
as long as the conversation lives.

:class:`TokenRecords` keeps the same data in ``array`` columns and joined strings (a dozen
objects, whatever the reply's length) and makes :class:`Token` objects only when asked
(indexing, iterating, slicing), so the token view, the inspector, exports, transcripts and
continue-from-alternative keep reading tokens as they do today. It reads like a list of
tokens: ``len``, indexing (negative too), slices (a list of tokens), iteration, ``extend``
and ``append`` (a :class:`~inference.types.TokenBatch`'s tokens), and :meth:`truncate` for
what ``reply.tokens[:] = reply.tokens[:n] + [chosen]`` did. Cheap column reads
(:meth:`text_at`, :meth:`logprob_at`, :meth:`is_special`...) serve the hot paths without making
a token.

Absent values round-trip: a presence flag per optional field (``id``, ``logprob``,
``entropy``, ``glyph_start``, ``sampler``); an alternative's ``id`` of None is stored as -1
(token ids are never negative). What the sampler did (``Token.sampler``) lives in
:class:`_SamplerColumns`, made only when a reply's first token with one arrives (a reply from
another backend, or loaded from an older file, keeps no such columns).
"""

from __future__ import annotations

import itertools
from array import array
from typing import Any, Iterable, Iterator, Sequence, overload

from inference.types import Alternative, SamplerCut, Token

_SPECIAL = 1
_HAS_ID = 2
_HAS_LOGPROB = 4
_HAS_ENTROPY = 8
_HAS_GLYPH = 16
_REASONING = 32
"""The token belongs to the reply's reasoning (``Token.channel``), not its answer."""
_HAS_SAMPLER = 64
_CUTS = ("", "top-k", "top-p", "min-p", "greedy")
"""``SamplerCut.top_cuts`` values, stored by position (one byte per alternative)."""


class _Strings:
    """Many strings in one: appended pieces wait in a list until a read needs the joined
    text (reading one of them does not), so appending while streaming stays cheap."""

    __slots__ = ("_joined", "_pending", "ends")

    def __init__(self) -> None:
        self._joined = ""
        self._pending: list[str] = []
        self.ends = array("Q")
        """Where each string ends in the joined text."""

    @classmethod
    def of(cls, texts: Sequence[str]) -> _Strings:
        """The strings ``texts``, joined at once."""
        out = cls()
        out._joined = "".join(texts)
        out.ends = array("Q", itertools.accumulate(map(len, texts)))
        return out

    def append(self, text: str) -> None:
        self._pending.append(text)
        self.ends.append((self.ends[-1] if self.ends else 0) + len(text))

    @property
    def joined(self) -> str:
        if self._pending:
            self._joined += "".join(self._pending)
            self._pending.clear()
        return self._joined

    def get(self, i: int) -> str:
        pending = len(self._pending)
        if i >= len(self.ends) - pending:  # not joined yet: no copy of the whole text
            return self._pending[i - (len(self.ends) - pending)]
        start = self.ends[i - 1] if i > 0 else 0
        return self._joined[start:self.ends[i]]

    def span(self, start: int, end: int) -> str:
        """Strings ``start`` to ``end`` (exclusive), joined."""
        if end <= start:
            return ""
        first = self.ends[start - 1] if start > 0 else 0
        return self.joined[first:self.ends[end - 1]]

    def truncate(self, n: int) -> None:
        keep = self.ends[n - 1] if n > 0 else 0
        self._joined = self.joined[:keep]
        del self.ends[n:]

    def __len__(self) -> int:
        return len(self.ends)

    def contents(self) -> tuple[bytes, str]:
        """Where each string ends (as bytes) and the joined text: equal for equal columns."""
        return self.ends.tobytes(), self.joined

    def head(self, n: int) -> tuple[bytes, str]:
        """:meth:`contents` of the first ``n`` strings."""
        end = self.ends[n - 1] if n > 0 else 0
        return memoryview(self.ends)[:n].tobytes(), self.joined[:end]

    def copy(self) -> _Strings:
        out = _Strings()
        out._joined = self.joined
        out.ends = array("Q", self.ends)
        return out


class _SamplerColumns:
    """``Token.sampler`` of every token in columns: per token the post-sampler probability and
    the nucleus size, per alternative its post-sampler probability and the filter that cut it
    (a byte); ``ends`` says where each token's alternatives end (a token without a record
    stores zeros and no alternatives)."""

    __slots__ = ("probs", "nucleus", "ends", "alt_probs", "alt_cuts")

    def __init__(self, n: int = 0) -> None:
        self.probs = array("d", bytes(8 * n))
        self.nucleus = array("q", bytes(8 * n))
        self.ends = array("Q", bytes(8 * n))
        self.alt_probs = array("d")
        self.alt_cuts = bytearray()

    def append(self, sp: SamplerCut | None) -> None:
        if sp is not None:
            self.alt_probs.extend(sp.top_probs)
            self.alt_cuts.extend(_CUTS.index(c) for c in sp.top_cuts)
        self.probs.append(sp.prob if sp is not None else 0.0)
        self.nucleus.append(sp.nucleus if sp is not None else 0)
        self.ends.append(len(self.alt_cuts))

    def get(self, i: int) -> SamplerCut:
        start = self.ends[i - 1] if i > 0 else 0
        end = self.ends[i]
        return SamplerCut(self.probs[i], self.nucleus[i], tuple(self.alt_probs[start:end]),
                          tuple(_CUTS[c] for c in self.alt_cuts[start:end]))

    def truncate(self, n: int) -> None:
        alts = self.ends[n - 1] if n > 0 else 0
        for column in (self.probs, self.nucleus, self.ends):
            del column[n:]
        del self.alt_probs[alts:]
        del self.alt_cuts[alts:]

    def copy(self) -> _SamplerColumns:
        out = _SamplerColumns()
        for name in ("probs", "nucleus", "ends", "alt_probs"):
            setattr(out, name, array(getattr(self, name).typecode, getattr(self, name)))
        out.alt_cuts = bytearray(self.alt_cuts)
        return out

    def same(self, other: _SamplerColumns) -> bool:
        return (self.alt_cuts == other.alt_cuts
                and all(getattr(self, n).tobytes() == getattr(other, n).tobytes()
                        for n in ("probs", "nucleus", "ends", "alt_probs")))


class TokenRecords(Sequence[Token]):
    """A reply's tokens in columns (see the module docstring)."""

    __slots__ = ("_index", "_ids", "_flags", "_logprobs", "_entropies", "_glyph", "_texts",
                 "_raws", "_top_ends", "_alt_ids", "_alt_logprobs", "_alt_texts", "_sampler",
                 "_shared")

    def __init__(self, tokens: Iterable[Token] = ()) -> None:
        self._index = array("q")
        self._ids = array("q")
        self._flags = bytearray()
        self._logprobs = array("d")
        self._entropies = array("d")
        self._glyph = array("q")
        self._texts = _Strings()
        self._raws = _Strings()
        self._top_ends = array("Q")
        """Where each token's alternatives end in the alternative columns."""
        self._alt_ids = array("q")
        self._alt_logprobs = array("d")
        self._alt_texts = _Strings()
        self._sampler: _SamplerColumns | None = None
        self._shared = False
        """Another record shares these columns (:meth:`copy`): the first change copies them."""
        self.extend(tokens)

    # ---- adding ----

    def append(self, token: Token) -> None:
        """Add one token at the end."""
        if self._shared:
            self._own()
        flags = _SPECIAL if token.special else 0
        if token.channel == "reasoning":
            flags |= _REASONING
        self._index.append(token.index)
        if token.id is not None:
            flags |= _HAS_ID
        self._ids.append(token.id if token.id is not None else 0)
        if token.logprob is not None:
            flags |= _HAS_LOGPROB
        self._logprobs.append(token.logprob if token.logprob is not None else 0.0)
        if token.entropy is not None:
            flags |= _HAS_ENTROPY
        self._entropies.append(token.entropy if token.entropy is not None else 0.0)
        if token.glyph_start is not None:
            flags |= _HAS_GLYPH
        self._glyph.append(token.glyph_start if token.glyph_start is not None else 0)
        if token.sampler is not None:
            flags |= _HAS_SAMPLER
            if self._sampler is None:
                self._sampler = _SamplerColumns(len(self._flags))
        if self._sampler is not None:
            self._sampler.append(token.sampler)
        self._flags.append(flags)
        self._texts.append(token.text)
        self._raws.append(token.raw)
        for alt in token.top:
            self._alt_ids.append(-1 if alt.id is None else alt.id)
            self._alt_logprobs.append(alt.logprob)
            self._alt_texts.append(alt.text)
        self._top_ends.append(len(self._alt_ids))

    @classmethod
    def from_fields(cls, rows: Sequence[tuple[Any, ...]],
                    reasoning: Sequence[bool] | None = None,
                    samplers: Sequence[SamplerCut | None] | None = None) -> TokenRecords:
        """Tokens from their fields ``(index, id, text, logprob, entropy, special, raw, top)``,
        ``top`` as ``[id, text, logprob]`` lists (already checked), each column built in one
        go: reading a transcript of 200 replies this way takes a third of the time that
        making a token and its alternatives one by one took (``chatui.transcript.reader``).
        ``reasoning[i]``: token i is in the reasoning channel (all answer when None);
        ``samplers``: each token's ``Token.sampler`` (already checked), when any has one."""
        out = cls()
        if not rows:
            return out
        index, tids, texts, lps, ents, specials, raws, tops = zip(*rows)
        out._index = array("q", index)
        out._ids = array("q", [0 if t is None else t for t in tids])
        out._logprobs = array("d", [0.0 if x is None else x for x in lps])
        out._entropies = array("d", [0.0 if x is None else x for x in ents])
        out._glyph = array("q", bytes(8 * len(rows)))
        out._flags = bytearray(
            (_SPECIAL if sp else 0) | (0 if t is None else _HAS_ID)
            | (0 if lp is None else _HAS_LOGPROB) | (0 if e is None else _HAS_ENTROPY)
            for sp, t, lp, e in zip(specials, tids, lps, ents))
        if reasoning is not None:
            for i, flag in enumerate(reasoning):
                if flag:
                    out._flags[i] |= _REASONING
        out._texts = _Strings.of(texts)
        out._raws = _Strings.of(raws)
        alts = [a for top in tops for a in top]
        out._top_ends = array("Q", itertools.accumulate(map(len, tops)))
        out._alt_ids = array("q", [-1 if a[0] is None else a[0] for a in alts])
        out._alt_logprobs = array("d", [a[2] for a in alts])
        out._alt_texts = _Strings.of([a[1] for a in alts])
        if samplers is not None and any(sp is not None for sp in samplers):
            out._sampler = _SamplerColumns()
            for i, sp in enumerate(samplers):
                out._sampler.append(sp)
                if sp is not None:
                    out._flags[i] |= _HAS_SAMPLER
        return out

    # ---- the stored columns, for the transcript's columnar encoding ----

    NUMBER_COLUMNS = ("_index", "_ids", "_logprobs", "_entropies", "_glyph", "_top_ends",
                      "_alt_ids", "_alt_logprobs")
    """The ``array`` columns (typecode q, q, d, d, q, Q, q, d), in the order
    :meth:`columns` gives them."""
    STRING_COLUMNS = ("_texts", "_raws", "_alt_texts")

    SAMPLER_COLUMNS = ("probs", "nucleus", "ends", "alt_probs", "alt_cuts")
    """What the sampler did, when any token has a record (typecode d, q, Q, d and a byte per
    alternative: the index of its cut in :data:`CUTS`)."""
    CUTS = _CUTS

    def columns(self) -> tuple[list[array], bytes, list[tuple[str, array]],
                               list[array | bytearray] | None]:
        """The stored columns as they are: the number arrays (:data:`NUMBER_COLUMNS`), the
        flag byte per token (bit 1 special, 2 id present, 4 logprob present, 8 entropy
        present, 16 glyph_start present, 32 reasoning, 64 a sampler record; absent values are
        stored as 0, an alternative's absent id as -1), each string column as its joined text
        with where each string ends, and the sampler's columns (:data:`SAMPLER_COLUMNS`) or
        None. :mod:`chatui.transcript.token_columns` writes and reads them."""
        sampler = self._sampler
        return ([getattr(self, name) for name in self.NUMBER_COLUMNS], bytes(self._flags),
                [(getattr(self, name).joined, getattr(self, name).ends)
                 for name in self.STRING_COLUMNS],
                None if sampler is None else [getattr(sampler, name)
                                              for name in self.SAMPLER_COLUMNS])

    @classmethod
    def from_columns(cls, numbers: Sequence[array], flags: bytes,
                     strings: Sequence[tuple[str, array]],
                     sampler: Sequence[array | bytearray] | None = None) -> TokenRecords:
        """Records over columns as :meth:`columns` gives them (already checked: lengths and
        ends agree, values in range), taken as they are, without a copy."""
        out = cls()
        if sampler is not None:
            out._sampler = _SamplerColumns()
            for name, column in zip(cls.SAMPLER_COLUMNS, sampler, strict=True):
                setattr(out._sampler, name, column)
        for name, column in zip(cls.NUMBER_COLUMNS, numbers, strict=True):
            setattr(out, name, column)
        out._flags = bytearray(flags)
        for name, (joined, ends) in zip(cls.STRING_COLUMNS, strings, strict=True):
            column = _Strings()
            column._joined = joined
            column.ends = ends
            setattr(out, name, column)
        return out

    def compact(self) -> None:
        """Join the strings appended since the last read (a reply that finished streaming):
        each appended piece is a ``str`` of its own until then, ~2,300 of them for a reply of
        ~330 tokens with top-5 alternatives, ~120 KB that one string per column replaces."""
        for strings in (self._texts, self._raws, self._alt_texts):
            strings.joined  # noqa: B018 - joins the pending pieces

    def extend(self, tokens: Iterable[Token]) -> None:
        """Add tokens at the end (e.g. a :class:`~inference.types.TokenBatch`'s)."""
        for token in tokens:
            self.append(token)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens only."""
        n = max(0, min(n, len(self)))
        if n == len(self):
            return
        if self._shared:
            self._own()
        alts = self._top_ends[n - 1] if n > 0 else 0
        for column in (self._index, self._ids, self._logprobs, self._entropies, self._glyph,
                       self._top_ends):
            del column[n:]
        del self._flags[n:]
        self._texts.truncate(n)
        self._raws.truncate(n)
        del self._alt_ids[alts:]
        del self._alt_logprobs[alts:]
        self._alt_texts.truncate(alts)
        if self._sampler is not None:
            self._sampler.truncate(n)

    def clear(self) -> None:
        """Drop every token (as ``list.clear``)."""
        self.truncate(0)

    # ---- reading columns (no Token made) ----

    def _at(self, i: int) -> int:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("token index out of range")
        return i

    def text_at(self, i: int) -> str:
        return self._texts.get(self._at(i))

    def raw_at(self, i: int) -> str:
        return self._raws.get(self._at(i))

    def is_special(self, i: int) -> bool:
        return bool(self._flags[self._at(i)] & _SPECIAL)

    def is_reasoning(self, i: int) -> bool:
        return bool(self._flags[self._at(i)] & _REASONING)

    @property
    def has_reasoning(self) -> bool:
        return any(f & _REASONING for f in self._flags)

    def reasoning_count(self) -> int:
        """How many tokens of reasoning text (markers not counted)."""
        return sum(1 for f in self._flags if f & _REASONING and not f & _SPECIAL)

    def logprob_at(self, i: int) -> float | None:
        i = self._at(i)
        return self._logprobs[i] if self._flags[i] & _HAS_LOGPROB else None

    def glyph_start_at(self, i: int) -> int | None:
        i = self._at(i)
        return self._glyph[i] if self._flags[i] & _HAS_GLYPH else None

    def id_at(self, i: int) -> int | None:
        i = self._at(i)
        return self._ids[i] if self._flags[i] & _HAS_ID else None

    def ids(self) -> tuple[int | None, ...]:
        """Every token's id (None where unknown), for a continuation prefix."""
        return tuple(self._ids[i] if self._flags[i] & _HAS_ID else None
                     for i in range(len(self)))

    def text(self, start: int = 0, end: int | None = None, *,
             skip_special: bool = True, channel: str | None = "answer") -> str:
        """The text of tokens ``start`` to ``end`` (the reply's text when special tokens are
        skipped, as the chat screen builds it) in ``channel`` ("answer", "reasoning", or
        None for both)."""
        end = len(self) if end is None else min(end, len(self))
        skip = _SPECIAL if skip_special else 0
        if channel is not None:
            skip |= _REASONING
        want = _REASONING if channel == "reasoning" else 0
        if not any(f & skip != want for f in self._flags[start:end]):
            return self._texts.span(start, end)
        return "".join(self._texts.get(i) for i in range(start, end)
                       if self._flags[i] & skip == want)

    def alternatives(self, i: int) -> tuple[Alternative, ...]:
        i = self._at(i)
        start = self._top_ends[i - 1] if i > 0 else 0
        return tuple(Alternative(None if self._alt_ids[k] < 0 else self._alt_ids[k],
                                 self._alt_texts.get(k), self._alt_logprobs[k])
                     for k in range(start, self._top_ends[i]))

    def sampler_at(self, i: int) -> SamplerCut | None:
        """What the sampler did at token ``i`` (None when not recorded)."""
        i = self._at(i)
        if not self._flags[i] & _HAS_SAMPLER or self._sampler is None:
            return None
        return self._sampler.get(i)

    # ---- reading tokens ----

    def token(self, i: int) -> Token:
        """Token ``i``, made now (equal to the one appended)."""
        i = self._at(i)
        flags = self._flags[i]
        return Token(
            index=self._index[i],
            id=self._ids[i] if flags & _HAS_ID else None,
            text=self._texts.get(i),
            logprob=self._logprobs[i] if flags & _HAS_LOGPROB else None,
            entropy=self._entropies[i] if flags & _HAS_ENTROPY else None,
            top=self.alternatives(i),
            special=bool(flags & _SPECIAL),
            glyph_start=self._glyph[i] if flags & _HAS_GLYPH else None,
            raw=self._raws.get(i),
            channel="reasoning" if flags & _REASONING else "answer",
            sampler=self._sampler.get(i) if flags & _HAS_SAMPLER and self._sampler else None,
        )

    def __len__(self) -> int:
        return len(self._flags)

    @overload
    def __getitem__(self, i: int) -> Token: ...

    @overload
    def __getitem__(self, i: slice) -> list[Token]: ...

    def __getitem__(self, i: int | slice) -> Token | list[Token]:
        if isinstance(i, slice):
            return [self.token(k) for k in range(*i.indices(len(self)))]
        return self.token(i)

    def __iter__(self) -> Iterator[Token]:
        for i in range(len(self)):
            yield self.token(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenRecords) and self._same_columns(other):
            return True  # (the autosave compares every message with the saved one: column
            # by column this is ~1,000 times faster than token by token)
        if isinstance(other, (TokenRecords, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def _same_columns(self, other: TokenRecords) -> bool:
        """Whether every stored column is equal (then every token is; unequal columns can
        still make equal tokens, e.g. a value stored where its flag says absent)."""
        return (self.shares_columns(other) or (
            self._flags == other._flags
            # as bytes: array's own == makes a float object per element of a 'd' column
            and all(getattr(self, name).tobytes() == getattr(other, name).tobytes() for name in (
                "_index", "_ids", "_logprobs", "_entropies", "_glyph", "_top_ends",
                "_alt_ids", "_alt_logprobs"))
            and all(getattr(self, name).ends == getattr(other, name).ends
                    and getattr(self, name).joined == getattr(other, name).joined
                    for name in ("_texts", "_raws", "_alt_texts"))
            and (self._sampler is other._sampler is None
                 or (self._sampler is not None and other._sampler is not None
                     and self._sampler.same(other._sampler)))))

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"TokenRecords({len(self)} tokens)"

    _COLUMNS = ("_index", "_ids", "_flags", "_logprobs", "_entropies", "_glyph", "_texts",
                "_raws", "_top_ends", "_alt_ids", "_alt_logprobs", "_alt_texts", "_sampler")

    def copy(self) -> TokenRecords:
        """An independent copy (what a snapshot for saving needs), made without copying: the
        two share their columns until either changes (copy on write, :meth:`_own`).

        Why: the autosave snapshots the whole conversation on the event loop after every
        reply, and the writer compares every saved message with the new snapshot's. Copying
        every reply's columns cost ~10 ms on the loop after 200 replies of ~330 tokens, and
        comparing them column by column ~20 ms on the writer's thread (issue 21, measured with
        ``benchmarks/bench_long.py``). Shared columns make both cost a few microseconds per
        reply: records whose columns are the same objects are equal without reading them.
        A finished reply's columns never change, so they are shared by every snapshot."""
        self.compact()  # shared columns never hold pieces waiting to be joined
        out = TokenRecords.__new__(TokenRecords)
        for name in self._COLUMNS:
            setattr(out, name, getattr(self, name))
        self._shared = out._shared = True
        return out

    def _own(self) -> None:
        """Before a change: copy the columns another record shares (see :meth:`copy`)."""
        for name in ("_index", "_ids", "_logprobs", "_entropies", "_glyph", "_top_ends",
                     "_alt_ids", "_alt_logprobs"):
            setattr(self, name, array(getattr(self, name).typecode, getattr(self, name)))
        self._flags = bytearray(self._flags)
        for name in ("_texts", "_raws", "_alt_texts"):
            setattr(self, name, getattr(self, name).copy())
        self._sampler = self._sampler.copy() if self._sampler is not None else None
        self._shared = False

    def shares_columns(self, other: TokenRecords) -> bool:
        """Whether ``other`` reads the very columns this record reads (a :meth:`copy` neither
        changed since): then the two are equal, whatever they hold."""
        # Only copy() shares columns, and _own() replaces all of them at once: a few suffice.
        return self is other or (self._flags is other._flags and self._ids is other._ids
                                 and self._texts is other._texts
                                 and self._alt_texts is other._alt_texts)

    def startswith(self, other: TokenRecords) -> bool:
        """Whether the first ``len(other)`` tokens are ``other``'s: what a grown reply holds
        of the one saved before it. Compared column by column (the prefixes' bytes), token by
        token only when the columns differ or a sampler record is kept."""
        n = len(other)
        if len(self) < n:
            return False
        if n == 0 or self.shares_columns(other):
            return True
        if n == len(self):
            return self == other
        if self._sampler is None and other._sampler is None and self._flags[:n] == other._flags:
            k = other._top_ends[-1]
            if (self._top_ends[n - 1] == k
                    and all(_head(getattr(self, name), n) == getattr(other, name).tobytes()
                            for name in ("_index", "_ids", "_logprobs", "_entropies", "_glyph",
                                         "_top_ends"))
                    and all(_head(getattr(self, name), k) == getattr(other, name).tobytes()
                            for name in ("_alt_ids", "_alt_logprobs"))
                    and all(getattr(self, name).head(count) == getattr(other, name).contents()
                            for name, count in (("_texts", n), ("_raws", n),
                                                ("_alt_texts", k)))):
                return True
        return self[:n] == list(other)


def _head(column: array, n: int) -> bytes:
    """The bytes of the first ``n`` values of ``column``."""
    return memoryview(column)[:n].tobytes()
