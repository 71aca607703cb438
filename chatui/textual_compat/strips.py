"""Keep Textual's ``Strip`` from referencing itself, so strips are freed by reference counting.

``Strip.divide(cuts)`` with the single cut at the strip's own length, and ``Strip.crop_extend``
over exactly the strip's cells, return the strip itself and also store it in the strip's own
cache: every such strip becomes a reference cycle that only Python's cyclic garbage collector
can free. The compositor does this for almost every line of every frame, so while a reply
streamed about 60 cyclic objects per token reached the collector's oldest generation and made
its full passes long (100-300 ms with the GIL held; textual 8.2.8). A Textual bug, reported in
``docs/upstream/strip-self-cycles.md``.

:func:`apply` wraps both methods to return ``self`` before the cache is touched. Results are
the same objects as before (the cached value *was* ``self``); only the self-reference goes.
Without the patch (another Textual release, ``CHATUI_TEXTUAL_PATCHES=off``) the strips are the
same and the collector frees them, in longer pauses (see :mod:`chatui.gcpolicy`).
"""

from __future__ import annotations

from typing import Iterable

from textual.strip import Strip

_PATCHED = "_chatui_no_self_cache"


def apply() -> bool:
    """Patch :class:`textual.strip.Strip` once (idempotent); whether it is patched.

    Only call it where :mod:`.gate` allows: it relies on the two methods caching their result
    in the strip, as textual 8.2.8 does."""
    if getattr(Strip, _PATCHED, False):
        return True
    divide = Strip.divide
    crop_extend = Strip.crop_extend

    def divide_no_self_cache(self: Strip, cuts: Iterable[int]) -> list[Strip]:
        length = self.cell_length
        cuts = [cut for cut in cuts if cut <= length]
        if cuts == [length]:
            return [self]
        return divide(self, cuts)  # type: ignore[return-value]

    def crop_extend_no_self_cache(self: Strip, start: int, end: int, style) -> Strip:
        if start <= 0 and end == self.cell_length:
            return self
        return crop_extend(self, start, end, style)

    divide_no_self_cache.__doc__ = divide.__doc__
    crop_extend_no_self_cache.__doc__ = crop_extend.__doc__
    Strip.divide = divide_no_self_cache  # type: ignore[method-assign]
    Strip.crop_extend = crop_extend_no_self_cache  # type: ignore[method-assign]
    setattr(Strip, _PATCHED, True)
    return True
