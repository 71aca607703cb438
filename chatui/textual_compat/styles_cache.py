"""Keep Textual's ``StylesCache.get_inner_outer`` from holding removed widgets' drawn lines.

``StylesCache.get_inner_outer(base_background, background)`` is a plain method under
``functools.lru_cache(1024)``, so the cache's keys include the ``StylesCache`` itself: the
last 1,024 style caches used stay alive after their widgets are gone, each with every line it
drew (textual 8.2.8). With the conversation's window (``chatui.widgets.log_window``) mounting
and removing messages as the user scrolls, that kept ~230 strips and ~3,200 objects per reply
(``benchmarks/bench_long.py``); before it, widgets lived as long as the conversation anyway.

:func:`apply` replaces the method with one cached on the two colours only: the result never
depended on ``self``. Without the patch (another release, ``CHATUI_TEXTUAL_PATCHES=off``) the
cache is bounded all the same, at 1,024 widgets' lines.
"""

from __future__ import annotations

from functools import lru_cache

try:
    from textual._styles_cache import StylesCache
except ImportError:  # a release that moved it: nothing to patch
    StylesCache = None  # type: ignore[assignment, misc]

_PATCHED = "_chatui_inner_outer_by_colour"


def apply() -> bool:
    """Patch :class:`textual._styles_cache.StylesCache` once (idempotent); whether it is
    patched."""
    if StylesCache is None or not hasattr(StylesCache, "get_inner_outer"):
        return False
    if getattr(StylesCache, _PATCHED, False):
        return True
    original = StylesCache.get_inner_outer
    unwrapped = getattr(original, "__wrapped__", None)
    if unwrapped is None:
        return False  # not the lru_cache'd method this was written for

    @lru_cache(1024)
    def by_colour(base_background, background):  # type: ignore[no-untyped-def]
        return unwrapped(None, base_background, background)

    def get_inner_outer(self, base_background, background):  # type: ignore[no-untyped-def]
        return by_colour(base_background, background)

    get_inner_outer.__doc__ = original.__doc__
    StylesCache.get_inner_outer = get_inner_outer  # type: ignore[method-assign]
    setattr(StylesCache, _PATCHED, True)
    return True
