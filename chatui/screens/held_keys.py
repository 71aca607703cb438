"""A screen's side of the app's hold on keys (``ChatApp.hold_keys``): a key whose effect comes
a moment later (a search's Enter that opens its hit once the search has answered, a column's
Enter that closes the compare screen) holds the keys typed after it, and lets them go once
its effect is drawn, so that they act where that effect put the focus (the chat's box) and
not in a screen that was closing. And the other side of a key's order: a priority binding's
work queued behind the keys typed before it (:func:`behind_typed_keys`)."""

from __future__ import annotations

from typing import Any, Callable

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


def behind_typed_keys(node: DOMNode, callback: Callable[..., Any], *args: Any) -> None:
    """Run ``callback(*args)`` behind the keys already on their way to the focused widget: a
    priority binding runs as its key arrives, before the keys typed just ahead of it have
    reached that widget, so what it read there lacked them (Ctrl+Q kept "my unsen" of a draft;
    Ctrl+O continued half a line). Where that widget is closing (its queue refuses the
    callback), the app runs it."""
    focused = node.app.focused
    if focused is None or not focused.call_later(callback, *args):
        node.app.call_later(callback, *args)
