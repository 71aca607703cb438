"""The history's search box (``/find``, Ctrl+F): type words, see the saved conversations that
hold them as you type, Enter opens one.

With an empty box it lists every saved conversation, newest first (``/history``'s list); with
words it shows the matches of ``chatui.transcript.search`` (an index beside the transcripts,
17 ms over 1,000 of them here), each with the passage that matched. Searching runs off the UI
thread and only the newest answer is shown, so typing never waits on it.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.timer import Timer
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from ..reporting import run_reported
from ..transcript import list_transcripts
from ..transcript.search import fts_query, search_transcripts
from ..widgets.text import messages_label
from .held_keys import hold_keys, release_keys
from .once import DismissOnce

SEARCH_DELAY_S = 0.12
"""How long typing must pause before a search runs (one search per pause, not per key)."""


@dataclass(frozen=True)
class Found:
    """One row of the list: a conversation, and the passage that matched (if searching)."""

    path: Path
    title: str
    updated: float
    messages: int
    passage: str = ""
    error: str = ""
    branch: bool = False
    """A branch of another saved conversation (the two share their title)."""


def _row(found: Found) -> Content:
    """A conversation's row: when, its size (and whether it is a branch), then its title, so
    that a long title wraps after them (the size came last, and a long title split it: a "4"
    ended one line and "messages" began the next; seen in tmux)."""
    when = datetime.datetime.fromtimestamp(found.updated).strftime("%Y-%m-%d %H:%M")
    size = "" if found.error else f"  {messages_label(found.messages)}" + (
        " · a branch" if found.branch else "")
    head = Content.assemble((when, "$text-muted"), (size, "$text-muted"), "  ",
                            (found.title or "(untitled)", "bold"))
    if found.error:
        return Content("\n").join([head, Content.styled(found.error, "$text-error")])
    if not found.passage:
        return head
    return Content("\n").join([head, _passage(found.passage)])


def _passage(text: str) -> Content:
    """The matched passage with the matched words (between [ and ]) highlighted."""
    parts: list[tuple[str, str] | str] = ["  "]
    rest = text
    while "[" in rest and "]" in rest[rest.index("["):]:
        start = rest.index("[")
        end = rest.index("]", start)
        parts.append(rest[:start])
        parts.append((rest[start + 1:end], "bold $accent"))
        rest = rest[end + 1:]
    parts.append(rest)
    return Content.assemble(*parts)


class HistoryScreen(DismissOnce, ModalScreen[tuple[Path, str] | None]):
    """Search and open a saved conversation; dismissed with its path and the search's text
    (the opener shows the branch that holds it), or None."""

    DEFAULT_CSS = """
    HistoryScreen { align: center middle; }
    HistoryScreen > Vertical { width: 100; max-width: 100%; height: 80%;
        border: round $primary; background: $surface; padding: 0 1; }
    HistoryScreen Input { margin-bottom: 1; }
    HistoryScreen OptionList { height: 1fr; }
    HistoryScreen #history-count { color: $text-muted; height: 1; }
    """

    BINDINGS = [
        Binding("escape", "dismiss_none", "Close", priority=True),
        Binding("down", "move(1)", "Next", show=False, priority=True),
        Binding("up", "move(-1)", "Previous", show=False, priority=True),
        Binding("pagedown", "move(10)", show=False, priority=True),
        Binding("pageup", "move(-10)", show=False, priority=True),
        Binding("enter", "open", "Open", show=False, priority=True),
    ]
    """The keys that act on the list are priority bindings (run as the key arrives, whichever
    widget has the focus); what they do waits behind the keys typed before them
    (:meth:`_after_typing`)."""

    def __init__(self, directory: Path | None = None, query: str = "") -> None:
        super().__init__()
        self.directory = directory
        self.initial = query
        self.found: list[Found] = []
        self._generation = 0
        self._answered = 0
        """The search whose answer the list shows (``_generation`` when it is the latest)."""
        self._waiting: list[Callable[[], None]] = []
        """Keys that act on the list (a move, Enter) typed before the latest answer came."""
        self._start_now: Callable[[], None] | None = None
        """Starts the search that waits for a pause in the typing (None when none waits)."""
        self._text = query
        """The text of the latest search (started or waiting)."""
        self._hold: int | None = None
        """The app's hold on the keys typed after Enter, until the chat is back."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Input(self.initial, placeholder="Search saved conversations (words, as "
                        "prefixes; Enter opens, Esc closes)", id="history-query")
            yield Static("", id="history-count")
            yield OptionList(id="history-list")

    def on_mount(self) -> None:
        self.query_one(Input).focus()
        self.refresh_list(self.initial, delay=0.0)

    @on(Input.Changed, "#history-query")
    def _changed(self, event: Input.Changed) -> None:
        self.refresh_list(event.value)

    _pending: Timer | None = None

    def refresh_list(self, text: str, delay: float = SEARCH_DELAY_S) -> None:
        """Search for ``text`` once ``delay`` has passed with nothing newer typed (a timer,
        not a worker a key: a worker cancelled before it started left its coroutine never
        awaited); a search already running finishes and its answer is dropped."""
        self._generation += 1
        generation = self._generation
        self._text = text
        if self._pending is not None:
            self._pending.stop()
            self._pending = None

        def start() -> None:
            if self._pending is not None:
                self._pending.stop()
            self._pending = self._start_now = None
            run_reported(self, self._search(text, generation),
                         what="Searching the history", group="history-search")

        if delay and not self._waiting:
            self._start_now = start
            self._pending = self.set_timer(delay, start)
        else:
            start()

    def _when_answered(self, action: Callable[[], None]) -> None:
        """Run ``action`` (a key on the list) on the latest search's answer: "copper" and
        Enter typed at once opened the newest conversation, first in the list shown before
        the search had answered (seen in tmux). A search waiting for a pause in the typing
        starts now: the key says the typing is done."""
        if self._answered == self._generation:
            action()
            return
        self._waiting.append(action)
        if self._start_now is not None:
            self._start_now()

    async def _search(self, text: str, generation: int) -> None:
        if generation != self._generation:
            return
        if fts_query(text):
            hits = await asyncio.to_thread(search_transcripts, text, self.directory, 200)
            found = [Found(h.path, h.title, h.updated, h.messages, f"{h.where}: {h.snippet}")
                     for h in hits]
            count = (f"{len(found)} conversations hold {text.strip()!r}" if len(found) > 1
                     else f"1 conversation holds {text.strip()!r}" if found
                     else f"No saved conversation holds {text.strip()!r}.")
        else:
            listed = await asyncio.to_thread(list_transcripts, self.directory)
            found = [Found(s.path, s.title, s.updated, s.messages, error=s.error,
                           branch=bool(s.parent)) for s in listed]
            count = (f"{len(found)} saved conversation{'s' * (len(found) != 1)}, newest first"
                     if found else "No saved conversations yet.")
        if generation != self._generation:
            return  # a newer search is on its way
        self.found = found
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options([Option(_row(f), disabled=bool(f.error)) for f in found])
        if found:
            options.highlighted = next((i for i, f in enumerate(found) if not f.error), None)
        self.query_one("#history-count", Static).update(count)
        self._answered = generation
        waiting, self._waiting = self._waiting, []
        for action in waiting:
            action()

    def _after_typing(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the keys typed before it are in the box and the search for
        them has answered (a priority binding runs ahead of keys still queued for the box:
        "copper" and Enter at once would have searched for "coppe")."""
        field = self.query_one(Input)

        def typed() -> None:
            if field.value != self._text:
                self.refresh_list(field.value, delay=0.0)
            self._when_answered(action)

        field.call_later(typed)

    def action_move(self, step: int) -> None:
        self._after_typing(lambda: self._move(step))

    def action_open(self) -> None:
        """Enter: open the highlighted hit of the search for what was typed. The app holds
        the keys typed after it until the chat is back: the screen closes a moment later,
        and a message typed at once went to this box and was lost with it."""
        if self._hold is None:
            self._hold = hold_keys(self)
        self._after_typing(self._open_highlighted)

    def _move(self, step: int) -> None:
        options = self.query_one(OptionList)
        if not self.found:
            return
        current = options.highlighted if options.highlighted is not None else -1
        options.highlighted = max(0, min(len(self.found) - 1, current + step))

    def _open_highlighted(self) -> None:
        if not self.is_active:
            return  # (closed meanwhile)
        index = self.query_one(OptionList).highlighted
        if index is not None and 0 <= index < len(self.found) and not self.found[index].error:
            self.dismiss((self.found[index].path, self.query_one(Input).value))
        hold, self._hold = self._hold, None
        release_keys(self, hold)

    @on(OptionList.OptionSelected, "#history-list")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        if 0 <= event.option_index < len(self.found):
            self.dismiss((self.found[event.option_index].path, self.query_one(Input).value))

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
