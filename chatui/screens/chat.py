"""The chat screen: the conversation, the prompt box, the token inspector and the status bar.

Data flows one way: the prompt posts :class:`PromptSubmitted`; the screen updates the
conversation, sends a request to the inference worker and feeds the streamed tokens to the
reply's view. Slash commands map to ``cmd_<name>`` methods; key bindings and the command
palette call the same methods.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static, TextArea
from textual.worker import Worker

from inference.settings import SamplingParams, SettingsError, parse_assignments
from inference.types import (
    AssistantPrefix,
    Failed,
    GenerationRequest,
    Message,
    ModelInfo,
    RowDone,
    Started,
    Token,
    TokenBatch,
)
from inference.worker import GenerationStream, describe_error

from .. import commands, gcpolicy
from ..conversation import Conversation, Entry, Reply
from ..messages import (
    AlternativeChosen,
    PromptSubmitted,
    ResponseComplete,
    ResponseFailed,
    ResponseStarted,
    TokenSelected,
)
from ..widgets.inspector import TokenInspector
from ..widgets.items import Notice, UserMessage
from ..widgets.prompt import PromptInput
from ..widgets.reply import ReplyView
from ..widgets.settled import ConversationLog
from ..widgets.status import CONTEXT_WARN, LoadingPanel, StatusBar
from ..widgets.text import code_blocks, shorten
from ..widgets.token_view import TokenView
from .compare_flow import CompareFlow, pick_bindings

if TYPE_CHECKING:
    from ..app import ChatApp

log = logging.getLogger(__name__)


def settings_label(s: SamplingParams) -> str:
    """The settings in force, short: the main four, then anything else that is not default."""
    parts = [f"temp {s.temperature:g}", f"top_p {s.top_p:g}", f"top_k {s.top_k}",
             f"max {s.max_new_tokens}"]
    base = SamplingParams()
    for name in ("min_p", "repetition_penalty", "seed", "stop"):
        value = getattr(s, name)
        if value != getattr(base, name):
            value = ",".join(value) if name == "stop" else value
            parts.append(f"{name} {value}")
    return " · ".join(parts)


@dataclass
class _Job:
    """One reply being generated."""

    entry: Entry
    view: ReplyView
    base_tokens: int
    """Tokens the reply already had (``/continue``, continue-from-alternative)."""
    base_text: str
    prompt_text: str = ""
    """The prompt to give back to the box if the reply fails before its first token."""
    stream: GenerationStream | None = None


class ChatScreen(CompareFlow, Screen[None]):
    """The main screen. The app hands it the worker and the config (attributes down).

    Compare mode (``/compare``, ``/pick``) lives in :class:`CompareFlow`."""

    BINDINGS = [
        Binding("escape", "stop", "Stop", id="chat.stop", tooltip="Stop the reply (keeps it)"),
        Binding("ctrl+t", "logprobs", "Tokens", id="chat.tokens",
                tooltip="Token view: probabilities per token"),
        Binding("ctrl+r", "retry", "Retry", id="chat.retry", tooltip="Regenerate the last reply"),
        Binding("ctrl+g", "edit", "Edit", id="chat.edit", tooltip="Edit the last prompt"),
        Binding("ctrl+o", "continue", "Continue", id="chat.continue",
                tooltip="Continue a stopped or cut-off reply"),
        Binding("f2", "copy_reply", "Copy", id="chat.copy", tooltip="Copy the last reply"),
        Binding("f3", "copy_code", "Copy code", id="chat.copy_code", show=False,
                tooltip="Copy the last code block"),
        Binding("r", "raw", "Raw", id="chat.raw", show=False,
                tooltip="Raw token view (special tokens)"),
        Binding("ctrl+s", "save", "Save", id="chat.save", show=False,
                tooltip="Save the conversation now"),
        Binding("f1", "help", "Help", id="chat.help", tooltip="Commands and keys"),
        *pick_bindings(),
    ]

    generating: reactive[bool] = reactive(False)
    _blink = True
    """Whether the prompt's cursor blinks when no reply streams."""
    token_mode: reactive[bool] = reactive(False, init=False)
    raw: reactive[bool] = reactive(False, init=False)

    def __init__(self, *, settings: SamplingParams | None = None,
                 overrides: Mapping[str, Any] | None = None, top_logprobs: int = 5,
                 system_prompt: str = "", token_mode: bool = False,
                 stable_timings: bool = False) -> None:
        super().__init__()
        self.conversation = Conversation(system_prompt=system_prompt)
        self._overrides = dict(overrides or {})
        self.settings = self._with_overrides(settings or SamplingParams())
        self._settings_from_user = settings is not None
        self.top_logprobs = top_logprobs
        self.stable_timings = stable_timings
        self.info: ModelInfo | None = None
        self.load_error = ""
        self._job: _Job | None = None
        self._gen_worker: Worker | None = None
        self._views: dict[str, tuple[Entry, ReplyView]] = {}
        self._widgets_of: dict[int, list] = {}
        self._counter = 0
        self._waiting_for_model = False
        self._warned_context = False
        self.set_reactive(ChatScreen.token_mode, token_mode)

    def _with_overrides(self, base: SamplingParams) -> SamplingParams:
        try:
            return base.with_values(**self._overrides) if self._overrides else base
        except SettingsError as exc:
            log.warning("ignoring settings overrides: %s", exc)
            return base

    @property
    def chat_app(self) -> ChatApp:
        return self.app  # type: ignore[return-value]

    # ---- typed accessors ----

    @property
    def prompt(self) -> PromptInput:
        return self.query_one("#prompt", PromptInput)

    @property
    def log_view(self) -> VerticalScroll:
        return self.query_one("#conversation", VerticalScroll)

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
        yield Footer()

    def on_mount(self) -> None:
        self.log_view.anchor()
        self.inspector.display = self.token_mode
        self.query_one("#hint").display = False
        self.status.settings = settings_label(self.settings)
        self.prompt.focus()

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
        self.info = info
        if not self._settings_from_user:
            self.settings = self._with_overrides(info.default_settings)
        weights = f" · {info.quantization}" if info.quantization not in ("", "none") else ""
        self.status.model = f"{info.name} · {info.device} · {info.dtype}{weights}"
        self.status.context_limit = info.context_limit
        self.status.settings = settings_label(self.settings)
        self._loading_done()
        if info.chat_template_warning:
            self.notice(info.chat_template_warning, "warning")
        if self._waiting_for_model:
            self._waiting_for_model = False
            self._answer("")

    def model_failed(self, message: str) -> None:
        """The model could not be loaded: say so; commands keep working."""
        self.load_error = message
        self.status.model = "no model"
        self._loading_done()
        self._waiting_for_model = False
        self.notice(f"The model could not be loaded: {message}", "error")
        self.app.notify(message, title="Loading failed", severity="error", timeout=10)

    async def show_conversation(self, conversation: Conversation) -> None:
        """Replace the conversation (``/load``) and draw all of it."""
        await self.stop_generation()
        self.conversation = conversation
        self._views.clear()
        self._widgets_of.clear()
        await self.log_view.remove_children()
        gcpolicy.release()  # the old conversation's widgets are garbage now
        self.inspector.clear()
        for entry in conversation.entries:
            if entry.role == "user":
                self._mount_user(entry)
            elif entry.is_comparison:
                self._mount_compare(entry)
            elif entry.reply is not None:
                self._mount_reply(entry, entry.reply)
        if self.info is not None:
            await self.chat_app.worker.reset()
            await self._update_context()
        self.log_view.scroll_end(animate=False)
        self.log_view.anchor()

    # ---- conversation items ----

    def notice(self, text: str, kind: str = "info") -> Notice:
        """Add a notice to the conversation (info, warning or error)."""
        widget = Notice(text, kind=kind)
        self.log_view.mount(widget)
        self.log_view.scroll_end(animate=False)
        return widget

    def _next_id(self, kind: str) -> str:
        self._counter += 1
        return f"{kind}-{self._counter}"

    def _new_reply_entry(self) -> Entry:
        return self.conversation.add_assistant([self.settings])

    def _mount_user(self, entry: Entry) -> None:
        widget = UserMessage(entry.text, id=self._next_id("user"))
        self._widgets_of.setdefault(id(entry), []).append(widget)
        self.log_view.mount(widget)

    def _mount_reply(self, entry: Entry, reply: Reply) -> ReplyView:
        view = ReplyView(reply, stable_timings=self.stable_timings, token_mode=self.token_mode,
                         id=self._next_id("reply"))
        view.raw = self.raw
        view.type_into = self._type_into_prompt
        self._views[view.id or ""] = (entry, view)
        self._widgets_of.setdefault(id(entry), []).append(view)
        self.log_view.mount(view)
        return view

    def _view_of(self, entry: Entry) -> ReplyView | None:
        for widget in self._widgets_of.get(id(entry), []):
            if isinstance(widget, ReplyView):
                return widget
        return None

    async def _remove_entry(self, entry: Entry) -> None:
        self.conversation.entries.remove(entry)
        for widget in self._widgets_of.pop(id(entry), []):
            self._views.pop(widget.id or "", None)
            await widget.remove()

    # ---- sending ----

    @on(PromptSubmitted)
    async def _submitted(self, event: PromptSubmitted) -> None:
        text = event.text
        if commands.is_command(text):
            await self.run_command(text)
            return
        await self.send(commands.unescape(text))

    async def send(self, text: str) -> None:
        """Send a user message and stream the reply."""
        if self.load_error:
            self.prompt.set_text(text)
            self.notice("No model is loaded, so nothing can be sent "
                        f"({self.load_error}). Restart chatui with another --ckpt.", "error")
            return
        if self.generating or self._waiting_for_model:
            self.prompt.set_text(text)
            self.app.notify("A reply is still being generated: press Esc to stop it first.",
                            severity="warning")
            return
        entry = self.conversation.add_user(text)
        self._mount_user(entry)
        self.log_view.anchor()
        if self.info is None:
            self._waiting_for_model = True
            self.notice("The model is still loading; your message will be sent when it is "
                        "ready.")
            return
        self._answer(text)

    def _messages_before(self, entry: Entry) -> tuple[Message, ...]:
        out: list[Message] = []
        if self.conversation.system_prompt:
            out.append(Message("system", self.conversation.system_prompt))
        for e in self.conversation.entries:
            if e is entry:
                break
            out.append(Message(e.role, e.content))
        return tuple(out)

    def _start_reply(self, entry: Entry, *, prompt_text: str = "",
                     prefix: AssistantPrefix | None = None) -> None:
        """Generate (or continue) ``entry``'s reply in a worker on the app's loop."""
        reply = entry.reply
        assert reply is not None
        view = self._view_of(entry) or self._mount_reply(entry, reply)
        request = GenerationRequest(
            messages=self._messages_before(entry), settings=(reply.settings,),
            top_logprobs=self.top_logprobs, prefix=prefix)
        job = _Job(entry, view, base_tokens=len(reply.tokens), base_text=reply.text,
                   prompt_text=prompt_text)
        self._job = job
        self.generating = True
        self.log_view.anchor()
        self.post_message(ResponseStarted(self.conversation.entries.index(entry)))
        self._gen_worker = self.run_worker(self._generate(job, request), group="generate",
                                           exit_on_error=False)

    async def _generate(self, job: _Job, request: GenerationRequest) -> None:
        reply = job.entry.reply
        assert reply is not None
        reply.finish_reason = None
        reply.usage = None
        reply.error = ""
        view = job.view
        view.begin()
        offset = job.base_tokens
        try:
            job.stream = stream = self.chat_app.worker.generate(request)
            async for events in stream:
                for ev in events:
                    if isinstance(ev, TokenBatch):
                        if ev.row != 0:
                            continue
                        tokens = _reindex(ev.tokens, offset)
                        reply.tokens.extend(tokens)
                        reply.text += "".join(t.text for t in tokens if not t.special)
                        await view.add_tokens(tokens)
                    elif isinstance(ev, Started):
                        self._on_started(ev, job)
                    elif isinstance(ev, RowDone):
                        reply.finish_reason = ev.finish_reason
                        reply.usage = ev.usage
                        if ev.text and ev.text != reply.text[len(job.base_text):]:
                            reply.text = (ev.text if job.base_text and
                                          ev.text.startswith(job.base_text)
                                          else job.base_text + ev.text)
                    elif isinstance(ev, Failed):
                        reply.finish_reason = "error"
                        reply.error = ev.message
        except Exception as exc:  # noqa: BLE001 - shown in the reply, logged in full
            log.exception("generation failed")
            reply.finish_reason = "error"
            reply.error = describe_error(exc)
        finally:
            if job.stream is not None and reply.finish_reason is None:
                job.stream.cancel()
                reply.finish_reason = "cancelled"
            job.entry.text = reply.text
            self._job = None
            self.generating = False
        await view.end()
        await self._after_reply(job)

    def _on_started(self, ev: Started, job: _Job) -> None:
        self._show_context(ev, job.view, job.entry, "reply", notify=True)

    def _show_context(self, ev: Started, before: Widget, entry: Entry, what: str, *,
                      notify: bool) -> None:
        """Update the context meter; when the oldest turns were left out, say so above
        ``before`` (the reply or comparison they were left out of)."""
        limit = ev.context_limit or (self.info.context_limit if self.info else 0)
        self.status.context_limit = limit
        self.status.context_used = ev.prompt_tokens
        if ev.dropped_messages > 0:
            text = (f"The conversation no longer fits the model's context ({limit} tokens): "
                    f"the oldest {ev.dropped_messages} message(s) were left out of this {what}. "
                    "Use /clear to start afresh.")
            notice = Notice(text, kind="warning")
            self.log_view.mount(notice, before=before)
            self._widgets_of.setdefault(id(entry), []).append(notice)
            if notify:
                self.app.notify(text, title="Context full", severity="warning", timeout=8)

    async def _after_reply(self, job: _Job) -> None:
        reply = job.entry.reply
        assert reply is not None
        index = (self.conversation.entries.index(job.entry)
                 if job.entry in self.conversation.entries else -1)
        if reply.finish_reason == "error":
            if not reply.tokens[job.base_tokens:] and job.prompt_text and index >= 1:
                # nothing came back: give the prompt back, as if it had not been sent
                user = self.conversation.entries[index - 1]
                await self._remove_entry(job.entry)
                await self._remove_entry(user)
                if not self.prompt.text:
                    self.prompt.set_text(job.prompt_text)
            self.notice(f"The reply failed: {reply.error}", "error")
            self.post_message(ResponseFailed(index, reply.error))
        else:
            self.post_message(ResponseComplete(index, reply.finish_reason or "stop"))
        if reply.usage is not None and not self.stable_timings:
            self.status.speed = f"{reply.usage.decode_tokens_per_s:.1f} tok/s"
        elif self.stable_timings and reply.usage is not None:
            self.status.speed = "– tok/s"
        await self._update_context()

    async def _update_context(self) -> None:
        """Recount the conversation's tokens for the meter; warn once when it gets full."""
        if self.info is None:
            return
        try:
            used = await self.chat_app.worker.count_tokens(self.conversation.messages())
        except Exception as exc:  # noqa: BLE001 - the meter is a hint, never fatal
            log.warning("count_tokens failed: %s", exc)
            return
        self.status.context_used = used
        share = self.status.context_share
        if share >= CONTEXT_WARN and not self._warned_context:
            self._warned_context = True
            self.app.notify(f"The context is {share:.0%} full; the oldest turns will be left "
                            "out soon. /clear starts afresh.", title="Context", severity="warning")
        elif share < CONTEXT_WARN:
            self._warned_context = False

    async def stop_generation(self) -> None:
        """Cancel the reply in progress (if any) and wait until it has ended."""
        job = self._job
        if job is not None and job.stream is not None:
            job.stream.cancel()
        if self._gen_worker is not None:
            await self._gen_worker.wait()

    # ---- tokens ----

    @on(TokenSelected)
    def _token_selected(self, event: TokenSelected) -> None:
        found = self._views.get(event.view_id)
        if found is None:
            return
        view = found[1]
        units = view.token_view.units
        if not 0 <= event.unit < len(units):
            return
        unit = units[event.unit]
        tokens = view.reply.tokens[unit.start:unit.end + 1]
        self.inspector.show(event.view_id, tokens, event.unit, len(units))
        self.inspector._position = unit.start

    def _type_into_prompt(self, text: str, submit: bool) -> None:
        """Text typed in a token view (which takes none) goes to the prompt."""
        self.prompt.focus()
        if text:
            self.prompt.insert(text)
        if submit:
            self.prompt.action_submit()

    @on(AlternativeChosen)
    async def _alternative_chosen(self, event: AlternativeChosen) -> None:
        await self.continue_from_alternative(event.view_id, event.token_index, event.alt_rank)

    async def continue_from_alternative(self, view_id: str, position: int, rank: int) -> None:
        """Regenerate a reply from token ``position`` with alternative ``rank`` (1-based)."""
        found = self._views.get(view_id)
        if found is None:
            return
        entry, view = found
        if entry is not self.conversation.last_assistant:
            self.notice("Continuing from an alternative works on the last reply only.", "error")
            return
        if entry.is_comparison:
            self.notice("Continuing from an alternative works on a single reply, not on a "
                        "comparison; /pick a column and go on from there.", "error")
            return
        if self.generating:
            await self.stop_generation()
        reply = entry.reply
        assert reply is not None
        if not 0 <= position < len(reply.tokens):
            return
        token = reply.tokens[position]
        if not 1 <= rank <= len(token.top):
            self.notice(f"This token has {len(token.top)} alternatives; there is no "
                        f"number {rank}.", "error")
            return
        alt = token.top[rank - 1]
        chosen = Token(index=position, id=alt.id, text=alt.text, logprob=alt.logprob,
                       entropy=token.entropy, top=token.top)
        kept = reply.tokens[:position] + [chosen]
        text = "".join(t.text for t in kept if not t.special)
        ids = tuple(t.id for t in kept)
        prefix = AssistantPrefix(text, None if any(i is None for i in ids) else ids)  # type: ignore[arg-type]
        reply.tokens[:] = kept
        reply.text = text
        reply.finish_reason = None
        reply.usage = None
        reply.settings = self.settings
        await view.rebuild()
        self._start_reply(entry, prefix=prefix)

    # ---- view switches ----

    def watch_token_mode(self, on: bool) -> None:
        for _, view in self._views.values():
            view.token_mode = on
        self.inspector.display = on
        if on:
            last = self.conversation.last_assistant
            view = self._view_of(last) if last else None
            if view is not None:
                view.token_view.focus()
        else:
            self.prompt.focus()

    def watch_raw(self, on: bool) -> None:
        for _, view in self._views.values():
            view.raw = on

    def watch_generating(self, on: bool) -> None:
        self.set_class(on, "-generating")
        # a steady cursor while a reply streams (no repaint twice a second), then as it was
        prompt = self.prompt
        if on:
            self._blink, prompt.cursor_blink = prompt.cursor_blink, False
        else:
            prompt.cursor_blink = self._blink
        self.refresh_bindings()

    # ---- commands ----

    def _argument_candidates(self) -> dict[str, list[str]]:
        return {
            "theme": sorted(self.app.available_themes),
            "set": ["temperature ", "top_p ", "top_k ", "min_p ", "repetition_penalty ",
                    "seed ", "max_tokens "],
            "copy": ["code"],
            "compare": ["off", *self._preset_names()],
            "pick": [str(n) for n in range(1, 7)],
        }

    async def run_command(self, text: str) -> None:
        """Run a slash command; a bad one is reported in the conversation, never raised."""
        try:
            cmd = commands.parse(text)
        except commands.CommandError as exc:
            self.notice(str(exc), "error")
            return
        handler: Callable | None = getattr(self, f"cmd_{cmd.name}", None)
        if handler is None:
            handler = getattr(self.app, f"cmd_{cmd.name}", None)
        if handler is None:
            self.notice(f"/{cmd.name} is not available in this version.", "error")
            return
        try:
            await handler(cmd.arg)
        except Exception as exc:  # noqa: BLE001 - one failed command must not end the chat
            log.exception("command /%s failed", cmd.name)
            self.notice(f"/{cmd.name} failed: {describe_error(exc)}", "error")

    async def cmd_help(self, arg: str = "") -> None:
        from .help import HelpScreen

        self.app.push_screen(HelpScreen())

    async def cmd_exit(self, arg: str = "") -> None:
        await self.app.action_quit()

    async def cmd_clear(self, arg: str = "") -> None:
        await self.stop_generation()
        system = self.conversation.system_prompt
        self.conversation = Conversation(system_prompt=system)
        self._views.clear()
        self._widgets_of.clear()
        await self.log_view.remove_children()
        gcpolicy.release()  # the old conversation's widgets are garbage now
        self.inspector.clear()
        self.status.context_used = 0
        self.status.speed = ""
        if self.info is not None:
            await self.chat_app.worker.reset()
        self.notice("Conversation cleared.")

    async def cmd_system(self, arg: str = "") -> None:
        if not arg:
            current = self.conversation.system_prompt or "(none)"
            self.notice(f"System prompt: {current}")
            return
        self.conversation.system_prompt = arg
        self.notice(f"System prompt set: {shorten(arg, 200)}")

    async def cmd_set(self, arg: str) -> None:
        try:
            if "=" in arg:
                new = parse_assignments(arg, self.settings)
            else:
                name, _, value = arg.partition(" ")
                if not value.strip():
                    raise SettingsError(f"/set needs a value, e.g. /set {name} 0.7")
                new = self.settings.with_values(**{name: value.strip()})
        except SettingsError as exc:
            self.notice(str(exc), "error")
            return
        self.settings = new
        self._settings_from_user = True
        self.status.settings = settings_label(new)
        self.notice(f"Settings: {new.describe()}")

    async def cmd_settings(self, arg: str = "") -> None:
        default = self.info.default_settings if self.info else SamplingParams()
        self.notice(f"Settings in force: {self.settings.describe()}\n"
                    f"Model defaults: {default.describe()}\n"
                    f"Top alternatives per token: {self.top_logprobs}")

    async def cmd_retry(self, arg: str = "") -> None:
        await self.stop_generation()
        last = self.conversation.entries[-1] if self.conversation.entries else None
        if last is None or last.role != "assistant":
            self.notice("There is no reply to retry.", "error")
            return
        await self._remove_entry(last)
        self._answer("", again=last)

    async def cmd_edit(self, arg: str = "") -> None:
        await self.stop_generation()
        user = self.conversation.last_user
        if user is None:
            self.notice("There is no prompt to edit.", "error")
            return
        index = self.conversation.entries.index(user)
        for entry in list(self.conversation.entries[index:]):
            await self._remove_entry(entry)
        self.prompt.set_text(user.text)
        self.prompt.focus()

    async def cmd_continue(self, arg: str = "") -> None:
        if self.generating:
            self.notice("A reply is still being generated.", "error")
            return
        last = self.conversation.entries[-1] if self.conversation.entries else None
        reply = last.reply if last is not None else None
        if reply is None or last is None:
            self.notice("There is no reply to continue.", "error")
            return
        if last.is_comparison:
            self.notice("A comparison cannot be continued; /retry it with a larger "
                        "max_tokens (/set max_tokens N), or /pick a column and send a message.",
                        "error")
            return
        if reply.finish_reason not in ("length", "cancelled"):
            self.notice("The last reply finished on its own; only a stopped or cut-off reply "
                        "can be continued.", "error")
            return
        ids = tuple(t.id for t in reply.tokens)
        prefix = AssistantPrefix(reply.text, None if any(i is None for i in ids) else ids)  # type: ignore[arg-type]
        reply.settings = self.settings  # e.g. a larger max_tokens set after a cut-off
        self._start_reply(last, prefix=prefix)

    async def cmd_logprobs(self, arg: str = "") -> None:
        self.token_mode = not self.token_mode

    async def cmd_raw(self, arg: str = "") -> None:
        self.raw = not self.raw
        self.notice("Raw token view " + ("on: special tokens and exact spellings are shown."
                                         if self.raw else "off."))

    async def cmd_theme(self, arg: str = "") -> None:
        names = sorted(self.app.available_themes)
        if not arg:
            self.notice(f"Theme: {self.app.theme}. Available: {', '.join(names)}")
            return
        if arg not in names:
            close = difflib.get_close_matches(arg, names, n=1, cutoff=0.4)
            hint = f" Did you mean {close[0]}?" if close else ""
            self.notice(f"Unknown theme {arg!r}.{hint} Available: {', '.join(names)}", "error")
            return
        self.app.theme = arg

    async def cmd_copy(self, arg: str = "") -> None:
        last = self.conversation.last_assistant
        if last is None or not last.content:
            self.notice("There is no reply to copy yet.", "error")
            return
        text = last.content
        what = "the last reply"
        if arg.strip().lower() == "code":
            blocks = code_blocks(text)
            if not blocks:
                self.notice("The last reply has no code block.", "error")
                return
            text, what = blocks[-1], "the last code block"
        try:
            self.app.copy_to_clipboard(text)
        except Exception as exc:  # noqa: BLE001 - no clipboard is not an error worth dying for
            log.warning("copy failed: %s", exc)
            self.notice("Could not reach a clipboard; select the text with the mouse "
                        "(Shift+drag in most terminals) instead.", "error")
            return
        self.app.notify(f"Copied {what} ({len(text)} characters).")

    # ---- key actions (same as the commands) ----

    async def action_stop(self) -> None:
        if self.generating and self._job is not None and self._job.stream is not None:
            self._job.stream.cancel()
        elif isinstance(self.focused, TokenView):
            self.prompt.focus()

    async def action_logprobs(self) -> None:
        await self.cmd_logprobs()

    async def action_retry(self) -> None:
        await self.cmd_retry()

    async def action_edit(self) -> None:
        await self.cmd_edit()

    async def action_continue(self) -> None:
        await self.cmd_continue()

    async def action_copy_reply(self) -> None:
        await self.cmd_copy()

    async def action_copy_code(self) -> None:
        await self.cmd_copy("code")

    async def action_raw(self) -> None:
        await self.cmd_raw()

    async def action_save(self) -> None:
        await self.run_command("/save")

    async def action_help(self) -> None:
        await self.cmd_help()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.generating or isinstance(self.focused, TokenView) else None
        if action == "raw":
            return isinstance(self.focused, TokenView) or None
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
        word = text[1:].split(" ", 1)[0].lower()
        if " " in text:
            spec = commands.BY_NAME.get(commands.ALIASES.get(word, word))
            rows = [spec] if spec else []
        else:
            rows = [c for c in commands.COMMANDS if c.name.startswith(word)]
        if not rows:
            near = commands.nearest(word)
            hint.update(Content(f"unknown command /{word}" +
                                (f" — did you mean /{near}?" if near else "")))
        else:
            hint.update(Content("   ".join(
                f"/{c.name}{' ' + c.args if c.args else ''} — {c.help}" if len(rows) == 1
                else f"/{c.name}" for c in rows[:12]) + ("   (Tab completes)" if rows else "")))
        hint.display = True


def _reindex(tokens: tuple[Token, ...], offset: int) -> list[Token]:
    """Tokens with positions counted from the start of the whole reply, not the request."""
    if offset == 0:
        return list(tokens)
    return [dataclasses.replace(
        t, index=t.index + offset,
        glyph_start=None if t.glyph_start is None else t.glyph_start + offset) for t in tokens]
