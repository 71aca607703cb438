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
"""

from __future__ import annotations

from typing import Any

from textual.widgets import Footer

from ..textual_compat.internals import bindings_ready, drop_detached_watchers


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
        self._shown = signature
        await super().recompose()
        drop_detached_watchers(self, "compact")
