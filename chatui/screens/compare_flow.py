"""Compare mode of the chat screen: ``/compare``, ``/pick`` and the streaming of N columns.

``/compare A | B | C`` (or a saved preset's name, or the compare screen) *arms* a comparison:
the next reply the chat asks for (the next prompt you send, or ``/retry`` / Ctrl+R on the last
prompt) is answered by every column at once. If the conversation already ends with a prompt
that has no reply, it is answered at once. All columns share one prefill and decode as one
batch; Esc stops them all; ``/pick N``, F6 (next column) or a click on a column's header
chooses the reply
the conversation continues with (column 1 until you pick). ``/retry`` on a comparison runs the
same columns again.

This is a mixin of :class:`~chatui.screens.chat.ChatScreen` (kept in its own module so the
chat screen stays readable); it uses the chat screen's conversation, worker and job state.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Sequence

from inference.settings import SamplingParams, SettingsError
from inference.types import Failed, GenerationRequest, RowDone, Started, TokenBatch
from inference.worker import describe_error

from ..conversation import Entry
from ..messages import ResponseComplete, ResponseFailed, ResponseStarted
from ..presets import (
    MAX_COLUMNS,
    PresetError,
    load_presets,
    looks_like_name,
    parse_columns,
    split_columns,
)
from ..widgets.compare import CompareView

if TYPE_CHECKING:
    from .chat import ChatScreen, _Job

log = logging.getLogger(__name__)

DEFAULT_COLUMNS = ("temperature=0", "temperature=0.7 top_p=0.9", "temperature=1.2 min_p=0.05")
"""What the compare screen offers the first time."""


class CompareFlow:
    """The compare-mode half of the chat screen (see the module docstring)."""

    _armed: tuple[str, ...] = ()
    """Column specs waiting for the next reply; empty when no comparison is armed."""
    _armed_name: str = ""
    _last_columns: tuple[str, ...] = DEFAULT_COLUMNS

    # ---- arming ----

    @property
    def compare_armed(self: ChatScreen) -> tuple[str, ...]:  # type: ignore[misc]
        """The column specs of the armed comparison (empty: none)."""
        return self._armed

    def arm_compare(self: ChatScreen, specs: Sequence[str],  # type: ignore[misc]
                    name: str = "") -> bool:
        """Check and arm ``specs``; answer a pending prompt at once. False if refused."""
        specs = tuple(s.strip() for s in specs)
        try:
            rows = parse_columns(specs, self.settings)
        except SettingsError as exc:
            self.notice(str(exc), "error")
            return False
        self._armed, self._armed_name = specs, name
        self._last_columns = specs
        self.status.settings = self._armed_label()
        last = self.conversation.entries[-1] if self.conversation.entries else None
        if (last is not None and last.role == "user" and self.info is not None
                and not self.generating and not self._waiting_for_model):
            self._answer("")
            return True
        labels = " | ".join(spec or "current" for spec in specs)
        what = f"preset {name!r}: " if name else ""
        self.notice(f"Comparing {len(rows)} settings on the next prompt ({what}{labels}). "
                    "Send a message, or Ctrl+R to compare on the last prompt again; "
                    "/compare off cancels.")
        return True

    def disarm_compare(self: ChatScreen) -> None:  # type: ignore[misc]
        self._armed, self._armed_name = (), ""
        self.status.settings = self._settings_label()

    def _armed_label(self: ChatScreen) -> str:  # type: ignore[misc]
        name = f" {self._armed_name}" if self._armed_name else ""
        return f"compare{name}: {len(self._armed)} columns on the next prompt"

    def _settings_label(self: ChatScreen) -> str:  # type: ignore[misc]
        from .chat import settings_label

        return settings_label(self.settings)

    def _answer(self: ChatScreen, prompt_text: str,  # type: ignore[misc]
                again: Entry | None = None) -> None:
        """Answer the last user message: as a comparison when one is armed (or when
        ``again``, the reply being retried, was one), else as a normal reply."""
        rows: tuple[SamplingParams, ...] = ()
        if self._armed:
            try:
                rows = parse_columns(self._armed, self.settings)
            except SettingsError as exc:  # settings changed since arming (e.g. /set)
                self.notice(f"The armed comparison no longer applies: {exc}", "error")
            self.disarm_compare()
        elif again is not None and again.is_comparison:
            rows = tuple(r.settings for r in again.replies)
        if rows:
            entry = self.conversation.add_assistant(list(rows))
            self._start_compare(entry, prompt_text=prompt_text)
        else:
            self._start_reply(self._new_reply_entry(), prompt_text=prompt_text)

    # ---- commands ----

    async def cmd_compare(self: ChatScreen, arg: str = "") -> None:  # type: ignore[misc]
        arg = arg.strip()
        if not arg:
            self.open_compare_screen()
            return
        if arg.lower() == "off":
            if self._armed:
                self.disarm_compare()
                self.notice("Comparison cancelled; the next reply uses the settings in force.")
            else:
                self.notice("No comparison is armed.")
            return
        if looks_like_name(arg):
            presets = load_presets(self.chat_app.config.resolved_config_dir())
            if arg not in presets:
                names = ", ".join(sorted(presets)) or "none saved yet"
                self.notice(f"There is no compare preset {arg!r} (presets: {names}). Save one "
                            "from the compare screen (/compare with no argument), or give "
                            "settings: /compare temperature=0 | temperature=1", "error")
                return
            self.arm_compare(presets[arg], name=arg)
            return
        self.arm_compare(split_columns(arg))

    def _preset_names(self: ChatScreen) -> list[str]:  # type: ignore[misc]
        return sorted(load_presets(self.chat_app.config.resolved_config_dir()))

    def open_compare_screen(self: ChatScreen) -> None:  # type: ignore[misc]
        """The compare screen: edit up to 6 columns, save and load presets, arm."""
        from .compare import CompareScreen

        def done(result: tuple[tuple[str, ...], str] | None) -> None:
            if result is not None:
                self.arm_compare(result[0], name=result[1])

        self.app.push_screen(
            CompareScreen(self.chat_app.config.resolved_config_dir(),
                          columns=self._armed or self._last_columns, base=self.settings),
            done)

    async def cmd_pick(self: ChatScreen, arg: str = "") -> None:  # type: ignore[misc]
        entry = self.conversation.last_assistant
        if entry is None or not entry.is_comparison:
            self.notice("The last reply is not a comparison; /compare makes one.", "error")
            return
        n = len(entry.replies)
        try:
            column = int(arg.strip())
        except ValueError:
            column = 0
        if not 1 <= column <= n:
            self.notice(f"/pick needs a column number from 1 to {n}.", "error")
            return
        self.pick_column(entry, column - 1)

    def pick_column(self: ChatScreen, entry: Entry, column: int) -> None:  # type: ignore[misc]
        """Continue the conversation with ``entry``'s reply ``column`` (0-based)."""
        if entry is not self.conversation.last_assistant:
            self.notice("Only the last comparison can be picked from: later messages were "
                        "answered after the earlier choice.", "error")
            return
        if self.generating:
            self.notice("The comparison is still streaming: wait for it, or Esc to stop it, "
                        "then pick.", "error")
            return
        entry.chosen = column
        entry.text = entry.replies[column].text
        view = self._compare_view_of(entry)
        if view is not None:
            view.chosen = column
        self.app.notify(f"Continuing with column {column + 1}.", timeout=3)
        self.prompt.focus()
        self.chat_app.save_conversation()

    @property
    def can_pick(self: ChatScreen) -> bool:  # type: ignore[misc]
        """True when the last reply is a finished comparison (F6 is shown)."""
        entry = self.conversation.last_assistant
        return entry is not None and entry.is_comparison and not self.generating

    async def action_pick_next(self: ChatScreen) -> None:  # type: ignore[misc]
        entry = self.conversation.last_assistant
        if entry is not None and entry.is_comparison:
            self.pick_column(entry, (entry.chosen + 1) % len(entry.replies))

    def on_compare_view_picked(self: ChatScreen,  # type: ignore[misc]
                               event: CompareView.Picked) -> None:
        # (a naming-convention handler: Textual only collects @on handlers from DOM classes)
        self.pick_column(event.view.entry, event.column)

    # ---- the columns ----

    def _compare_view_of(self: ChatScreen, entry: Entry) -> CompareView | None:  # type: ignore[misc]
        for widget in self._widgets_of.get(id(entry), []):
            if isinstance(widget, CompareView):
                return widget
        return None

    def _mount_compare(self: ChatScreen, entry: Entry) -> CompareView:  # type: ignore[misc]
        """Build and mount the columns of a comparison group (``view.mounting`` can be
        awaited for the mount to finish)."""
        ids = [self._next_id("reply") for _ in entry.replies]
        view = CompareView(entry, view_ids=ids, stable_timings=self.stable_timings,
                           token_mode=self.token_mode, raw=self.raw,
                           id=self._next_id("compare"))
        widgets = self._widgets_of.setdefault(id(entry), [])
        for reply_view in view.views:  # listed first: removed before the group itself
            self._views[reply_view.id or ""] = (entry, reply_view)
            widgets.append(reply_view)
        widgets.append(view)
        view.mounting = self.log_view.mount(view)
        return view

    def _start_compare(self: ChatScreen, entry: Entry, *,  # type: ignore[misc]
                       prompt_text: str = "") -> None:
        """Stream every reply of ``entry`` from one batched request."""
        from .chat import _Job

        if len(entry.replies) > MAX_COLUMNS:
            raise ValueError(f"at most {MAX_COLUMNS} columns")
        view = self._mount_compare(entry)
        request = GenerationRequest(
            messages=self._messages_before(entry),
            settings=tuple(r.settings for r in entry.replies), top_logprobs=self.top_logprobs)
        job = _Job(entry, view.views[0], base_tokens=0, base_text="", prompt_text=prompt_text)
        self._job = job
        self.generating = True
        self.log_view.anchor()
        self.post_message(ResponseStarted(self.conversation.entries.index(entry)))
        self._gen_worker = self.run_worker(self._generate_compare(job, view, request),
                                           group="generate", exit_on_error=False)

    async def _generate_compare(self: ChatScreen, job: _Job,  # type: ignore[misc]
                                view: CompareView, request: GenerationRequest) -> None:
        entry = job.entry
        replies = entry.replies
        for reply in replies:
            reply.finish_reason, reply.usage, reply.error = None, None, ""
        if view.mounting is not None:
            await view.mounting
            view.mounting = None
        view.begin()
        try:
            job.stream = stream = self.chat_app.worker.generate(request)
            async for events in stream:
                for ev in events:
                    if isinstance(ev, TokenBatch):
                        reply = replies[ev.row]
                        reply.tokens.extend(ev.tokens)
                        reply.text += "".join(t.text for t in ev.tokens if not t.special)
                        await view.add_tokens(ev.row, ev.tokens)
                    elif isinstance(ev, RowDone):
                        reply = replies[ev.row]
                        reply.finish_reason = ev.finish_reason
                        reply.usage = ev.usage
                        if ev.text:
                            reply.text = ev.text
                        await view.end_column(ev.row)
                    elif isinstance(ev, Started):
                        self._compare_started(ev, view)
                    elif isinstance(ev, Failed):
                        for reply in replies:
                            if reply.finish_reason is None:
                                reply.finish_reason, reply.error = "error", ev.message
        except Exception as exc:  # noqa: BLE001 - shown in the columns, logged in full
            log.exception("comparison failed")
            for reply in replies:
                if reply.finish_reason is None:
                    reply.finish_reason, reply.error = "error", describe_error(exc)
        finally:
            for reply in replies:
                if reply.finish_reason is None:
                    if job.stream is not None:
                        job.stream.cancel()
                    reply.finish_reason = "cancelled"
            entry.text = entry.content
            self._job = None
            self.generating = False
        await view.end()
        await self._after_compare(job)

    def _compare_started(self: ChatScreen, ev: Started,  # type: ignore[misc]
                         view: CompareView) -> None:
        self._show_context(ev, view, view.entry, "comparison", notify=False)

    async def _after_compare(self: ChatScreen, job: _Job) -> None:  # type: ignore[misc]
        entry = job.entry
        replies = entry.replies
        index = (self.conversation.entries.index(entry)
                 if entry in self.conversation.entries else -1)
        failed = [i for i, r in enumerate(replies) if r.finish_reason == "error"]
        if failed and len(failed) == len(replies):
            error = replies[0].error
            if not any(r.tokens for r in replies) and job.prompt_text and index >= 1:
                user = self.conversation.entries[index - 1]  # give the prompt back
                await self._remove_entry(entry)
                await self._remove_entry(user)
                if not self.prompt.text:
                    self.prompt.set_text(job.prompt_text)
            self.notice(f"The comparison failed: {error}", "error")
            self.post_message(ResponseFailed(index, error))
        else:
            for i in failed:
                self.notice(f"Column {i + 1} failed: {replies[i].error}", "error")
            reasons = {r.finish_reason for r in replies}
            self.post_message(ResponseComplete(
                index, "cancelled" if "cancelled" in reasons else "stop"))
        rates = [r.usage.decode_tokens_per_s for r in replies if r.usage is not None]
        if self.stable_timings:
            self.status.speed = "– tok/s"
        elif rates:
            self.status.speed = f"{sum(rates):.1f} tok/s ({len(rates)} columns)"
        await self._update_context()


def pick_bindings() -> list:
    """F6: continue with the next column of the last comparison (for the chat screen's
    BINDINGS; shown only while there is one to pick from). Alt+digit is not used: terminals
    and Textual's key parser turn several of them into symbols."""
    from textual.binding import Binding

    return [Binding("f6", "pick_next", "Pick", id="chat.pick", priority=True,
                    tooltip="Continue with the next column of the last comparison")]


__all__ = ["CompareFlow", "DEFAULT_COLUMNS", "PresetError", "pick_bindings"]
