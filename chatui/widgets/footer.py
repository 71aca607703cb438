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

Keys that do not fit the width are hidden whole (:meth:`ChatFooter._fit_keys`): Textual's
footer scrolls them out of view at the edge, mid-word ("f2 C" for "f2 Copy" at 100 cells, in
front of the command palette's key, which lists every key).

A change that only enables or disables bindings (Esc "Stop" when a reply starts and ends,
Ctrl+L "Clear box" when the prompt gets its first character and when it is emptied: four per
exchange) greys the keys in place instead of recomposing: a recompose mounts the ~20 keys
anew, 16-85 ms on the 2-core machine, and a key pressed then waited for it (the first PageUp
right after a reply ended drew its page in 32-37 ms instead of ~6; issue 21).
"""

from __future__ import annotations

from typing import Any

from textual import events
from textual.geometry import Size
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
        self._fit_keys()

    def on_resize(self, event: events.Resize) -> None:
        self._fit_keys()

    def _fit_keys(self) -> None:
        """Hide every key from the first that the footer's width (less the palette's key,
        docked at the right) would cut, so that no key is shown in part. The keys are
        measured, not looked up after a layout, so the layout that places them is already
        the right one (a fit after it drew the cut key for a frame or more, and snapshots
        taken meanwhile differed)."""
        size = self.size
        if not size.width:
            return
        viewport = self.app.size
        room = size.width
        row: list[Widget] = []
        for child in self.children:
            if child.has_class("-command-palette"):
                if child.styles.display != "none":
                    room -= self._outer_width(child, size, viewport)
            else:
                row.append(child)
        x, cut = (row[0].styles.margin.left if row else 0), False
        for n, child in enumerate(row):
            margin = child.styles.margin
            right = x + self._outer_width(child, size, viewport)
            cut = cut or right > room
            child.display = not cut
            following = row[n + 1].styles.margin.left if n + 1 < len(row) else 0
            x = right + max(margin.right, following)

    @staticmethod
    def _outer_width(widget: Widget, container: Size, viewport: Size) -> int:
        """A key's width with its padding and border (its CSS width is auto)."""
        return widget.get_content_width(container, viewport) + widget.styles.gutter.width

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
