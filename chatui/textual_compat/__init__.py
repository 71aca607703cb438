"""Every contact chatui has with Textual's private internals, in one place.

chatui streams replies at 10-20 frames a second into a conversation that only grows, and
Textual's public path pays for that in full: a layout and a repaint of the whole screen per
new line, a render of every visible widget per frame, a reference cycle per drawn line. The
modules here patch or override private parts of Textual to avoid that work, and import its
private names chatui needs:

- :mod:`.compositor`: a frame renders and repaints only the rows that changed (patches
  ``Compositor._get_renders`` and ``Compositor.reflow``);
- :mod:`.strips`: strips without self-references, freed without the cyclic collector (patches
  ``Strip.divide`` and ``Strip.crop_extend``; a Textual bug, see ``docs/upstream/``);
- :mod:`.styles_cache`: a style cache's drawn lines go with its widget (patches
  ``StylesCache.get_inner_outer``, whose ``lru_cache`` kept the last 1,024 of them alive);
- :mod:`.widget_hooks`: no second layout after a resize, only new rows repainted (overrides
  ``Widget._size_updated``, bumps ``Widget._layout_updates``, clears a widget's arrangement
  cache);
- :mod:`.app_hooks`: one sentence instead of a traceback after an internal error (overrides
  ``App._fatal_error``);
- :mod:`.keys`: a key typed right after Esc is both keys (patches
  ``XTermParser._sequence_to_key_events``: Textual dropped the Esc, or typed it as "^"); a
  paste holding ESC is one paste, its colour codes out (wraps ``XTermParser.feed``: Textual
  read what followed the first ESC as keys);
- :mod:`.wrapping`: text folds into at least one cell, so a terminal narrowed to a few
  columns does not stop the app (wraps ``Content._wrap_and_format``; Rich raised at 0);
- :mod:`.testing` (for tests and benchmarks only, not imported by the app): events delivered
  as the terminal driver does, the updates written to the terminal, the screen rendered anew.

:mod:`.gate` decides once per process whether the patches are on: only on the Textual releases
they were tested on, unless ``CHATUI_TEXTUAL_PATCHES`` says ``off`` or ``force``. Off, chatui
takes Textual's public path: the same screens (a test compares them), more work per frame.
Nothing here may break the import of the UI on another release: private imports fall back to
public ones.
"""

from __future__ import annotations

from . import compositor, keys, strips, styles_cache, wrapping
from .app_hooks import ReportsFatalErrors
from .gate import ENABLED, ENV_VAR, TESTED_VERSIONS, patches_enabled, textual_version
from .widget_hooks import NoLayoutOnResize, RepaintsNewRowsOnly, forget_measured_size

__all__ = [
    "ENABLED", "ENV_VAR", "TESTED_VERSIONS", "NoLayoutOnResize", "RepaintsNewRowsOnly",
    "ReportsFatalErrors", "apply", "forget_measured_size", "patches_enabled", "textual_version",
]


def apply() -> bool:
    """Patch Textual's compositor, strips, input parser and wrapping where the gate allows
    (idempotent); whether they are patched. The widget and app hooks are decided when their
    classes are built."""
    if not ENABLED:
        return False
    return (strips.apply() & compositor.apply() & styles_cache.apply() & keys.apply()
            & wrapping.apply())
