"""The footer, without the footer keys Textual 8 keeps alive after every change of bindings.

Textual's :class:`~textual.widgets.Footer` recomposes whenever the screen's bindings change
(the chat screen changes them twice per reply: when it starts and when it ends) and binds each
new ``FooterKey`` to its ``compact`` reactive with ``data_bind``. Each binding adds a watcher
``(key, callback)`` to a list on the footer that Textual prunes of closed keys only when
``compact`` changes, which it never does: the removed keys stay alive, ~20 widgets of ~270
tracked objects per reply (~5,400 objects per reply, a quarter of what a finished reply kept
alive; measured with ``benchmarks/bench_long.py``, see docs/long-sessions.md).

:class:`ChatFooter` drops the watchers of keys that are no longer attached after each
recompose. The watcher list is a private attribute of Textual's reactive machinery
(``__watchers``, textual 8.2.8), read in :mod:`chatui.textual_compat.internals` behind its gate.

Keys that do not fit the width are hidden whole (:meth:`ChatFooter._hide_cut_keys`): Textual's
footer scrolls them out of view at the edge, mid-word ("f2 C" for "f2 Copy" at 100 cells, in
front of the command palette's key, which lists every key).

A change that only enables or disables bindings (Esc "Stop" when a reply starts and ends,
Ctrl+L "Clear" when the prompt gets its first character and when it is emptied: four per
exchange) greys the keys in place instead of recomposing: a recompose mounts the ~20 keys
anew, 16-85 ms on the 2-core machine, and a key pressed then waited for it (the first PageUp
right after a reply ended drew its page in 32-37 ms instead of ~6; issue 21).
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.widget import Widget
from textual.widgets import Footer

from ..textual_compat.internals import (bindings_ready, drop_detached_watchers,
                                        set_footer_key_enabled)


class ChatFooter(Footer):
    """A :class:`~textual.widgets.Footer` that lets its old keys go, and recomposes only when
    what it shows changed (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown: object = None

    def _signature(self) -> object:
        """What :meth:`Footer.compose` draws from: the shown bindings and their state."""
        if not bindings_ready(self):
            return None
        return (self.compact, self.show_command_palette, tuple(
            (key, binding.action, binding.description, binding.group, enabled, tooltip)
            for key, (_, binding, enabled, tooltip) in self.screen.active_bindings.items()
            if binding.show or key == self.app.COMMAND_PALETTE_BINDING))

    async def recompose(self) -> None:
        # every focus change asks for a recompose (~60 keys restyled: Ctrl+T pressed 30 times
        # restyled ~1,900 footer keys and ~4,100 of their nodes); most leave the keys as they were
        signature = self._signature()
        if signature is not None and signature == self._shown:
            return
        if signature is not None and self._enable_in_place(signature):
            self._shown = signature
            return
        self._shown = signature
        await super().recompose()
        drop_detached_watchers(self, "compact")
        self.call_after_refresh(self._hide_cut_keys)

    def on_resize(self, event: events.Resize) -> None:
        # a wider footer may have room for keys hidden before: shown again, each key is hidden
        # once more if the layout that places it finds it cut
        for child in self._row():
            child.display = True
        self.call_after_refresh(self._hide_cut_keys)

    def _row(self) -> list[Widget]:
        """The keys (and groups of keys) in the row, left to right: not the palette's key."""
        return [child for child in self.children if not child.has_class("-command-palette")]

    def _hide_cut_keys(self, tries: int = 10) -> None:
        """Hide every key from the first that the footer's edge (or the palette's key, docked
        at the right) cuts, so that no key is shown in part (once the keys are laid out: keys
        just mounted may wait for the next frame's layout)."""
        if tries and any(child.display and not child.virtual_region for child in self._row()):
            self.call_after_refresh(self._hide_cut_keys, tries - 1)
            return
        palette = [child for child in self.children
                   if child.has_class("-command-palette") and child.display]
        edge = palette[0].virtual_region.x if palette else self.scrollable_content_region.width
        cut = False
        for child in self._row():
            cut = cut or child.virtual_region.right > edge
            if cut and child.display:
                child.display = False

    def _enable_in_place(self, signature: Any) -> bool:
        """Where the new bindings differ from the shown ones only in being enabled, grey the
        keys out (or back) without composing anew; whether that was all there was to do."""
        shown = self._shown
        if not isinstance(shown, tuple) or shown[:2] != signature[:2]:
            return False
        old, new = shown[2], signature[2]
        if len(old) != len(new):
            return False
        changed: dict[tuple[str, str], bool] = {}
        for a, b in zip(old, new):
            if a[:4] + a[5:] != b[:4] + b[5:]:  # (key, action, description, group, tooltip)
                return False
            if a[4] != b[4]:
                changed[(b[0], b[1])] = b[4]
        keys = {(getattr(k, "key", None), getattr(k, "action", None)): k
                for k in self.query("FooterKey")}
        # a binding that is not the first of its action has no key of its own: nothing to do
        for where, enabled in changed.items():
            key = keys.get(where)
            if key is not None and not set_footer_key_enabled(key, enabled):
                return False
        return True
