"""A reply's tokens in a transcript as columns: each number column one base64 string of
little-endian values, each text column one string with where each piece ends.

Why: a transcript is mostly its tokens (with top-5 alternatives, ~2,000 numbers and ~2,000
short strings per reply of ~330 tokens). Written as an object per token and a list per
alternative, a 200-reply transcript was 13-21 MB of JSON whose decoding alone took 1.0 s on a
quiet machine and 4-5 s with the two cores busy (``/load`` missed its 1 s); as JSON arrays of
numbers still 1.4-2.0 s (float parsing). As columns here the same file is about half the size
and decodes in 0.16-0.26 s with the cores busy, and the columns become the reply's
:class:`~chatui.token_records.TokenRecords` without a Python object per value (measured
2026-11-25, load 8-10, synthetic 200 x 330 tokens, top-5: ``json.loads`` 4.3-5.0 s + fields
1.0-2.4 s for objects, 0.16-0.26 s + 0.07-0.12 s for columns).

The layout (``"tokens"`` of a reply; the object form, a list of token objects, is still read)::

    {"n": N,                               # tokens
     "index": b64 int64[N], "id": b64 int64[N], "flags": b64 uint8[N],
     "logprob": b64 float64[N], "entropy": b64 float64[N], "glyph_start": b64 int64[N],
     "text": str, "text_ends": b64 uint64[N], "raw": str, "raw_ends": b64 uint64[N],
     "top_ends": b64 uint64[N],            # where each token's alternatives end
     "top_id": b64 int64[A], "top_logprob": b64 float64[A],
     "top_text": str, "top_text_ends": b64 uint64[A],
     # optional, what the sampler did (tokens flagged 64 have a record, an entry per
     # alternative; the others none):
     "sampler_prob": b64 float64[N], "sampler_nucleus": b64 int64[N],
     "sampler_top_ends": b64 uint64[N], "sampler_top_prob": b64 float64[S],
     "sampler_top_cut": b64 uint8[S]}     # 0 kept, 1 top-k, 2 top-p, 3 min-p, 4 greedy

``flags`` bits: 1 special, 2 id known, 4 logprob known, 8 entropy known, 16 glyph_start set,
32 a reasoning token (``Token.channel``), 64 a sampler record;
an unknown value is stored as 0 and an alternative's unknown id as -1. Ends count code points.
Floats round-trip bit for bit; the reader checks every value as the object form's reader does
(ranges, NaN and infinity refused, ends increasing and matching their text).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import operator
import sys
from array import array
from typing import Any

from inference.types import SamplerCut, Token

from ..token_records import TokenRecords
from .limits import (_ENTROPY_EPS, _LOGPROB_EPS, _MAX_ENTROPY, _MAX_INDEX, _MAX_TOKEN_ID,
                     _MAX_TOP, _MIN_LOGPROB, _finite)

_NUMBER_KEYS = ("index", "id", "logprob", "entropy", "glyph_start", "top_ends", "top_id",
                "top_logprob")
"""The JSON keys of :data:`TokenRecords.NUMBER_COLUMNS`, in its order."""
_TYPECODES = ("q", "q", "d", "d", "q", "Q", "q", "d")
_STRING_KEYS = ("text", "raw", "top_text")
_SAMPLER_KEYS = ("sampler_prob", "sampler_nucleus", "sampler_top_ends", "sampler_top_prob",
                 "sampler_top_cut")
"""The keys of :data:`TokenRecords.SAMPLER_COLUMNS`, in its order (optional: what the
sampler did, issue 17)."""
_HAS_SAMPLER = 64
_FLAG_BITS = 127
_BIG_ENDIAN = sys.byteorder == "big"


class ColumnError(ValueError):
    """A column is missing or holds something a transcript never holds: ``str()`` names the
    key (relative to the ``tokens`` object) and the problem."""


def _b64(column: array) -> str:
    if _BIG_ENDIAN:
        column = array(column.typecode, column)
        column.byteswap()
    return base64.b64encode(column.tobytes()).decode("ascii")


def _unb64(doc: dict[str, Any], key: str, typecode: str, n: int) -> array:
    v = doc.get(key)
    if not isinstance(v, str):
        raise ColumnError(f"{key} is missing" if v is None else f"{key} must be a string")
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise ColumnError(f"{key} is not valid base64") from None
    column = array(typecode)
    if len(raw) != n * column.itemsize:
        raise ColumnError(f"{key} has {len(raw)} bytes where {n} values need "
                          f"{n * column.itemsize}")
    column.frombytes(raw)
    if _BIG_ENDIAN:
        column.byteswap()
    return column


def _all_finite(column: array) -> bool:
    return _finite(math.fsum(column)) if column else True  # fsum: NaN and inf stay


def encode(tokens: TokenRecords) -> dict[str, Any]:
    """The ``tokens`` object of a reply. Non-finite statistics (a -inf logprob from a masked
    logit) are written as unknown and non-finite alternatives left out, as the object form
    did, rather than making the conversation unsavable."""
    numbers, flags, strings, sampler = tokens.columns()
    if not (all(_all_finite(numbers[i]) for i in (2, 3, 7))
            and (sampler is None or all(_all_finite(sampler[i]) for i in (0, 3)))):
        numbers, flags, strings, sampler = _finite_copy(tokens).columns()
    doc: dict[str, Any] = {"n": len(flags)}
    for key, column in zip(_NUMBER_KEYS, numbers):
        doc[key] = _b64(column)
    doc["flags"] = base64.b64encode(flags).decode("ascii")
    for key, (joined, ends) in zip(_STRING_KEYS, strings):
        doc[key] = joined
        doc[f"{key}_ends"] = _b64(ends)
    if sampler is not None:
        for key, column in zip(_SAMPLER_KEYS, sampler):
            doc[key] = (base64.b64encode(column).decode("ascii")
                        if isinstance(column, bytearray) else _b64(column))
    return doc


def _finite_copy(tokens: TokenRecords) -> TokenRecords:
    def fix(x: float | None) -> float | None:
        return x if x is None or _finite(x) else None

    def keep(t: Token) -> Token:
        kept = [j for j, a in enumerate(t.top) if _finite(a.logprob)]
        sp = t.sampler
        if sp is not None:
            sp = SamplerCut(sp.prob if _finite(sp.prob) else 0.0, sp.nucleus,
                            tuple(p if _finite(p) else 0.0 for p in
                                  (sp.top_probs[j] for j in kept)),
                            tuple(sp.top_cuts[j] for j in kept))
        return dataclasses.replace(t, logprob=fix(t.logprob), entropy=fix(t.entropy),
                                   top=tuple(t.top[j] for j in kept), sampler=sp)

    return TokenRecords(keep(t) for t in tokens)


def _check_range(key: str, column: array, lo: float, hi: float, what: str) -> None:
    if column and not (_all_finite(column) and lo <= min(column) and max(column) <= hi):
        raise ColumnError(f"{key} holds a value that is not {what}")


def _check_ends(key: str, ends: array, total: int) -> None:
    if ends and (ends[-1] != total or not all(map(operator.le, ends, ends[1:]))):
        raise ColumnError(f"{key} does not mark pieces of its text in order")
    if not ends and total:
        raise ColumnError(f"{key} does not mark pieces of its text in order")


def decode(doc: Any) -> TokenRecords:
    """The records in a ``tokens`` object, checked in full.

    Raises:
        ColumnError: a key is missing or a value is out of its range (the message names it).
    """
    if not isinstance(doc, dict):
        raise ColumnError("must be a list of tokens or an object of token columns")
    n = doc.get("n")
    if type(n) is not int or not 0 <= n <= _MAX_INDEX:
        raise ColumnError("n must be the number of tokens")
    index, ids, logprobs, entropies, glyph, top_ends = (
        _unb64(doc, key, code, n) for key, code in zip(_NUMBER_KEYS[:6], _TYPECODES[:6]))
    alts = top_ends[-1] if n else 0
    if alts > n * _MAX_TOP:
        raise ColumnError(f"top_ends promises more than {_MAX_TOP} alternatives a token")
    alt_ids, alt_logprobs = (_unb64(doc, key, code, alts)
                             for key, code in zip(_NUMBER_KEYS[6:], _TYPECODES[6:]))
    flags = _unb64(doc, "flags", "B", n)
    if flags and max(flags) > _FLAG_BITS:
        raise ColumnError("flags holds an unknown flag")
    _check_range("index", index, 0, _MAX_INDEX, "a token's position")
    _check_range("id", ids, 0, _MAX_TOKEN_ID, "a token id")
    _check_range("top_id", alt_ids, -1, _MAX_TOKEN_ID, "a token id (or -1)")
    _check_range("logprob", logprobs, _MIN_LOGPROB, _LOGPROB_EPS,
                 f"a log-probability between {_MIN_LOGPROB:g} and 0")
    _check_range("top_logprob", alt_logprobs, _MIN_LOGPROB, _LOGPROB_EPS,
                 f"a log-probability between {_MIN_LOGPROB:g} and 0")
    _check_range("entropy", entropies, -_ENTROPY_EPS, _MAX_ENTROPY,
                 f"an entropy in nats between 0 and {_MAX_ENTROPY:g}")
    if not all(map(operator.le, glyph, index)) or (glyph and min(glyph) < 0):
        raise ColumnError("glyph_start holds a position after its token")
    if n and (top_ends[0] > _MAX_TOP
              or max(map(operator.sub, top_ends[1:], top_ends), default=0) > _MAX_TOP):
        raise ColumnError(f"top_ends gives a token more than {_MAX_TOP} alternatives")
    _check_ends("top_ends", top_ends, alts)
    strings = []
    for key, count in zip(_STRING_KEYS, (n, n, alts)):
        joined = doc.get(key)
        if not isinstance(joined, str):
            raise ColumnError(f"{key} is missing" if joined is None else f"{key} must be a string")
        ends = _unb64(doc, f"{key}_ends", "Q", count)
        _check_ends(f"{key}_ends", ends, len(joined))
        strings.append((joined, ends))
    return TokenRecords.from_columns(
        (index, ids, logprobs, entropies, glyph, top_ends, alt_ids, alt_logprobs),
        bytes(flags), strings, _sampler(doc, flags, top_ends, alts))


def _sampler(doc: dict[str, Any], flags: array, top_ends: array,
             alts: int) -> list[array | bytearray] | None:
    """The sampler's columns, when the reply has them: a record for the tokens flagged 64,
    with an entry per alternative of theirs (none for the others)."""
    if _SAMPLER_KEYS[0] not in doc:
        return None
    n = len(flags)
    probs, nucleus, ends = (_unb64(doc, key, code, n)
                            for key, code in zip(_SAMPLER_KEYS[:3], ("d", "q", "Q")))
    count = ends[-1] if n else 0
    if count > alts:
        raise ColumnError("sampler_top_ends promises more entries than there are alternatives")
    alt_probs = _unb64(doc, _SAMPLER_KEYS[3], "d", count)
    cuts = bytearray(_unb64(doc, _SAMPLER_KEYS[4], "B", count).tobytes())
    _check_range("sampler_prob", probs, 0, 1 + _LOGPROB_EPS, "a probability")
    _check_range("sampler_top_prob", alt_probs, 0, 1 + _LOGPROB_EPS, "a probability")
    _check_range("sampler_nucleus", nucleus, 0, _MAX_TOKEN_ID, "a number of tokens")
    if cuts and max(cuts) >= len(TokenRecords.CUTS):
        raise ColumnError("sampler_top_cut holds an unknown filter")
    _check_ends("sampler_top_ends", ends, count)
    start = top_start = 0
    for i in range(n):
        size = ends[i] - start
        if size != ((top_ends[i] - top_start) if flags[i] & _HAS_SAMPLER else 0):
            raise ColumnError(f"sampler_top_ends gives token {i} a record for each of "
                              f"{size} alternatives, not its own")
        start, top_start = ends[i], top_ends[i]
    return [probs, nucleus, ends, alt_probs, cuts]


__all__ = ["ColumnError", "decode", "encode"]
