"""Incremental, UTF-8-safe detokenization and stop-string handling.

A glyph spelled by several tokens (an emoji, a CJK character) is never shown half-made: the
tokens before its last one add "" and the last one adds the glyph, pointing back to where the
glyph began. Concatenating the streamed text gives exactly ``tokenizer.decode(ids)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

REPLACEMENT = "\ufffd"


def ids_decoder(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """``tokenizer.decode(ids, skip_special_tokens=..., clean_up_tokenization_spaces=False)``
    as a function of a list of ids. A transformers tokenizer whose decoding is the tokenizers
    library's own (transformers 5's ``TokenizersBackend``, its ``decode`` and ``_decode`` not
    changed by a subclass) decodes with ``backend_tokenizer.decode``, which is what
    ``_decode`` calls when spaces are not cleaned up, without transformers' handling of the
    arguments: 2.4 -> 0.5 us a call (a window of two ids, the default model's tokenizer, this
    machine), one or two calls a row and step. Any other tokenizer, or another transformers
    whose classes are not these, keeps ``tokenizer.decode``."""
    def general(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                clean_up_tokenization_spaces=False)

    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # (another transformers)
        return general
    cls = type(tokenizer)
    if not (isinstance(tokenizer, TokenizersBackend)
            and getattr(cls, "decode", None) is PreTrainedTokenizerBase.decode
            and getattr(cls, "_decode", None) is TokenizersBackend._decode):
        return general
    decode = tokenizer.backend_tokenizer.decode

    def direct(ids: list[int]) -> str:
        return decode(ids, skip_special_tokens)

    return direct


@dataclass
class Piece:
    """What one token adds to the text."""

    text: str
    glyph_start: int | None = None


class IncrementalDetokenizer:
    """Decodes a growing list of ids one token at a time (the prefix/read offset method).

    Args:
        tokenizer: a transformers tokenizer (``decode`` is called on short windows only).
        skip_special_tokens: leave control tokens out of the text.
    """

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True,
                 singles: dict[int, str] | None = None) -> None:
        self._decode = ids_decoder(tokenizer, skip_special_tokens)
        self._singles = {} if singles is None else singles
        self.ids: list[int] = []
        self._prefix = 0
        self._read = 0
        self._pending_from: int | None = None
        self.text = ""

    def _decode_window(self, ids: list[int]) -> str:
        """``_decode`` of a window; a one-token window (the previous token, at most steps) from
        ``singles``, the decodes of one token a caller shares between its detokenizers of one
        tokenizer and ``skip_special_tokens``: a step's two decodes were half of the engine's
        work a row and step (8 rows of a comparison: 0.3 ms of Python a step)."""
        if len(ids) != 1:
            return self._decode(ids)
        text = self._singles.get(ids[0])
        if text is None:
            text = self._singles[ids[0]] = self._decode(ids)
        return text

    @property
    def pending(self) -> bool:
        """True while the last tokens spell an incomplete glyph."""
        return self._pending_from is not None

    def step(self, token_id: int) -> Piece:
        """Add a token; return the text it completes ("" while a glyph is incomplete)."""
        index = len(self.ids)
        self.ids.append(token_id)
        before = self._decode_window(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if after.endswith(REPLACEMENT):
            if self._pending_from is None:
                self._pending_from = index
            return Piece("")
        if after.startswith(before):
            delta = after[len(before):]
        else:  # the window re-segmented (rare): fall back to a full decode difference
            full = self._decode(self.ids)
            delta = full[len(self.text):] if full.startswith(self.text) else ""
        start = self._pending_from if self._pending_from is not None and self._pending_from < index else None
        self._pending_from = None
        self._prefix = self._read
        self._read = len(self.ids)
        self.text += delta
        return Piece(delta, start)

    def flush(self) -> str:
        """Text still pending at the end (an incomplete glyph), so that the total equals
        ``decode(ids)``; returns what to append to the last token."""
        full = self._decode(self.ids)
        rest = full[len(self.text):] if full.startswith(self.text) else ""
        self.text += rest
        self._pending_from = None
        return rest


@dataclass
class StopResult:
    """Tokens released by :class:`StopStringFilter` and whether a stop string was found."""

    released: list[Any]
    stopped: bool


class StopStringFilter:
    """Holds back text that might be the start of a stop string; cuts the reply at a full one.

    Items are objects with a ``text`` attribute and a ``with_text(new)`` method (tokens).
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.released_text = ""
        self._pending: list[Any] = []

    def push(self, item: Any) -> StopResult:
        if not self.stops:
            self.released_text += item.text
            return StopResult([item], False)
        self._pending.append(item)
        pending_text = "".join(t.text for t in self._pending)
        full = self.released_text + pending_text
        horizon = max(0, len(self.released_text) - max(len(s) for s in self.stops) + 1)
        hits = [full.find(s, horizon) for s in self.stops]
        hits = [h for h in hits if h >= 0]
        if hits:
            cut = min(hits)
            released: list[Any] = []
            pos = len(self.released_text)
            for t in self._pending:
                if pos >= cut:
                    break
                keep = t.text[: cut - pos]
                released.append(t if keep == t.text else t.with_text(keep))
                pos += len(t.text)
            self._pending = []
            self.released_text = full[:cut]
            return StopResult(released, True)
        hold = 0
        for s in self.stops:
            for j in range(min(len(s) - 1, len(full)), 0, -1):
                if full.endswith(s[:j]):
                    hold = max(hold, j)
                    break
        limit = len(full) - hold
        released = []
        pos = len(self.released_text)
        while self._pending and pos + len(self._pending[0].text) <= limit:
            t = self._pending.pop(0)
            pos += len(t.text)
            released.append(t)
        self.released_text = full[:pos]
        return StopResult(released, False)

    def flush(self) -> list[Any]:
        """Release everything held back (the reply ended without a stop string)."""
        out, self._pending = self._pending, []
        self.released_text += "".join(t.text for t in out)
        return out
