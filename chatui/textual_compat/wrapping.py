"""Text folds into at least one cell: a terminal narrowed to a few columns no longer stops
the app (patches ``Content._wrap_and_format``, textual 8.2.8).

Textual wraps a widget's text to the width its layout gave it, and a widget squeezed to 0
cells (or fewer, once its padding is taken off) had Rich fold its words 0 cells wide:
``range() arg 3 must not be zero``, an internal error that ends the app. A window dragged
small, a tmux pane split off, or random keys and sizes (``tests/test_monkey.py``) did it in
the command palette's list, the notebook's empty text box and a reply's statistics line.
:func:`apply` folds at ``max(1, width)``: nothing shows at that width either way.

Without the patch (another release, ``CHATUI_TEXTUAL_PATCHES=off``) chatui's own widgets
still guard their widths (``PartsLine``, ``TextBox``); Textual's own may stop the app in a
terminal a few columns wide, as Textual does on its own.
"""

from __future__ import annotations

from typing import Any

from textual.content import Content

_PATCHED = "_chatui_wraps_in_one_cell"


def apply() -> bool:
    """Patch :class:`textual.content.Content` once (idempotent); whether it is patched."""
    if not hasattr(Content, "_wrap_and_format"):
        return False
    if getattr(Content, _PATCHED, False):
        return True
    wrap = Content._wrap_and_format

    def wrap_in_one_cell_at_least(self: Content, width: int, *args: Any, **kwargs: Any) -> Any:
        return wrap(self, max(1, width), *args, **kwargs)

    wrap_in_one_cell_at_least.__doc__ = wrap.__doc__
    Content._wrap_and_format = wrap_in_one_cell_at_least  # type: ignore[method-assign]
    setattr(Content, _PATCHED, True)
    return True
