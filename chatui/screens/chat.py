"""The chat screen: the conversation, the prompt box, the token inspector and the status bar.

The screen draws and routes. Its state (conversation, settings, armed comparison, running
job) is one :class:`~chatui.state.ChatState`; slash commands are the handlers of the
registry (:mod:`chatui.commands`, :mod:`chatui.chat_commands`), to which the screen is the
narrow command context; compare mode is a composed :class:`CompareFlow`. Every generation,
a single reply or the columns of a comparison, streams through one loop
(:meth:`ChatScreen._stream`) that applies the engine's events through a
:class:`~chatui.recorder.ReplyRecorder` and hands its deltas to the widget showing them.
The app talks down by calls (``model_ready``, ``show_conversation``) and hears back by messages
(``ResponseStarted``/``Complete``/``Failed``); it lends the screen its services (worker, config,
persistence) as :class:`~chatui.chat_commands.AppServices`, so the screen never imports it.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.css.query import NoMatches
from textual.content import Content
from textual.reactive import reactive
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Static, TextArea
from textual.worker import Worker

from inference.settings import SamplingParams
from inference.types import (AssistantPrefix, GenerationRequest, ModelInfo, PromptProgress, Scored,
                             Token)
from inference.worker import describe_error

from .. import commands, gcpolicy, prompt_history
from ..chat_commands import AppServices, same_file
from ..kept_settings import kept_values, model_key
from ..conversation import Conversation, Entry, Reply, fork_points, index_of
from ..messages import (
    AlternativeChosen,
    FanOutRequested,
    InputReady,
    PageConversation,
    PromptCleared,
    PromptSubmitted,
    ReplyChosen,
    ResponseComplete,
    ResponseFailed,
    ResponseStarted,
    TokenSelected,
)
from ..recorder import ContextReported, ReplyRecorder, branch, prefix_of
from ..reporting import reported_callback, run_reported
from ..state import (ChatState, Job, kept_change, model_label, settings_label, speed_label,
                     status_label)
from ..textual_compat.internals import paint_scroll_now
from ..widgets.compare import CompareView
from ..widgets.footer import ChatFooter
from ..widgets.inspector import NARROW_BELOW, WIDE_FROM, TokenInspector
from ..widgets.items import Notice, SiblingBar, UserMessage, estimate_lines
from ..widgets.log_window import Item, LogWindow
from ..widgets.prompt import PromptInput
from ..widgets.reply import ReplyView
from ..widgets.settled import ConversationLog
from ..widgets.status import LoadingPanel, StatusBar
from ..widgets.token_view import TokenView
from .compare_flow import CompareFlow, pick_bindings
from .context_meter import ContextMeter
from .held_keys import release_keys

log = logging.getLogger(__name__)

READING_SAID_AFTER_S = 0.3
"""How long the engine reads a prompt before the status bar says so (``_reading_prompt``)."""

CHECKPOINT_S = 5.0
"""A streaming reply is autosaved this often, as well as when it starts and ends: a terminal
closed, an SSH connection dropped or the app killed mid-reply lost all of it (the file held
the question and an empty reply). A save of a 2,000-token reply takes ~2 ms of the loop (its
snapshot and its JSON line are written on the autosaver's thread)."""
LIVE_S = 0.1
"""How often the side panel follows a streaming reply's newest token (``_show_live``)."""


class ChatScreen(Screen[None]):
    """The main screen. The app hands it its services and the config (attributes down)."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-compact"),
                              (WIDE_FROM, "-wide")]
    """Under ``NARROW_BELOW`` cells the token inspector goes below the conversation; under
    ``WIDE_FROM`` it is beside it in its compact width (``themes/chatui.tcss``)."""

    BINDINGS = [
        Binding("escape", "cancel_edit", "Cancel edit", id="chat.cancel_edit",
                tooltip="End the edit: the conversation stays as it was"),
        Binding("escape", "stop", "Stop", id="chat.stop", tooltip="Stop the reply (keeps it)"),
        Binding("escape", "to_prompt", "To prompt", id="chat.to_prompt",
                tooltip="Back to the message box; the token view stays on (Ctrl+T ends it)"),
        Binding("ctrl+t", "command('/logprobs')", "Tokens", id="chat.tokens",
                tooltip="Token view: probabilities per token"),
        Binding("ctrl+r", "command('/retry')", "Retry", id="chat.retry",
                tooltip="Regenerate the last reply"),
        Binding("ctrl+g", "command_in_order('/edit')", "Edit", id="chat.edit", priority=True,
                tooltip="Edit the last prompt"),
        Binding("ctrl+o", "command('/continue')", "Continue", id="chat.continue",
                tooltip="Continue a stopped or cut-off reply"),
        Binding("f2", "command('/copy')", "Copy", id="chat.copy",
                tooltip="Copy the last reply"),
        Binding("f3", "command('/copy code')", "Copy code", id="chat.copy_code", show=False,
                tooltip="Copy the last code block"),
        Binding("f4", "command('/reasoning')", "Reasoning", id="chat.reasoning", show=False,
                tooltip="Unfold or fold the last reply's reasoning"),
        Binding("r", "command('/raw')", "Raw", id="chat.raw", show=False,
                tooltip="Raw token view (special tokens)"),
        Binding("ctrl+s", "command('/save')", "Save", id="chat.save", show=False,
                tooltip="Save the conversation now"),
        Binding("f1", "command('/help')", "Help", id="chat.help", priority=True,
                tooltip="Commands and keys"),
        Binding("ctrl+f", "command('/find')", "Find", priority=True, id="chat.find", show=False,
                tooltip="Search the saved conversations"),
        Binding("alt+left", "command('/sibling prev')", "Prev", id="chat.prev", show=False,
                tooltip="The previous alternative (‹ 2/3 ›) of the last message with several"),
        Binding("alt+right", "command('/sibling next')", "Next", id="chat.next", show=False,
                tooltip="The next alternative of the last message with several"),
        Binding("f5", "command('/tree')", "Tree", priority=True, id="chat.tree", show=False,
                tooltip="The conversation as a tree of branches"),
        *pick_bindings(),
    ]
    """Keys run the same registry handlers as the slash commands (``action_command``). The
    keys that open a screen are priority bindings: run as the key arrives, so the app holds
    the keys typed after it for that screen (``ChatApp.on_event``); as plain bindings they
    ran once the key had bubbled up, and the keys behind it went to the message box."""

    generating: reactive[bool] = reactive(False)
    """Drawn from ``state.job`` (set by the streaming loop only)."""
    _blink = True
    """Whether the prompt's cursor blinks when no reply streams."""
    token_mode: reactive[bool] = reactive(False, init=False)
    raw: reactive[bool] = reactive(False, init=False)

    def __init__(self, services: AppServices, *, settings: SamplingParams | None = None,
                 overrides: dict[str, Any] | None = None, top_logprobs: int = 5,
                 system_prompt: str = "", token_mode: bool = False,
                 stable_timings: bool = False) -> None:
        super().__init__()
        self.services = services
        self.state = ChatState(conversation=Conversation(system_prompt=system_prompt),
                               settings_from_user=settings is not None,
                               overrides=dict(overrides or {}), top_logprobs=top_logprobs)
        self.state.settings = self.state.with_overrides(settings or SamplingParams())
        self.stable_timings = stable_timings
        self.compare = CompareFlow(self)
        self.meter = ContextMeter(lambda: self.status, self.notify)
        self.carryover = prompt_history.Carryover(services.config.prompt_history_dir())
        """The prompts, unsent message and notebook document the last session left."""
        self._restored_draft: str | None = None
        """The message the last session left unsent, put back in the box, until the box is
        first sent (see :func:`commands.command_after_draft`)."""
        self._token_focus: TokenView | None = None
        """The token view to focus as the token view switches on (/score's message), once;
        None: the last reply's."""
        self._gen_worker: Worker | None = None
        self._window: LogWindow | None = None
        """The conversation's items and which of them have widgets (see :attr:`window`)."""
        self._counter = 0
        self._waiting_notice: Item | None = None
        """The notice that a message waits for the model, while one does (removed when it is
        sent or the model fails: it would say something no longer true)."""
        self._slot: Item | None = None
        """Where the messages that replace those a /retry or an edit took off the screen go:
        the item that followed them (a notice), or None (at the end). Set by :meth:`rewind`,
        given up once the new reply is placed or the path changes otherwise: a notice made
        after the old reply ("Saved to ...") stood between the prompt and its new reply."""
        self._scores: dict[str, list[Token]] = {}
        """The tokens of each scored message shown (``/score``), by its widget id: in memory
        only, for this conversation."""
        self._live: str = ""
        """The streaming reply whose newest token the side panel follows (its view's id; ""
        when none): a new reply's, until a token is selected (see :meth:`_show_live`)."""
        self._live_at = 0.0
        self.set_reactive(ChatScreen.token_mode, token_mode)

    # ---- the state, as the tests and the app read it ----

    @property
    def conversation(self) -> Conversation:
        return self.state.conversation

    @property
    def settings(self) -> SamplingParams:
        return self.state.settings

    @property
    def info(self) -> ModelInfo | None:
        return self.state.info

    @property
    def load_error(self) -> str:
        return self.state.load_error

    @property
    def top_logprobs(self) -> int:
        return self.state.top_logprobs

    @property
    def compare_armed(self) -> tuple[str, ...]:
        return self.compare.armed

    @property
    def can_pick(self) -> bool:
        return self.compare.can_pick

    # ---- typed accessors ----

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

    @property
    def window(self) -> LogWindow:
        """The one index of what the conversation shows: an item per message or notice, with
        widgets only near the viewport (issue 21: a 200-reply conversation drawn whole kept
        ~1,800 objects per reply alive and took 7.5 s to load)."""
        if self._window is None:
            self._window = LogWindow(self.log_view,
                                     settled=lambda: gcpolicy.page_drawn())
        return self._window

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def inspector(self) -> TokenInspector:
        return self.query_one(TokenInspector)

    @property
    def loading_panel(self) -> LoadingPanel:
        return self.query_one(LoadingPanel)

    def compose(self) -> ComposeResult:
        yield StatusBar()
        with Horizontal(id="main"):
            yield ConversationLog(id="conversation")
            yield TokenInspector(id="inspector")
        yield LoadingPanel(id="loading")
        yield Static(id="hint")
        yield PromptInput(id="prompt", argument_candidates=self._argument_candidates)
        yield ChatFooter()

    def on_mount(self) -> None:
        self.log_view.anchor()
        self.query_one(ConversationLog).type_into = self._type_into_prompt
        self.window.watch()
        self.watch(self.log_view, "scroll_y", self._scrolled, init=False)
        self.inspector.display = self.token_mode
        self.query_one("#hint").display = False
        self.settings_changed()
        self.set_interval(0.3, self._follow_context)
        self._recall_prompts()
        self.prompt.focus()
        self.post_message(InputReady())  # the app hands over keys typed before now

    # ---- what a session carries over to the next (chatui.prompt_history.Carryover) ----

    def _recall_prompts(self) -> None:
        """Earlier sessions' prompts for Up; the message left unsent when chatui last ended
        waits for :meth:`put_back_draft`."""
        self.prompt.prompt_history[:0] = self.carryover.prompts

    def put_back_draft(self, *, typed: bool) -> None:
        """The message left unsent when chatui last ended, back in the box, before the keys
        typed at start are handed over; where keys were typed already, the draft goes to the
        prompt history instead (Up brings it back: put in the box, the keys would have been
        added to it, and an Enter among them would have sent both)."""
        draft = self.carryover.take_draft()
        if not draft:
            return
        if typed or self.prompt.text:
            self.prompt.prompt_history.append(draft)
            self.notice("The message you had not sent when chatui last ended is in the prompt "
                        "history: Up brings it back.")
            return
        self.prompt.set_text(draft)
        self._restored_draft = draft
        self.notice("The message you had not sent when chatui last ended is back in the box "
                    "(Ctrl+L empties it).")

    def keep_draft(self) -> None:
        """As chatui ends: the box's text and the open notebook's document carried over."""
        from .notebook import NotebookScreen

        notebook = next((s.text_area.text for s in self.app.screen_stack
                         if isinstance(s, NotebookScreen)), None)
        self.carryover.at_exit(self.prompt.text, notebook)

    # ---- model loading (the app calls these) ----

    def load_progress(self, stage: str, done: float, total: float | None) -> None:
        for panel in self.query(LoadingPanel):
            panel.progress(stage, done, total)

    def _loading_done(self) -> None:
        """Remove the loading panel: hidden, its progress bar would still animate."""
        for panel in self.query(LoadingPanel):
            panel.remove()

    def model_ready(self, info: ModelInfo) -> None:
        """The model loaded: show it and send any message typed while loading."""
        kept = kept_values(self.services.config.resolved_config_dir(), model_key(info))
        chosen = self.state.settings_from_user  # (/set while it loaded: that stays in force)
        self.state.model_ready(info, kept)
        if kept and not chosen and (change := kept_change(info.default_settings, kept)):
            flags = (f" In force with the command line's flags: "
                     f"{settings_label(self.state.settings)}." if self.state.overrides else "")
            self.notice(f"Kept from your last chat with this model: {change}.{flags} /set reset "
                        "goes back to the model's own.")
        self.status.model = model_label(info)
        self.status.context_limit = info.context_limit
        self.inspector.reports_ids = info.has_token_ids
        self.inspector.reports_entropy = info.has_entropy
        self.settings_changed()
        self._loading_done()
        if info.chat_template_warning:
            self.notice(info.chat_template_warning, "warning")
        if self.state.waiting_for_model:
            self.state.waiting_for_model = False
            self._drop_waiting_notice()
            self.answer("")

    def model_reloading(self) -> None:
        """The engine is being restarted: show the loading panel again; messages sent
        meanwhile wait for it (as while the app starts)."""
        self.state.info = None
        self.status.model = "restarting the engine…"
        if not self.query(LoadingPanel):
            self.mount(LoadingPanel(id="loading"), before=self.query_one("#hint"))

    def model_failed(self, message: str) -> None:
        """The model could not be loaded: say so; commands keep working."""
        self.state.load_error = message
        self.status.model = "no model"
        self._loading_done()
        self.state.waiting_for_model = False
        self._drop_waiting_notice()
        self.notice(f"The model could not be loaded: {message}", "error")
        self.app.notify(message, title="Loading failed", severity="error", timeout=10,
                        markup=False)

    async def show_conversation(self, conversation: Conversation, *,
                                cleared: bool = False) -> None:
        """Replace the conversation (``/load``, ``/clear``) and draw all of it."""
        await self.stop_generation()
        self.state.conversation = conversation
        if self.state.editing is not None:
            self.end_edit()  # (its message is gone from the screen)
        await self.window.clear()
        self._slot = None
        self._scores.clear()
        gcpolicy.release()  # the old conversation's widgets are garbage now
        self.inspector.clear()
        if cleared:
            self.meter.reset()
            if self.info is not None:
                await self.services.worker.reset()
            return
        for entry in conversation.entries:
            if entry.role == "user":
                self.window.add(self._user_item(entry))
            elif entry.replies:
                self.window.add(self._reply_item(entry))
        if self.info is not None:
            await self.services.worker.reset()
            await self._update_context()
        self.log_view.scroll_end(animate=False)
        self.log_view.anchor()

    # ---- conversation items ----

    def notice(self, text: str, kind: str = "info") -> Notice:
        """Add a notice to the conversation (info, warning or error)."""
        widget = self.window.append(self._notice_item(text, kind))[0]
        self.log_view.scroll_end(animate=False)
        assert isinstance(widget, Notice)
        return widget

    def _drop_waiting_notice(self) -> None:
        item, self._waiting_notice = self._waiting_notice, None
        if item is not None and not item.gone:
            self.call_later(self.window.remove, item)

    def _next_id(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}-{self._counter}"

    # Each item builds its widgets afresh whenever it comes near the viewport, from the
    # conversation's data and the screen's switches as they are then (token view, raw), under
    # the same ids each time.

    def _notice_item(self, text: str, kind: str, key: object = None) -> Item:
        return Item(build=lambda: [Notice(text, kind=kind)],
                    estimate=lambda width: estimate_lines(text, width - 2) + 1,
                    key=key, tag="notice")

    def _sibling_bar(self, entry: Entry) -> list[Widget]:
        """``‹ 2/3 ›`` under ``entry`` when it has alternatives (none otherwise)."""
        try:
            kids = self.state.conversation.siblings(entry)
        except ValueError:  # no longer in the tree
            return []
        if len(kids) < 2:
            return []
        return [SiblingBar(entry.node, index_of(kids, entry), len(kids))]

    def _user_item(self, entry: Entry) -> Item:
        widget_id = self._next_id("user")
        return Item(build=lambda: [UserMessage(entry.text, id=widget_id),
                                   *self._sibling_bar(entry)],
                    estimate=lambda width: estimate_lines(entry.text, width - 3) + 3,
                    key=entry, tag="user")

    def show_score(self, label: str, scored: Scored) -> None:
        """Show a scored message under the conversation in the token view (token mode on,
        the inspector on its least likely token). Kept in memory only (see
        :mod:`chatui.widgets.scored`)."""
        from ..widgets.parts_line import joined
        from ..widgets.scored import ScoredMessage, score_summary_pieces

        widget_id = self._next_id("scored")
        tokens = list(scored.tokens)
        self._scores[widget_id] = tokens
        summary = score_summary_pieces(label, tokens, scored.perplexity, scored.scored,
                                       scored.least_likely(3))
        raw = self.raw
        item = Item(build=lambda: [ScoredMessage(summary, tokens, raw=raw, id=widget_id)],
                    estimate=lambda width: estimate_lines(joined(summary), width - 2)
                    + estimate_lines("".join(t.text for t in tokens), width - 2) + 1,
                    tag="scored")
        widget = self.window.append(item)[0]
        assert isinstance(widget, ScoredMessage)
        view = widget.token_view
        # Focused without scrolling to it, and the log anchored at its end (where the message
        # is) while the replies above re-wrap beside the inspector. Before, the token view
        # switched on focused the last reply, whose scroll to it, the focus's own and the
        # cursor's ran on the heights from before the re-wrap, and the log stopped mid-reply
        # with the scored message off the screen (seen in a terminal; the pilot's layout
        # settles between the steps).
        if self.token_mode:
            view.focus(scroll_visible=False)
        else:
            self._token_focus = view
            self.token_mode = True
        log_view = self.log_view
        log_view.anchor()
        least = scored.least_likely(1)

        def select() -> None:
            if least:
                at = next((i for i, u in enumerate(view.units)
                           if u.start <= least[0].index <= u.end), None)
                if at is not None:
                    view.cursor = at  # (scrolls to its line, by the heights known now)
            if widget.outer_size.height <= log_view.scrollable_content_region.height:
                log_view.anchor()  # all of it fits: the end shows it, the cursor with it

        self.call_after_refresh(select)

    def open_notebook(self, notice: str = "", opened: Conversation | None = None) -> None:
        """Raw mode's notebook over this screen (:mod:`chatui.screens.notebook`); ``opened``:
        a saved raw-mode conversation to show in it."""
        from .notebook import NotebookScreen

        notebook = next((s for s in self.app.screen_stack if isinstance(s, NotebookScreen)),
                        None)
        if notebook is None:
            self.app.push_screen(NotebookScreen(self, notice=notice, opened=opened))
        elif opened is not None:
            notebook.show_saved(opened)

    def probe_point(self) -> tuple[Entry, Reply, int] | None:
        """The reply token under the token view's cursor (``/probe`` asks about it): its
        entry, its reply and its position; None when the cursor is on no reply's token."""
        if not self.token_mode or self.inspector.position < 0:
            return None
        found = self._find_view(self.inspector.view_id)
        if found is None:
            return None
        entry, view = found
        if not 0 <= self.inspector.position < len(view.reply.tokens):
            return None
        return entry, view.reply, self.inspector.position

    def _scored_token_selected(self, event: TokenSelected) -> None:
        """The cursor moved in a scored message's token view: its token in the inspector."""
        from ..widgets.scored import ScoredMessage

        tokens = self._scores.get(event.view_id)
        if tokens is None:
            return
        try:
            widget = self.query_one(f"#{event.view_id}", ScoredMessage)
        except NoMatches:
            return
        units = widget.token_view.units
        if not 0 <= event.unit < len(units):
            return
        unit = units[event.unit]
        self.inspector.show(event.view_id, tokens[unit.start:unit.end + 1], event.unit,
                            len(units), position=unit.start, forkable=False)

    def _reply_item(self, entry: Entry) -> Item:
        """An assistant entry's item: one reply, or the columns of a comparison."""
        ids = [self._next_id("reply") for _ in entry.replies]
        group_id = self._next_id("compare")

        def build() -> list[Widget]:
            if entry.is_comparison:
                return [CompareView(entry, view_ids=ids, stable_timings=self.stable_timings,
                                    token_mode=self.token_mode, raw=self.raw, id=group_id),
                        *self._sibling_bar(entry)]
            reply = entry.reply
            assert reply is not None
            view = ReplyView(reply, stable_timings=self.stable_timings,
                             token_mode=self.token_mode, id=ids[0])
            view.raw = self.raw
            try:
                view.forks = frozenset(fork_points(self.state.conversation, entry))
            except ValueError:  # no longer in the tree
                pass
            return [view, *self._sibling_bar(entry)]

        def estimate(width: int) -> int:
            columns = len(entry.replies)
            inner = (width - 1) // columns if columns > 1 else width - 3
            return max(estimate_lines(r.text, inner) for r in entry.replies) + 4 + (
                columns > 1)

        return Item(build=build, estimate=estimate, key=entry, tag="reply")

    def _mount_user(self, entry: Entry) -> None:
        self._place_new(self._user_item(entry))

    def _place_new(self, item: Item) -> None:
        """Draw a new message's ``item`` at the end, or where the messages a /retry or an
        edit took away were (``_slot``)."""
        slot = self._slot
        if slot is not None and not slot.gone and slot in self.window.items:
            self.window.insert_before(item, slot)
        else:
            self.window.append(item)

    def _reply_item_of(self, entry: Entry) -> Item | None:
        return next((i for i in self.window.items_of(entry) if i.tag == "reply"), None)

    def _view_of(self, entry: Entry, *, draw: bool = False) -> ReplyView | CompareView | None:
        """The widget showing an assistant entry (the group, for a comparison); None when it
        has no widgets now, unless ``draw``: then it gets them (and an entry without an item
        gets one, at the end)."""
        item = self._reply_item_of(entry)
        if item is None:
            if not draw:
                return None
            item = self._reply_item(entry)
            self._place_new(item)
        elif item.widgets is None:
            if not draw:
                return None
            self.window.draw(item)
        assert item.widgets is not None
        view = item.widgets[0]
        assert isinstance(view, (ReplyView, CompareView))
        if isinstance(view, CompareView) and item.mounting is not None:
            view.mounting = item.mounting
        return view

    def _reply_views(self) -> list[ReplyView]:
        """The reply views that have widgets now (a comparison's columns included)."""
        views: list[ReplyView] = []
        for item in self.window.drawn_items():
            for w in item.widgets or ():
                if isinstance(w, ReplyView):
                    views.append(w)
                elif isinstance(w, CompareView):
                    views.extend(w.views)
        return views

    def _find_view(self, view_id: str) -> tuple[Entry, ReplyView] | None:
        for item in self.window.drawn_items():
            for w in item.widgets or ():
                views = w.views if isinstance(w, CompareView) else [w]
                for v in views:
                    if isinstance(v, ReplyView) and v.id == view_id:
                        assert isinstance(item.key, Entry)
                        return item.key, v
        return None

    async def remove_entry(self, entry: Entry) -> None:
        """Take ``entry`` out of the tree (a send that got nothing back, given back to the box)
        and off the screen. Its file drops it too: the question was autosaved when it was
        sent, and a save that found it missing went on in a branch, as if another window had
        added it."""
        self.state.conversation.delete(entry)
        for item in self.window.items_of(entry):
            await self.window.remove(item)

    async def rewind(self, entry: Entry) -> None:
        """End the conversation before ``entry``: it stays in the tree as a branch (/retry,
        /edit), off the screen until it is chosen again; the messages that replace it go
        where its items were (``_slot``)."""
        conv = self.state.conversation
        leaving = {id(e) for e in conv.entries[index_of(conv.entries, entry):]}
        items = self.window.items
        last = max((n for n, item in enumerate(items) if id(item.key) in leaving), default=-1)
        slot = items[last + 1] if 0 <= last < len(items) - 1 else None
        conv.rewind(entry)
        await self.sync_path()
        self._slot = slot

    async def sync_path(self, *, in_place: bool = False) -> None:
        """Show the conversation's path as it is now: the items of messages that left it go,
        those of messages that joined it come at the end (in order), or with ``in_place``
        where those that left were (a switch to another branch: the notices after them stay
        after the messages, as a "Loaded ..." under the reply it was about). The path is
        derived from the tree; this only follows it."""
        self._slot = None
        path = self.state.conversation.entries
        shown: list[Entry] = []
        for item in self.window.items:
            if item.tag in ("user", "reply") and isinstance(item.key, Entry) \
                    and (not shown or shown[-1] is not item.key):
                shown.append(item.key)
        keep = 0
        while keep < min(len(path), len(shown)) and path[keep] is shown[keep]:
            keep += 1
        leaving = [item for entry in shown[keep:] for item in self.window.items_of(entry)]
        left_views = {v.id for item in leaving for w in item.widgets or ()
                      for v in (w.views if isinstance(w, CompareView) else [w])
                      if isinstance(v, ReplyView)}
        after = None  # the first item after those that leave, when the new ones go there
        if in_place and leaving:
            last = max(self.window.items.index(item) for item in leaving)
            after = next(iter(self.window.items[last + 1:]), None)
        focused = self.focused
        if focused is not None and any(w is focused or w in focused.ancestors
                                       for item in leaving for w in item.widgets or ()):
            # the focus goes to the prompt, now (``focus()`` is deferred), not where Textual
            # sends it when the focused widget leaves: the reply above, whose last token the
            # inspector then showed and the view scrolled up to (a fan-out; seen in tmux)
            self.set_focus(self.prompt, scroll_visible=False)
        for item in leaving:
            await self.window.remove(item)
        for entry in path[keep:]:
            if entry.role == "user":
                item = self._user_item(entry)
            elif entry.replies:
                item = self._reply_item(entry)
            else:
                continue
            if after is None:
                self.window.add(item)
            else:
                self.window.add_before(item, after)
        if self.inspector.view_id and self.inspector.view_id in left_views:
            # the token shown belonged to a reply that left: the inspector showed it on
            # (after a branch switch or a fan-out's pick, "token 1 of 29" of a reply no
            # longer there)
            self.inspector.clear()
        if self.state.editing is not None \
                and not any(e is self.state.editing for e in path):
            self.end_edit()  # (its message left the path: /clear, /load, another branch)
        self.refresh_bindings()  # (F6 comes and goes with a comparison on the path)
        if in_place:  # another branch shown (‹ ›, /tree, a search hit, /delete): the meter
            await self._update_context()  # counts it (after /delete it kept the one deleted)

    # ---- the tree: siblings ----

    def _branch_point(self) -> Entry | None:
        """The message sibling keys move: the last one on the path with alternatives."""
        conv = self.state.conversation
        return next((e for e in reversed(conv.entries) if len(conv.siblings(e)) > 1), None)

    async def step_sibling(self, delta: int, entry: Entry | None = None) -> None:
        """Show the alternative ``delta`` places from ``entry`` (default: the last message
        with alternatives); the conversation below follows its branch."""
        if self.generating:
            self.notice("A reply is still being generated: press Esc to stop it first.",
                        "error")
            return
        entry = entry or self._branch_point()
        if entry is None:
            self.notice("No message here has alternatives (a retry, an edit or a "
                        "continuation from another token makes one).", "error")
            return
        conv = self.state.conversation
        if conv.step_sibling(entry, delta) is entry:
            return
        await self.sync_path(in_place=True)
        if not isinstance(self.focused, TokenView):
            self.prompt.focus()  # (a click on an arrow took the focus)
        self.services.save_conversation()

    async def open_node(self, node: str) -> None:
        """Go on with the message whose node id is ``node`` (the tree view's Enter), and show
        it."""
        conv = self.state.conversation
        entry = next((e for e in conv.all_entries() if e.node == node), None)
        if entry is None:
            return
        await self.stop_generation()
        conv.select(entry)
        await self.sync_path(in_place=True)
        self.services.save_conversation()
        self.show_entry(entry)

    def show_entry(self, entry: Entry) -> None:
        """Scroll the conversation to ``entry``'s message, its top at the top of the view (a
        search's hit, a branch opened from the tree view: in a long conversation the view
        stayed at its end, far from the message asked for); the log stops following its end.
        The window knows where a message is only by the heights of those above it (measured,
        or estimated where not drawn yet): once what was added last is placed, a first scroll
        goes where they say, which draws the message and what is around it, and once that
        page is drawn a second goes to where its widget is."""
        window = self.window
        items = window.items_of(entry)
        if not items:
            return
        item = items[0]

        def placed() -> None:
            if item.gone:
                return
            width = window.width()
            y = sum(i.height(width) for i in window.items[: window.items.index(item)])
            self.log_view.scroll_to(y=y, animate=False, immediate=True)
            window.when_idle(lambda: drawn(retry=True))

        def drawn(retry: bool) -> None:
            if item.gone:
                return
            if item.widgets is None:  # (estimated far off: drawn now, scrolled to next time)
                if retry:
                    window.draw(item)
                    window.when_idle(lambda: drawn(retry=False))
                return
            if item.widgets[0].is_attached:
                self.log_view.scroll_to_widget(item.widgets[0], top=True, animate=False,
                                               immediate=True)

        window.when_idle(placed)

    @on(SiblingBar.Step)
    async def _sibling_clicked(self, event: SiblingBar.Step) -> None:
        entry = next((e for e in self.state.conversation.entries if e.node == event.node),
                     None)
        if entry is not None:
            await self.step_sibling(event.delta, entry)

    def open_tree(self) -> None:
        from .tree import TreeScreen

        def opened(node: str | None) -> None:
            if node is not None:
                self.call_later(self.open_node, node)

        self.app.push_screen(TreeScreen(self.state.conversation),
                             reported_callback(self, "The tree view", opened))

    def _scrolled(self) -> None:
        # full collections wait while the user scrolls (a stream holds them anyway): each
        # page mounts the replies coming into reach, and the full pass their objects set off
        # landed inside a page's frame (60-180 ms: the only pages over 30 ms); the one that
        # is due runs once the window has drawn the page and what is around it (settled)
        if not gcpolicy.streaming():
            gcpolicy.scrolled()

    def on_unmount(self) -> None:
        gcpolicy.scroll_settled(collect=False)

    @on(PageConversation)
    def _page_conversation(self, event: PageConversation) -> None:
        # At once: Textual's own scroll_page_up scrolls after the next refresh, from where
        # the view is now, so keys that came faster than the screen drew (PageUp held in a
        # terminal) made one page between them; and not animated, as each frame of an
        # animation would move the window too.
        log_view = self.log_view
        page = log_view.scrollable_content_region.height
        target = log_view.scroll_y + (page if event.down else -page)
        log_view.scroll_to(y=max(0, min(log_view.max_scroll_y, target)), animate=False,
                           immediate=True)
        paint_scroll_now(self)  # the page now, not on the next frame (up to 17 ms later)

    # ---- sending ----

    @on(PromptSubmitted)
    async def _submitted(self, event: PromptSubmitted) -> None:
        text = event.text
        draft, self._restored_draft = self._restored_draft, None
        command = commands.command_after_draft(text, draft)
        if command is not None:  # a command typed onto the restored draft: the draft stays
            self.put_prompt(draft)  # (put first: /exit keeps the box's text for next time)
            self._restored_draft = draft
            self.notice(f"{command.split()[0]} ran on its own: the message you had not sent "
                        "is still in the box.")
            text = command
        self.carryover.sent(text)
        try:
            if commands.is_command(text):
                await self.run_command(text)
            else:
                await self.send(commands.unescape(text))
        finally:
            # the keys typed after Enter (held by the app) go to this screen's focus, or to a
            # screen the command opened once it has drawn itself (its on_mount has put its
            # focus and cursor where keys should act)
            release_keys(self, None)

    async def send(self, text: str) -> None:
        """Send a user message and stream the reply."""
        state = self.state
        if state.load_error:
            self.prompt.set_text(text)
            self.notice("No model is loaded, so nothing can be sent "
                        f"({state.load_error}). Restart chatui with another --ckpt.", "error")
            return
        if self.generating or state.waiting_for_model:
            self.prompt.set_text(text)
            self.app.notify("A reply is still being generated: press Esc to stop it first.",
                            severity="warning")
            return
        editing = state.editing
        if editing is not None:  # the new text goes beside the message edited
            self.end_edit()
            if any(e is editing for e in state.conversation.entries):
                await self.rewind(editing)  # it and its replies stay in the tree, a branch
        # full collections wait from the submit (drawing the message set off the one that
        # was due: 338 ms as the 200th reply was asked for); start_reply holds them on
        gcpolicy.stream_started()
        try:
            entry = state.conversation.add_user(text)
            self._mount_user(entry)
            self.log_view.anchor()
            if state.info is None:
                state.waiting_for_model = True
                self._waiting_notice = self._notice_item(
                    "The model is still loading; your message will be sent when it is ready.",
                    "info")
                self.window.append(self._waiting_notice)
                self.log_view.scroll_end(animate=False)
                return
            self.answer(text)
        finally:
            gcpolicy.stream_ended()

    def answer(self, prompt_text: str, again: Entry | None = None) -> None:
        """Answer the last user message: as a comparison when one is armed (or when
        ``again``, the reply being retried, was one), else as a single reply."""
        rows = self.compare.rows_for_answer(again)
        entry = self.state.conversation.add_assistant(list(rows or (self.state.settings,)))
        self.start_reply(entry, prompt_text=prompt_text)

    def start_reply(self, entry: Entry, *, prompt_text: str = "",
                    prefix: AssistantPrefix | None = None,
                    max_new_tokens: int | None = None,
                    first_tokens: tuple[int, ...] | None = None,
                    branch_of: Entry | None = None) -> None:
        """Generate (or continue, from ``prefix``) ``entry``'s replies, one per row, in a
        worker on the app's loop; ``max_new_tokens`` caps this request's new tokens (the
        replies keep their settings); ``branch_of``: see ``Job.branch_of``."""
        if self._moved_on(entry):
            return
        # full collections wait from here (a retry or continue; send holds them from the
        # submit) until _stream ends
        gcpolicy.stream_started()
        view = self._view_of(entry, draw=True)
        self._slot = None  # (the reply that replaces those rewound is placed)
        assert view is not None
        item = self._reply_item_of(entry)
        assert item is not None
        item.pinned += 1  # a streaming reply keeps its widgets wherever the user scrolls
        settings = tuple(r.settings if max_new_tokens is None
                         else replace(r.settings, max_new_tokens=max_new_tokens)
                         for r in entry.replies)
        request = GenerationRequest(
            messages=self.state.messages_before(entry),
            settings=settings,
            top_logprobs=self.state.top_logprobs, prefix=prefix, first_tokens=first_tokens,
            thinking=self.state.thinking)
        job = Job(entry, view, ReplyRecorder(entry.replies), prompt_text=prompt_text,
                  branch_of=branch_of)
        # a new reply is followed in the side panel (a comparison: its chosen column); one
        # continued from a token, or a fan-out, keeps the panel on that token (the cursor is
        # there)
        fresh = prefix is None and first_tokens is None
        self._live = (view.id or "") if fresh else ""
        self.state.job = job
        self.generating = True
        self.log_view.anchor()
        self.services.save_conversation()  # the user's message is kept if the reply never ends
        self.post_message(ResponseStarted(index_of(self.state.conversation.entries, entry)))
        self._gen_worker = run_reported(self, self._stream(job, request, item),
                                        what="The reply", group="generate")

    def _moved_on(self, entry: Entry) -> bool:
        """Whether ``entry`` can no longer start: a branch made from a token (an alternative,
        a fan-out) waits for its widgets before it starts, and keys pressed meanwhile can
        take the conversation elsewhere (Alt+Left, /tree) or start another reply. It then
        stays in the tree, stopped, and says so (it streamed off the path and the app
        stopped: found by random keys and clicks, tests/test_monkey.py)."""
        conv = self.state.conversation
        if self.state.job is None and any(e is entry for e in conv.entries):
            return False
        for reply in entry.replies:
            reply.finish_reason = reply.finish_reason or "cancelled"
        for shown in _reply_views(self._view_of(entry)):
            shown.refresh_stats()
        self.services.save_conversation()
        self.notice("The conversation moved on before the new branch could start: it is kept, "
                    "stopped, as an alternative (‹ ›, /tree), and /continue goes on with it "
                    "there.", "warning")
        return True

    async def _stream(self, job: Job, request: GenerationRequest, item: Item) -> None:
        """The one loop that applies engine events to replies (through the recorder) and
        shows the deltas. The GC policy (held by :meth:`start_reply`) is released, and
        ``item`` (the reply's) unpinned, when it ends."""
        recorder, view = job.recorder, job.view
        recorder.begin()
        say: Timer | None = None  # (the words "reading the prompt" are due)
        try:
            try:
                if isinstance(view, CompareView) and view.mounting is not None:
                    await view.mounting
                    view.mounting = None
                view.begin()
                job.stream = stream = self.services.worker.generate(request)
                reading = False
                saved_at = time.monotonic()
                async for events in stream:
                    for ev in events:
                        if isinstance(ev, PromptProgress):
                            say = self._stop_timer(say)
                            self.status.speed = ev.describe()
                            continue
                        delta = recorder.apply(ev)
                        if isinstance(delta, ContextReported):
                            self._context_reported(delta, job)
                            self._stop_timer(say)
                            say, reading = self._reading_prompt(delta.prompt_tokens), True
                        elif delta is not None:
                            if reading:
                                say, reading = self._stop_timer(say), False
                                self.status.speed = ""
                            await view.show(delta)
                            self._show_live(view)
                    if time.monotonic() - saved_at >= CHECKPOINT_S:
                        saved_at = time.monotonic()
                        self.services.save_conversation()  # (what streamed so far)
            except Exception as exc:  # noqa: BLE001 - shown in the reply, logged in full
                log.exception("generation failed")
                recorder.fail(describe_error(exc))
            finally:
                self._stop_timer(say)
                if recorder.finish() and job.stream is not None:
                    job.stream.cancel()
                self.state.job = None
                self.generating = False
            await view.end()
            self._show_live(view, final=True)
        finally:
            self._live = ""
            gcpolicy.stream_ended()
        try:
            await self._after(job)
        finally:
            item.pinned -= 1
            self.window.schedule()

    def _reading_prompt(self, tokens: int) -> Timer:
        """Say in the status bar that the engine reads the prompt, until the first token (a
        7.6k-token prompt took 19 s on a CPU with nothing but "generating…" on screen), once
        it has taken ``READING_SAID_AFTER_S``; the last reply's speed goes at once. A prompt
        longer than one prefill chunk then reports how far it has read, and at what rate
        (``PromptProgress``). Said at once, the words flashed for a frame on every reply to a
        cached prompt (its first token 7-10 ms later), and each change of the bar's width
        cost a layout of the whole screen (9-10 ms here; ``benchmarks/bench_tui.py``)."""
        self.status.speed = ""

        def say() -> None:
            self.status.speed = f"reading the prompt ({tokens:,} tokens)…"

        return self.set_timer(READING_SAID_AFTER_S, say)

    @staticmethod
    def _stop_timer(timer: Timer | None) -> None:
        """Stop ``timer`` (if any) and return None, for ``timer = _stop_timer(timer)``."""
        if timer is not None:
            timer.stop()
        return None

    def _context_reported(self, delta: ContextReported, job: Job) -> None:
        """Update the context meter; when the oldest turns were left out, say so above the
        reply or comparison they were left out of."""
        single = not job.entry.is_comparison
        text = self.meter.reported(delta, self.info.context_limit if self.info else 0,
                                   "reply" if single else "comparison")
        if text:
            reply_item = self._reply_item_of(job.entry)
            notice = self._notice_item(text, "warning", key=job.entry)
            if reply_item is not None:
                self.window.insert_before(notice, reply_item)
            if single:
                self.app.notify(text, title="Context full", severity="warning", timeout=8)

    async def _after(self, job: Job) -> None:
        entry, recorder = job.entry, job.recorder
        replies = entry.replies
        single = len(replies) == 1
        entries = self.state.conversation.entries
        index = entries.index(entry) if entry in entries else -1
        failed = recorder.failed_rows
        if failed and len(failed) == len(replies):
            error = replies[0].error
            if recorder.keep_unchanged():
                # a continuation with no room, say: the reply stays as it had ended
                self.notice(f"The reply is kept as it was. {error}", "error")
                for shown in _reply_views(job.view):
                    shown.refresh_stats()
            elif job.branch_of is not None and not recorder.produced and index >= 0:
                # a branch from a reply's tokens that got none of its own: nothing to keep
                conv = self.state.conversation
                conv.delete(entry)
                with suppress(ValueError):  # (unless it left the tree meanwhile)
                    conv.select(job.branch_of)
                await self.sync_path(in_place=True)
                self.notice(f"The new branch failed before its first token and is not kept: "
                            f"{error}", "error")
            else:
                if not recorder.produced and job.prompt_text and index >= 1:
                    # nothing came back: give the prompt back, as if it had not been sent
                    user = entries[index - 1]
                    await self.remove_entry(entry)
                    await self.remove_entry(user)
                    if not self.prompt.text:
                        self.prompt.set_text(job.prompt_text)
                what = "reply" if single else "comparison"
                self.notice(f"The {what} failed: {error}", "error")
            self.services.save_conversation()
            self.post_message(ResponseFailed(index, error))
        else:
            for i in failed:
                self.notice(f"Column {i + 1} failed: {replies[i].error}", "error")
            reasons = [r.finish_reason for r in replies]
            reason = (reasons[0] or "stop") if single else (
                "cancelled" if "cancelled" in reasons else "stop")
            self.services.save_conversation()
            self.post_message(ResponseComplete(index, reason))
        speed = speed_label(replies, stable=self.stable_timings)
        if speed is not None:
            self.status.speed = speed
        self._reshow_token()
        await self._update_context()

    def _reshow_token(self) -> None:
        """Show the inspector's token again, as its reply now is: a token selected while its
        reply streamed kept the count of then ("token 3 of 3" under a continuation from an
        alternative that went on to 227 tokens)."""
        found = self._find_view(self.inspector.view_id) if self.inspector.view_id else None
        if found is not None and found[1].token_view.cursor is not None:
            tv = found[1].token_view
            tv.post_message(TokenSelected(tv.owner_id, tv.cursor))

    async def _update_context(self) -> None:
        if self.info is not None and self.services.worker.dead is None:  # (a dead one is
            # restarted by the app and said once; a count would only fail again)
            await self.meter.follow(self.services.worker, self.info,
                                    self.state.conversation.messages())

    async def _follow_context(self) -> None:
        """The meter's timer: count the path again when it changed (the meter is derived from
        the path, whatever changed it); not while a reply streams (the engine reports its
        prompt's size then)."""
        if not self.generating:
            await self._update_context()

    async def stop_generation(self) -> None:
        """Cancel the reply in progress (if any) and wait until it has ended."""
        job = self.state.job
        if job is not None and job.stream is not None:
            job.stream.cancel()
        if self._gen_worker is not None:
            await self._gen_worker.wait()

    # ---- tokens ----

    def _show_live(self, view: object, final: bool = False) -> None:
        """While a new reply streams with the token view on, the side panel shows its newest
        token (probability, rank, alternatives) as it comes, at most every ``LIVE_S``, and
        its last one once it ends: it kept showing a token selected before, of another reply
        or a scored text (seen in tmux; a comparison's, its chosen column's: it kept a scored
        message's token while three columns streamed, seen in tmux). Selecting a token stops
        the following."""
        if not self._live or not self.token_mode or getattr(view, "id", None) != self._live:
            return
        if isinstance(view, CompareView):
            view = view.columns[view.chosen].view
        if not isinstance(view, ReplyView):
            return
        now = time.monotonic()
        if not final and now < self._live_at + LIVE_S:
            return
        self._live_at = now
        units = view.token_view.units
        if units:
            unit = units[-1]
            self.inspector.show(view.id, view.reply.tokens[unit.start:unit.end + 1],
                                len(units) - 1, len(units), position=unit.start)

    @on(TokenSelected)
    def _token_selected(self, event: TokenSelected) -> None:
        self._live = ""  # a token chosen: the panel stays on it
        found = self._find_view(event.view_id)
        if found is None:
            self._scored_token_selected(event)
            return
        view = found[1]
        units = view.token_view.units
        if not 0 <= event.unit < len(units):
            return
        unit = units[event.unit]
        tokens = view.reply.tokens[unit.start:unit.end + 1]
        self.inspector.show(event.view_id, tokens, event.unit, len(units), position=unit.start)
        if view.forks and any(unit.start <= p <= unit.end for p in view.forks):
            self.inspector.show_branches(self._branches_text(found[0], unit.start, unit.end))

    def _branches_text(self, entry: Entry, start: int, end: int) -> str:
        """The branches that leave ``entry``'s reply within tokens ``start``..``end``, side
        by side: ``branches here: ‹1/3› ' Hello' · ‹2/3› 'alt1'``."""
        conv = self.state.conversation
        n = len(conv.siblings(entry))
        parts = [f"‹{i + 1}/{n}› {text!r}"
                 for p, forks in sorted(fork_points(conv, entry).items()) if start <= p <= end
                 for i, text in forks]
        return "branches here: " + " · ".join(parts) if parts else ""

    def _type_into_prompt(self, text: str, submit: bool) -> None:
        """Text typed in a token view or the conversation (which take none) goes to the
        prompt."""
        self.prompt.focus()
        if text:
            self.prompt.insert(text)
        if submit:
            self.prompt.action_submit()

    @on(AlternativeChosen)
    async def _alternative_chosen(self, event: AlternativeChosen) -> None:
        await self.continue_from_alternative(event.view_id, event.token_index, event.alt_rank)

    async def _single_reply_at(self, view_id: str, position: int,
                               what: str) -> tuple[Entry, Reply] | None:
        """The entry and reply of the view ``view_id`` (a reply, or one column of a comparison
        or fan-out: the branch is then the group's sibling, and the group stays as it is) with
        a token at ``position`` (what continuing from an alternative and fan-out start from),
        after stopping any reply that streams; None otherwise."""
        found = self._find_view(view_id)
        if found is None:  # a scored message's token view (/score) has no reply to go on with
            self.notice(f"{what} works on the tokens of a reply, not of a scored message.",
                        "error")
            return None
        entry, view = found
        if self.generating:
            await self.stop_generation()
        # a column's own reply (they refused a comparison, even its column picked, with
        # advice to /pick one: seen in tmux)
        reply = view.reply
        if not 0 <= position < len(reply.tokens):
            return None
        return entry, reply

    async def continue_from_alternative(self, view_id: str, position: int, rank: int) -> None:
        """Regenerate a reply from token ``position`` with alternative ``rank`` (1-based)."""
        found = await self._single_reply_at(view_id, position, "Continuing from an alternative")
        if found is None:
            return
        entry, reply = found
        token = reply.tokens[position]
        if not 1 <= rank <= len(token.top):
            self.notice(f"This token has {len(token.top)} alternatives; there is no "
                        f"number {rank}.", "error")
            return
        # a sibling of the reply that shares its prefix (issue 18): the reply itself stays
        new = Reply(self.state.settings, tokens=reply.tokens.copy())
        prefix = branch(new, position, rank)
        source, entry = entry, self.state.conversation.add_sibling(
            entry, Entry("assistant", replies=[new]))
        reply = new
        # max_tokens bounds the whole reply: the kept tokens and the alternative count
        # (a continuation of 512 more made a 513-token reply for max_tokens 512)
        left = reply.settings.max_new_tokens - len(reply.tokens)
        await self.sync_path()
        view = self._view_of(entry, draw=True)
        assert isinstance(view, ReplyView)
        item = self._reply_item_of(entry)
        if item is not None and item.mounting is not None:
            await item.mounting
        if self.token_mode:  # the cursor stays on the token chosen, in the new branch
            self._focus_token(view, position)
        if left <= 0:
            reply.finish_reason = "length"
            view.refresh_stats()
            index = index_of(self.state.conversation.entries, entry)
            self.services.save_conversation()
            self.post_message(ResponseComplete(index, "length"))
            return
        self.start_reply(entry, prefix=prefix, max_new_tokens=left, branch_of=source)

    @on(FanOutRequested)
    async def _fan_out_requested(self, event: FanOutRequested) -> None:
        await self.fan_out(event.view_id, event.token_index, self.state.fan_k)

    async def fan_out(self, view_id: str, position: int, k: int) -> None:
        """Decode the ``k`` most likely tokens at ``position`` of a reply as ``k`` branches in
        one batch (issue 18): one prefill of the shared prefix, the cache expanded to k rows,
        row j starting with alternative j (the worker's ``first_tokens``, as ``chatui generate
        --fork-at`` does). They stream side by side as the columns of a new alternative to
        the reply (the compare view, each with its token view); /pick or F6 chooses the one
        to go on with, and the others become its siblings (:meth:`Conversation.split`)."""
        found = await self._single_reply_at(view_id, position, "Fan-out")
        if found is None:
            return
        entry, reply = found
        alternatives = reply.tokens[position].top[:k]
        if len(alternatives) < k:
            self.notice(f"This token has {len(alternatives)} alternatives, fewer than the "
                        f"{k} to fan out (/fanout K sets how many).", "error")
            return
        ids = tuple(a.id for a in alternatives)
        if any(i is None for i in ids):
            self.notice("Fan-out needs token ids, which this backend does not give; the "
                        "digit keys continue from one alternative.", "error")
            return
        left = self.state.settings.max_new_tokens - position
        if left <= 0:
            self.notice("The reply is already as long as max_tokens allows there; "
                        "/set max_tokens N first.", "error")
            return
        shared = Reply(self.state.settings, tokens=reply.tokens.copy())
        shared.tokens.truncate(position)
        shared.text = shared.tokens.text()
        prefix = prefix_of(shared, witnesses=reply.tokens)  # (the alternatives fanned out too)
        rows = [Reply(self.state.settings, text=shared.text, tokens=shared.tokens.copy())
                for _ in range(k)]
        group = self.state.conversation.add_sibling(
            entry, Entry("assistant", replies=rows, fan_out=True))
        await self.sync_path()
        self.start_reply(group, prefix=prefix, max_new_tokens=left, branch_of=entry,
                         first_tokens=ids)  # type: ignore[arg-type]
        self.prompt.focus()  # where /pick N (or F6) is typed

    async def _split_fan_out(self, group: Entry) -> None:
        """/pick on a fan-out: go on with the branch picked, the others its siblings."""
        conv = self.state.conversation
        column = group.chosen
        entry = conv.split(group)
        await self.sync_path()
        self.app.notify(f"Continuing with branch {column + 1}; the others are its "
                        "alternatives (‹ ›).", timeout=3)
        self.prompt.focus()
        self.services.save_conversation()
        self.post_message(ReplyChosen(index_of(conv.entries, entry)))

    def _focus_token(self, view: ReplyView, position: int) -> None:
        """Focus ``view``'s token view with its cursor on the token at ``position``."""
        tv = view.token_view
        tv.focus()
        at = next((i for i, u in enumerate(tv.units) if u.start <= position <= u.end), None)
        if at is not None:
            tv.cursor = at

    # ---- compare mode (the flow's host) ----

    def config_dir(self) -> Path:
        return self.services.config.resolved_config_dir()

    def open_compare_screen(self, columns: Sequence[str], base: SamplingParams,
                            done: Callable[[tuple[tuple[str, ...], str] | None], None]) -> None:
        from .compare import CompareScreen

        self.app.push_screen(CompareScreen(self.config_dir(), columns=columns, base=base),
                             reported_callback(self, "The compare screen", done))

    def chosen_changed(self, entry: Entry) -> None:
        if entry.fan_out:  # a fan-out's branches become siblings (after a reload too)
            entry.fan_out = False
            self.call_later(self._split_fan_out, entry)
            return
        view = self._view_of(entry)
        if isinstance(view, CompareView):
            view.refresh_chosen()
        self.app.notify(f"Continuing with column {entry.chosen + 1}.", timeout=3)
        self.prompt.focus()
        self.services.save_conversation()
        self.post_message(ReplyChosen(index_of(self.state.conversation.entries, entry)))

    def on_compare_view_picked(self, event: CompareView.Picked) -> None:
        self.compare.pick_column(event.view.entry, event.column)

    async def action_pick_next(self) -> None:
        self.compare.pick_next()

    # ---- view switches ----

    def watch_token_mode(self, on: bool) -> None:
        for view in self._reply_views():
            view.token_mode = on
        self.inspector.display = on
        if on:
            target, self._token_focus = self._token_focus, None
            if target is not None:  # (/score's message, focused where it is)
                target.focus(scroll_visible=False)
                return
            self._focus_last_token_view()
        else:
            self.prompt.focus()

    def _focus_last_token_view(self, *, far: bool = True) -> None:
        """The token cursor in the last reply (the column chosen, for a comparison). In a long
        conversation scrolled far up the reply had no widgets: the ones drawn for it were
        focused before they were mounted, the focus went nowhere, the box kept it and the
        arrows moved nothing (seen in tmux). The log goes to its end first (the last reply is
        there), and once that page is drawn the reply's view is focused."""
        last = self.state.conversation.last_assistant
        if last is None:
            return
        item = self._reply_item_of(last)
        if far and (item is None or item.widgets is None):
            self.log_view.scroll_end(animate=False, immediate=True)
            self.log_view.anchor()
            self.call_after_refresh(self.window.when_idle,
                                    lambda: self._focus_last_token_view(far=False))
            return
        view = self._view_of(last, draw=True)
        if isinstance(view, CompareView):  # the column chosen
            view = view.views[min(last.chosen, len(view.views) - 1)]
        if view is not None:
            view.token_view.focus()

    def watch_raw(self, on: bool) -> None:
        for view in self._reply_views():
            view.raw = on

    def watch_generating(self, on: bool) -> None:
        # on the prompt, not the screen: a class on the screen restyles every widget of the
        # conversation twice per reply (issue 21)
        prompt = self.prompt
        prompt.set_class(on, "-generating")
        # a steady cursor while a reply streams (no repaint twice a second), then as it was
        if on:
            self._blink, prompt.cursor_blink = prompt.cursor_blink, False
        else:
            prompt.cursor_blink = self._blink
        self.refresh_bindings()

    # ---- the command context (see chatui.chat_commands.CommandContext) ----

    def _argument_candidates(self) -> dict[str, list[str]]:
        return {
            "theme": self.theme_names(),
            "set": ["temperature ", "top_p ", "top_k ", "min_p ", "repetition_penalty ",
                    "seed ", "max_tokens ", "stop ", "reasoning_budget "],
            "think": ["on", "off"],
            "copy": ["code"],
            "export": ["md ", "messages "],
            "history": ["delete "],
            "compare": ["off", *self.compare.preset_names()],
            "pick": [str(n) for n in range(1, 7)],
        }

    async def run_command(self, text: str) -> None:
        """Run a slash command; a bad one is reported in the conversation, never raised."""
        try:
            cmd = commands.parse(text)
        except commands.CommandError as exc:
            self.notice(str(exc), "error")
            return
        try:
            await cmd.spec.handler(self, cmd.arg)
        except Exception as exc:  # noqa: BLE001 - one failed command must not end the chat
            log.exception("command /%s failed", cmd.name)
            self.notice(f"/{cmd.name} failed: {describe_error(exc)}", "error")

    def open_help(self) -> None:
        from .help import HelpScreen

        self.app.push_screen(HelpScreen())

    def open_history(self, query: str = "") -> None:
        from .history import HistoryScreen

        def opened(choice: tuple[Path, str] | None) -> None:
            if choice is not None:
                self.call_later(self._open_found, *choice)

        self.app.push_screen(HistoryScreen(self.services.config.transcripts_dir(), query),
                             reported_callback(self, "Opening a conversation", opened))

    async def _open_found(self, path: Path, text: str) -> None:
        """Open a search's hit on the branch that holds the words searched for (the one its
        file shows may be another: a retry's, an edit's)."""
        from ..transcript import autosave_path
        from ..transcript.search import best_entry

        conv = self.state.conversation
        if not (conv.entries and same_file(
                autosave_path(conv, self.services.config.transcripts_dir()), path)):
            # (the open conversation is not loaded again: what is on screen may be newer than
            # its file, and a reload threw away its scroll and notices)
            await self.run_command(f"/load {path}")
            if self.state.conversation is conv:
                return  # (refused, or failed: it said why)
            conv = self.state.conversation
        entry = best_entry(conv, text)
        if entry is None:
            return
        if not any(e is entry for e in conv.entries):
            conv.select(entry)
            await self.sync_path(in_place=True)
            self.services.save_conversation()
            self.notice(f"Showing the branch that holds {text.strip()!r} (‹ › or /tree for "
                        "the others).")
        self.show_entry(entry)

    async def quit(self) -> None:
        await self.app.action_quit()

    def settings_changed(self) -> None:
        self.status.settings = status_label(self.state)

    def begin_edit(self, entry: Entry) -> None:
        """``/edit``: ``entry``'s text in the box; sending it adds the new text beside
        ``entry`` (a branch), Esc or Ctrl+L (the box's clear key) leaves the conversation as it
        is; the text deleted by typing, to be written anew, is still the edit."""
        self.state.editing = entry
        self.put_prompt(entry.text)
        self._show_editing()

    def end_edit(self) -> None:
        self.state.editing = None
        self._show_editing()

    def _show_editing(self) -> None:
        editing, conv = self.state.editing, self.state.conversation
        at = next((n for n, e in enumerate(conv.entries) if e is editing), None)
        which = "your last message" if at is None or editing is conv.last_user else \
            f"your message {at + 1}"  # (/edit N)
        self.prompt.border_title = (
            f"editing {which}: Enter sends it as a new branch beside it, "
            "Esc leaves it as it was" if editing is not None else None)
        self.refresh_bindings()  # (Esc's footer label: "Cancel edit" while editing)

    @on(PromptCleared)
    def _prompt_cleared(self) -> None:
        if self.state.editing is not None:
            self.end_edit()

    def put_prompt(self, text: str) -> None:
        """Put ``text`` in the box (``/edit``, the palette); a draft already there is kept in
        the prompt history (Up brings it back): it was replaced and lost."""
        self.prompt.keep_draft()
        self.prompt.set_text(text)
        self.prompt.focus()

    def toggle_token_mode(self) -> None:
        self.token_mode = not self.token_mode

    def toggle_raw(self) -> bool:
        self.raw = not self.raw
        return self.raw

    def toggle_reasoning(self) -> bool | None:
        """Fold or unfold the last reply's reasoning (None: it has none)."""
        last = self.state.conversation.last_assistant
        view = self._view_of(last, draw=True) if last is not None else None
        if isinstance(view, CompareView):
            view = view.views[last.chosen] if last is not None else None
        if view is None or not view.reasoning_block.has_reasoning:
            return None
        block = view.reasoning_block
        block.toggle()
        self.call_after_refresh(block.scroll_visible, animate=False)
        return block.is_open

    def theme_names(self) -> list[str]:
        return sorted(self.app.available_themes)

    def current_theme(self) -> str:
        return self.app.theme

    def set_theme(self, name: str) -> None:
        self.app.theme = name

    def copy_to_clipboard(self, text: str) -> None:
        self.app.copy_to_clipboard(text)

    # ---- key actions ----

    async def action_stop(self) -> None:
        job = self.state.job
        if self.generating and job is not None and job.stream is not None:
            job.stream.cancel()

    def action_to_prompt(self) -> None:
        """Esc in the token view with nothing streaming: the cursor back in the message box
        (the footer said "Stop" for it; the token view stays on, Ctrl+T turns it off)."""
        self.prompt.focus()

    def action_cancel_edit(self) -> None:
        """Esc while editing: the edit abandoned, the box emptied (Ctrl+Z brings it back)."""
        self.end_edit()
        self.prompt.action_clear_all()

    async def action_command(self, text: str) -> None:
        """A key bound to a slash command runs it."""
        await self.run_command(text)

    def action_command_in_order(self, text: str) -> None:
        """A key bound to a command that puts text in the box (Ctrl+G): a priority binding,
        run as its key arrives, queues the command in the box's own queue, between the keys
        typed before it and those typed after (as a plain binding it ran once its key had
        bubbled up, after the keys behind it: those went into the box first and were put
        aside as a draft; see ``PromptInput.action_submit``)."""
        self.prompt.call_later(self.run_command, text)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "cancel_edit":  # (Esc's first binding, in the footer while editing)
            return self.state.editing is not None and not self.generating \
                and self.focused is self.prompt
        in_tokens = isinstance(self.focused, TokenView)
        if action == "stop":  # (greyed while idle; in the token view Esc is "To prompt")
            return True if self.generating else (False if in_tokens else None)
        if action == "to_prompt":
            return not self.generating and in_tokens
        if action == "command" and parameters == ("/raw",):
            return in_tokens or None
        if action == "pick_next":
            return self.can_pick  # hidden unless the last reply is a comparison
        return True

    # ---- completion hint ----

    @on(TextArea.Changed, "#prompt")
    def _prompt_changed(self, event: TextArea.Changed) -> None:
        text = event.text_area.text
        hint = self.query_one("#hint", Static)
        if not text.startswith("/") or "\n" in text:
            hint.display = False
            return
        hint.update(Content(commands.hint_text(text)))
        hint.display = True


def _reply_views(view: object) -> list[ReplyView]:
    """The reply widgets a job's or an entry's view holds (a comparison's columns)."""
    if isinstance(view, CompareView):
        return list(view.views)
    return [view] if isinstance(view, ReplyView) else []
