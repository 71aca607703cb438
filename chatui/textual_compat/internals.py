"""Private reads of Textual's state that widgets use to do less work, behind the gate.

Each answers a question Textual's public API cannot, on the releases the gate trusts; off the
gate (or if the attribute is gone) each gives the answer that makes the caller take the public
path: slower, never wrong.

- :func:`drop_detached_watchers`: the watcher list of a reactive (``DOMNode.__watchers``),
  pruned of nodes no longer attached (Textual 8.2.8 prunes it only when the reactive changes;
  the footer's ``compact`` never does, so every recompose leaked ~20 keys; see
  ``chatui.widgets.footer``);
- :func:`bindings_ready`: whether a :class:`~textual.widgets.Footer` has its bindings
  (``Footer._bindings_ready``);
- :func:`visible_regions`: the compositor's map of visible widgets (``Screen._compositor.
  visible_widgets``), so a widget can tell whether it is on screen without
  ``Screen.find_widget`` building the whole map (~20 ms with 60 replies);
- :func:`follows_end`: whether an anchored scroll still follows its end (``Widget.
  _anchor_released``), which a conversation's window asks right after ``/load``, before any
  layout has given the scroll offset a meaning;
- :func:`set_footer_key_enabled`: a footer key greyed out or not in place (``FooterKey.
  _disabled``, which its click reads, beside its public ``-disabled`` class), so that a binding
  that is only enabled or disabled does not rebuild the footer (see ``chatui.widgets.footer``);
- :func:`paint_scroll_now`: a page scrolled by a key drawn at once (``Screen._refresh_layout``)
  instead of on the next frame of Textual's 60-a-second timer.
"""

from __future__ import annotations

from typing import Any

from textual.dom import DOMNode
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from .gate import ENABLED


def drop_detached_watchers(node: DOMNode, attribute: str) -> int:
    """Forget the watchers of ``node.attribute`` whose watching node is no longer attached;
    how many were dropped (0, doing nothing, where the gate is off)."""
    if not ENABLED:
        return 0
    watchers = getattr(node, "__watchers", {}).get(attribute)
    if not watchers:
        return 0
    kept = [(watcher, callback) for watcher, callback in watchers
            if getattr(watcher, "is_attached", True)]
    dropped = len(watchers) - len(kept)
    watchers[:] = kept
    return dropped


def bindings_ready(footer: Footer) -> bool:
    """Whether ``footer`` has read its screen's bindings (True where it cannot be told)."""
    return bool(getattr(footer, "_bindings_ready", True)) if ENABLED else True


def visible_regions(screen: Screen) -> dict[Any, Any] | None:
    """The compositor's visible widgets (widget -> (region, clip, ...)), or None: then ask
    ``screen.find_widget``."""
    if not ENABLED:
        return None
    visible = getattr(getattr(screen, "_compositor", None), "visible_widgets", None)
    return visible if isinstance(visible, dict) else None


def follows_end(widget: Widget) -> bool:
    """Whether ``widget`` keeps to its end as content is added: anchored, and the anchor not
    released by the user scrolling away. Off the gate: anchored and scrolled to the end."""
    if ENABLED and widget.is_anchored:
        released = getattr(widget, "_anchor_released", None)
        if isinstance(released, bool):
            return not released
    return widget.is_anchored and widget.scroll_y >= widget.max_scroll_y - 1


def set_footer_key_enabled(key: Widget, enabled: bool) -> bool:
    """Show ``key`` (a footer's ``FooterKey``) enabled or greyed out, as a new
    ``FooterKey(disabled=not enabled)`` would be; False (nothing changed) where the gate is
    off or the key has no such state: then the footer is composed anew."""
    if not ENABLED or not isinstance(getattr(key, "_disabled", None), bool):
        return False
    key._disabled = not enabled  # type: ignore[attr-defined]
    key.set_class(not enabled, "-disabled")
    return True


def paint_scroll_now(screen: Screen) -> bool:
    """Draw ``screen`` where its widgets have just been scrolled to, now, rather than on its
    next frame (``Screen._refresh_layout(scroll=True)``, what the frame timer runs); whether
    it did. Textual paints on a 60-a-second grid once the scroll's messages have reached the
    screen: a page scrolled by a key waited 0-17 ms for it, and a key held down (a page every
    33 ms) more when that frame fell behind the window's work. Nothing is drawn while the app
    batches updates (a half-mounted window), off the gate, or off the current screen."""
    if not ENABLED or not screen.is_current or screen.app._batch_count:
        return False
    refresh = getattr(screen, "_refresh_layout", None)
    if refresh is None:
        return False
    refresh(scroll=True)
    return True
