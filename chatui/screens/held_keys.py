"""A screen's side of the app's hold on keys (``ChatApp.hold_keys``): a key whose effect comes
a moment later (a search's Enter that opens its hit once the search has answered, a column's
Enter that closes the compare screen) holds the keys typed after it, and lets them go once
its effect is drawn, so that they act where that effect put the focus (the chat's box) and
not in a screen that was closing."""

from __future__ import annotations

from textual.dom import DOMNode

from ..messages import SubmitSettled


def hold_keys(node: DOMNode) -> int | None:
    """Hold the keys typed from now on (None where the app holds none: then the release
    that follows finds nothing to let go)."""
    hold = getattr(node.app, "hold_keys", None)
    return hold() if callable(hold) else None


def release_keys(node: DOMNode, hold: int | None) -> None:
    """Let ``hold``'s keys go (None: the app's current hold, the one after Enter in the
    message box) once the screen now on top has drawn itself: the chat, where the screen of
    ``node`` has just closed, or a screen that a command or a key has just opened."""
    node.app.screen.call_after_refresh(node.app.post_message, SubmitSettled(hold))
