"""A screen dismissed once: a second dismiss, once it is no longer on top, does nothing.

Textual's ``Screen.dismiss`` pops whatever screen is on top of the stack, not the screen it
is called on. A key pressed twice before a screen was gone (Enter twice in the command
palette, found by random keys in tests/test_monkey.py) dismissed it twice: the second time
it popped the chat screen under it, and the next key stopped the app ("the chat screen is
not open"). Every screen chatui pushes, and its command palette, take this mixin; the app
never pops the chat screen either (``ChatApp.pop_screen``).
"""

from __future__ import annotations

from typing import Any

from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.command import CommandPalette
from textual.message import Message
from textual.message_pump import MessagePump
from textual.widgets import Input, OptionList


async def _nothing() -> None:
    return None


class DismissOnce:
    """Mixin for a :class:`~textual.screen.Screen`: ``dismiss`` when the screen is not the
    active one (already dismissed, or under another) neither pops a screen nor calls back;
    before the screen is mounted, it waits until it is."""

    def dismiss(self, result: Any = None) -> AwaitComplete:
        if not self.is_active:  # type: ignore[attr-defined]
            return self.dismiss_nothing(self)  # type: ignore[arg-type]
        if not self.is_mounted:  # type: ignore[attr-defined]
            # before it is up (Ctrl+F and Esc at once): once it is, or its mount ran on a
            # screen gone, without its widgets, and stopped the app
            self.call_later(self._dismiss_later, result)  # type: ignore[attr-defined]
            return self.dismiss_nothing(self)  # type: ignore[arg-type]
        return super().dismiss(result)  # type: ignore[misc]

    def _dismiss_later(self, result: Any) -> None:
        self.dismiss(result)  # (not awaited: awaiting it in its own handler raises)

    @staticmethod
    def dismiss_nothing(node: MessagePump) -> AwaitComplete:
        """What a dismiss (or a pop) that does nothing returns: an awaitable, as Textual's."""
        return AwaitComplete(_nothing()).call_next(node)


class ChatPalette(DismissOnce, CommandPalette):
    """Textual's command palette, dismissed once (see the module docstring), and its command
    run once: the second Enter chose the command again after the palette had gone, and it
    ran twice (``/retry`` twice is two replies). Every palette the app opens is one (Ctrl+P,
    Textual's theme and command searches)."""

    BINDINGS = [
        Binding("pagedown", "page(1)", "Next page", show=False),
        Binding("pageup", "page(-1)", "Previous page", show=False),
    ]

    def action_page(self, direction: int) -> None:
        """PageDown / PageUp in the list, when it is shown: with the list hidden (its options
        kept while the palette waits for a search) a page key stopped the app, Textual
        8.2.8's list paging by lines it measures only at a size above zero (KeyError)."""
        options = self.query_one(OptionList)
        if not options.display or not options.scrollable_content_region:
            return
        if direction > 0:
            options.action_page_down()
        else:
            options.action_page_up()

    def on_input_changed(self, event: Input.Changed) -> None:
        # a key typed just before Esc reached the box after the palette had gone: its search
        # queried the palette's list, gone with it, and the app stopped (NoMatches)
        self._only_while_open(event)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self._only_while_open(event)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._only_while_open(event)

    def _only_while_open(self, event: Message) -> None:
        """Run before the palette's own handlers (a subclass's come first): once the palette
        has been dismissed, the event goes no further (no second choice, no search)."""
        if not self.is_active:
            event.prevent_default()
            event.stop()


__all__ = ["ChatPalette", "DismissOnce"]
