"""ChatApp: the full-screen chat. It owns the inference worker, the theme and persistence,
and lends them to the chat screen as its services (:class:`~chatui.chat_commands.AppServices`);
the chat screen owns the conversation flow. The app talks down to the screen by calls
(``model_ready``, ``load_progress``) and hears back by messages (``ResponseStarted``,
``ResponseComplete``, ``ResponseFailed``, ``ReplyChosen``). The screen asks for an autosave
itself, at the moment the conversation changes (``services.save_conversation``): a save made
when the message arrived took its snapshot later, after whatever the user did meanwhile (a
/retry typed right after a /pick saved the retried reply empty, and a flush between the reply's
end and the message found nothing queued).

The app appears at once and loads the model in the background; whatever goes wrong is shown
in the app with a sentence (and logged to a file), never as a traceback on the terminal.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Iterable

from textual import events
from textual.app import App, SystemCommand
from textual.await_complete import AwaitComplete
from textual.binding import Binding
from textual.screen import Screen
from textual.theme import Theme

from inference.backend import BackendFactory
from inference.types import Failed, Progress
from inference.worker import InferenceWorker, describe_error
from themes import DEFAULT_THEME, STYLESHEET, THEMES, heat_variable_defaults

from . import chat_commands, early_input, gcpolicy, rescue
from .autosaver import Autosaver
from .commands import COMMANDS
from .config import AppConfig, load_remembered, remember
from .conversation import Conversation, ModelRef
from .messages import (AutosaveBranched, AutosaveFailed, InputReady, ResponseComplete,
                       ResponseFailed, SubmitSettled)
from .reporting import run_reported
from .screens.chat import ChatScreen
from .screens.held_keys import behind_typed_keys, release_keys
from .screens.notebook import NO_TEMPLATE_NOTICE, NotebookScreen
from .screens.once import ChatPalette, DismissOnce
from .textual_compat import ReportsFatalErrors

log = logging.getLogger(__name__)

SAVE_ON_EXIT_S = 10.0
"""How long quitting waits for the last autosave to be written."""


class ChatApp(ReportsFatalErrors, App[int]):
    """A terminal chat with a local model, with live per-token probabilities.

    Args:
        factory: builds the backend on the worker thread (loads the model).
        config: everything else (theme, settings, paths).
    """

    CSS_PATH = str(STYLESHEET)
    TITLE = "chatui"
    ENABLE_COMMAND_PALETTE = True

    BINDINGS = [
        Binding("ctrl+c", "interrupt", "Stop", show=False, priority=True, id="app.interrupt",
                tooltip="Stop the reply; never quits"),
        Binding("ctrl+q", "quit_in_order", "Quit", priority=True, id="app.quit",
                tooltip="Quit (the conversation is kept)"),
    ]

    def __init__(self, factory: BackendFactory, config: AppConfig | None = None, *,
                 worker: InferenceWorker | None = None) -> None:
        super().__init__()
        self.config = config or AppConfig()
        self._factory = factory
        self.worker = worker or self._new_worker()
        for theme in THEMES:
            self.register_theme(theme)
        self._remember_theme = False
        self.theme = self._initial_theme()
        self.autosaver = Autosaver(self._report_autosave_failure,
                                   lambda: self.post_message(AutosaveBranched()))
        self._held = []
        self._input_watch = early_input.QuietWatch()

    # ---- no keystroke is lost ----

    _held: list[events.Event] | None
    """Keys and pastes that arrived before the chat screen could take them, in order (None
    once it can: they were handed to the prompt box)."""

    async def on_event(self, event: events.Event) -> None:
        """Hold the keys a fast typist (or a paste) sends before the prompt box exists, and
        give a key that arrives while nothing has the focus to the prompt box (Textual would
        hand it to the screen, which drops it): measured with tmux, a message typed within a
        second of starting chatui was lost in every run."""
        if isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded:
            held = self._held if self._held is not None else self._held_after
            if held is not None:
                held.append(event)
                return
            self._focus_prompt_if_nothing_is()
            top = self.screen_stack[-1] if self.screen_stack else None
            sends = isinstance(event, events.Key) and event.key == "enter" \
                and isinstance(top, ChatScreen) and self.focused is top.prompt
            await super().on_event(event)
            if sends:
                self.hold_keys()
            elif self.screen_stack and self.screen_stack[-1] is not top:
                # a key that opened (or closed) a screen, as a priority binding does at once
                # (F5, F1, Ctrl+F, Ctrl+P, Esc): the screen is not up yet
                release_keys(self, self.hold_keys())
            return
        await super().on_event(event)

    def _focus_prompt_if_nothing_is(self) -> None:
        if self.focused is not None:
            return
        screen = self.screen
        if isinstance(screen, ChatScreen) and screen.is_mounted:
            screen.set_focus(screen.prompt)

    _held_after: list[events.Event] | None = None
    """Keys and pastes typed after a key whose effect is not in place yet (None when none
    is held): Enter in the message box, until what it sent has been taken up
    (``SubmitSettled``), and a key that opened or closed a screen, until that screen has
    drawn itself. ``/tree`` then Down and Enter typed at once moved the message box's history
    and sent nothing, the tree never saw them (seen in tmux). Held keys go where the focus is
    then, in order, before any later key."""

    _hold = 0
    """The number of the last hold (a settling meant for an earlier one ends nothing)."""

    HOLD_MAX_S = 1.0
    """The longest keys are held: a command that takes longer (a long /score) lets them go
    to wherever the focus is then, so that typing never seems dead for long."""

    def hold_keys(self) -> int:
        """Hold the keys typed from now on until ``SubmitSettled`` for the hold returned (or
        ``HOLD_MAX_S``): for a key whose effect comes a moment later (a screen that closes
        once a search has answered)."""
        self._held_after = []
        self._hold += 1
        hold = self._hold
        self.set_timer(self.HOLD_MAX_S, lambda: self.post_message(SubmitSettled(hold)))
        return hold

    async def on_submit_settled(self, message: SubmitSettled) -> None:
        """Let the held keys go, in order (this runs in the app's queue, where later keys
        wait); an Enter among them may hold the ones after it in turn."""
        if self._held_after is None or message.hold not in (None, self._hold):
            return
        held, self._held_after = self._held_after, None
        for event in held:
            await self.on_event(_fresh(event))

    _input_watch: early_input.QuietWatch
    """Whether what was typed at start has all been read (``on_input_ready``)."""

    async def on_input_ready(self, event: InputReady) -> None:
        """The prompt box exists: give it the held keys, in order, before any later key
        (this runs in the app's queue, where later keys wait). In a real terminal, not before
        Textual's input thread has read everything typed so far (``early_input``: keys typed
        in line mode and read after this point lost their Enter)."""
        if self._held is None:
            return
        if not self.is_headless:
            if not self._input_watch.settled(time.monotonic(), early_input.unread_bytes()):
                self.set_timer(early_input.POLL_S, lambda: self.post_message(InputReady()))
                return
        held, self._held = self._held or [], None
        chat = self.chat
        chat.set_focus(chat.prompt)
        chat.put_back_draft(typed=bool(held))
        for early in held:
            if isinstance(early, events.Key) and early.key == "ctrl+j":
                # typed before the terminal left line mode, Enter arrives as a line feed
                early = events.Key("enter", "\r")
            await self.on_event(_fresh(early))

    def _new_worker(self) -> InferenceWorker:
        return InferenceWorker(self._factory,
                               log_file=self.config.resolved_log_file())  # never the screen

    # ---- an engine that died is restarted ----

    _restarting = False

    def _restart_if_dead(self) -> bool:
        """If the engine's process died, say so once, start a new one behind the loading
        panel and go on (every message failed with the same sentence before). Whether it
        is restarting."""
        why = self.worker.dead
        if why is None or self._restarting:
            return self._restarting
        self._restarting = True
        log.error("the engine died (%s); restarting it", why)
        self.notify(f"{why} Restarting the engine; the conversation is kept, and a message "
                    "sent meanwhile goes out when it is ready.", title="Engine restarted",
                    severity="warning", timeout=10, markup=False)
        old, self.worker = self.worker, self._new_worker()
        old.close()
        self.chat.model_reloading()
        run_reported(self, self._reload(), what="Restarting the engine", group="load")
        return True

    async def _reload(self) -> None:
        try:
            await self._load()
        finally:
            self._restarting = False

    def _initial_theme(self) -> str:
        wanted = self.config.theme or load_remembered(
            self.config.resolved_config_dir()).get("theme") or DEFAULT_THEME
        if wanted not in self.available_themes:
            log.warning("unknown theme %r; using %s", wanted, DEFAULT_THEME)
            self._theme_warning = (f"There is no theme {wanted!r}; using {DEFAULT_THEME}. "
                                   "/theme lists the themes.")  # shown once mounted
            return DEFAULT_THEME
        return wanted

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return heat_variable_defaults(self.current_theme.dark)

    @property
    def chat(self) -> ChatScreen:
        """The chat screen (under any modal)."""
        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                return screen
        raise LookupError("the chat screen is not open")

    _theme_warning = ""

    def on_mount(self) -> None:
        self._catch_hang_up()
        if self._theme_warning:  # --theme nope was ignored silently
            self.notify(self._theme_warning, severity="warning", timeout=8, markup=False)
        self.theme_changed_signal.subscribe(self, self._theme_changed)
        self._remember_theme = True
        shown = self.push_screen(ChatScreen(self, settings=self.config.settings,
                                    overrides=self.config.settings_overrides,
                                    top_logprobs=self.config.top_logprobs,
                                    system_prompt=self.config.system_prompt,
                                    token_mode=self.config.token_view,
                                    stable_timings=self.config.stable_timings))
        if self.config.raw_mode:
            run_reported(self, self._open_notebook(shown), what="Opening raw mode",
                         group="notebook")
        run_reported(self, self._load(), what="Loading the model", group="load")
        if self.config.load_path is not None:
            run_reported(self, self._open(str(self.config.load_path), shown),
                         what=f"Opening {self.config.load_path}", group="open")

    HANG_UP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGHUP", "SIGTERM")
                            if hasattr(signal, name))
    """The terminal closed (or an SSH connection dropped: SIGHUP), or the system asked the
    app to end (SIGTERM): both ended the process at once, and a reply streaming then was lost
    with everything since the last autosave. Now the reply is stopped and kept and the
    conversation saved first (:meth:`_hung_up`)."""

    def _catch_hang_up(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            for sig in self.HANG_UP_SIGNALS:
                loop.add_signal_handler(sig, self._hung_up, sig)
        except (NotImplementedError, RuntimeError, ValueError):  # (no such handlers here)
            pass

    def _hung_up(self, sig: int) -> None:
        """SIGTERM quits as Ctrl+Q does. SIGHUP: the terminal is gone, and drawing would block
        for ever (Textual's output thread dies on the first write to it, and the screen's
        writes queue up behind it: the process hung at exit), so the reply is stopped and the
        conversation saved here, on the loop, with nothing drawn, and the process ends."""
        if sig != getattr(signal, "SIGHUP", None):
            log.info("signal %d: quitting as Ctrl+Q does", sig)
            if not self._quitting_on_signal:
                self._quitting_on_signal = True
                run_reported(self, self.action_quit(), what="Quitting", group="hang-up")
            return
        log.info("signal %d: the terminal is gone; stopping the reply, saving, quitting", sig)
        code = 2
        try:
            self._stop_for_hang_up()
            self._keep_draft()
            saved, _ = self._save_before_exit()
            code = 0 if saved else 2
            log.info("saved on hang-up" if saved else "saving on hang-up failed")
        except BaseException:  # (the process ends whatever happened)
            log.exception("saving on hang-up failed")
        finally:
            try:
                self.worker.close()
            finally:
                logging.shutdown()
                os._exit(code)

    def _stop_for_hang_up(self) -> None:
        """The streaming reply and raw mode's continuation stopped where they are, each on its
        own: a failure in one is logged and the conversation is still saved (an import that
        failed here, the package upgraded under the running app, left it unsaved)."""
        try:
            job = self.chat.state.job
            if job is not None:
                if job.stream is not None:
                    job.stream.cancel()
                job.recorder.finish()  # (rows still running: stopped, as Esc would)
        except LookupError:  # (no chat screen yet)
            pass
        except Exception:
            log.exception("stopping the reply on hang-up failed")
        for screen in self.screen_stack:
            if isinstance(screen, NotebookScreen):
                try:
                    screen.hang_up()
                except Exception:
                    log.exception("stopping the notebook on hang-up failed")

    _quitting_on_signal = False

    async def _open(self, path: str, shown: Awaitable[Any]) -> None:
        """Open the transcript given on the command line, as ``/load PATH`` would, once the
        chat screen is mounted (before, it has no conversation to draw into: the transcript
        was silently not shown)."""
        await shown
        await chat_commands.cmd_load(self.chat, path)

    async def _open_notebook(self, shown: Awaitable[Any], notice: str = "") -> None:
        """Raw mode's notebook over the chat screen, once that is mounted."""
        await shown
        self.chat.open_notebook(notice)

    async def _load(self) -> None:
        """Load the model behind the loading panel; report a failure in the app."""
        failed = ""
        try:
            async for events in self.worker.load():
                for ev in events:
                    if isinstance(ev, Progress):
                        self.chat.load_progress(ev.stage, ev.done, ev.total)
                    elif isinstance(ev, Failed):
                        failed = ev.message
        except Exception as exc:  # noqa: BLE001
            log.exception("loading failed")
            failed = str(exc) or type(exc).__name__
        info = self.worker.info
        if failed or info is None:
            self.chat.model_failed(failed or "the backend reported no model")
        else:
            log.info("model loaded: %s", info)
            self.chat.model_ready(info)
            if info.chat_template_warning and not self.config.raw_mode:
                # no chat template: a base model; its notebook rather than the ChatML fallback
                self.chat.open_notebook(NO_TEMPLATE_NOTICE)
            self._model_ref = ModelRef(name=info.name, checkpoint=info.checkpoint,
                                       weights_hash=info.weights_hash, dtype=info.dtype,
                                       backend=info.backend, url=info.url,
                                       quantization="" if info.quantization == "none"
                                       else info.quantization)

    def _theme_changed(self, theme: Theme) -> None:
        if self._remember_theme:
            remember(self.config.resolved_config_dir(), theme=theme.name)

    # ---- actions ----

    async def action_interrupt(self) -> None:
        """Ctrl+C: stop the reply if one is streaming; otherwise copy a selection or explain."""
        chat = self.chat
        if chat.generating:
            await chat.action_stop()
            return
        if await self._stop_notebook():
            return
        focused = self.focused
        selected = getattr(focused, "selected_text", "")
        if selected:
            self.copy_to_clipboard(selected)
            return
        self.notify("Ctrl+Q quits (the conversation is kept); Esc or Ctrl+C stops a reply.",
                    timeout=4)

    async def _stop_notebook(self) -> bool:
        """Stop raw mode's continuation if one runs; True if it did."""
        for screen in self.screen_stack:
            if isinstance(screen, NotebookScreen) and screen.generating:
                await screen.action_stop()
                return True
        return False

    def action_command_palette(self) -> None:
        """Ctrl+P: Textual's palette, dismissed once (:mod:`chatui.screens.once`)."""
        if self.use_command_palette and not ChatPalette.is_open(self):
            self.push_screen(ChatPalette(id="--command-palette"))

    def search_themes(self) -> None:
        """Textual's theme search (its palette's "Change theme"), in a :class:`ChatPalette`."""
        from textual.theme import ThemeProvider

        self.push_screen(ChatPalette(providers=[ThemeProvider],
                                     placeholder="Search for themes…"))

    def search_commands(self, commands: Any, placeholder: str = "Search for commands…") -> Any:
        """Textual's list of commands (its palette's "Keys" and others), in a
        :class:`ChatPalette`."""
        from textual.command import SimpleProvider

        return self.push_screen(ChatPalette(providers=[SimpleProvider(self.screen, commands)],
                                            placeholder=placeholder))

    def pop_screen(self) -> AwaitComplete:
        """Pop the top screen, never the chat screen: every other screen is pushed over it,
        and a screen dismissed twice took it off the stack (see :mod:`chatui.screens.once`);
        the next key stopped the app."""
        if isinstance(self.screen, ChatScreen):
            log.warning("a screen was dismissed twice: the chat screen stays")
            return DismissOnce.dismiss_nothing(self)
        return super().pop_screen()

    def action_quit_in_order(self) -> None:
        """Ctrl+Q, a priority binding, run as its key arrives: quit behind the keys already on
        their way to the focused widget, so a draft typed just before it is kept whole (one
        typed with Ctrl+Q at once came back as "my unsen"; seen in tmux)."""
        behind_typed_keys(self, self.action_quit)

    async def action_quit(self) -> None:
        """Stop any reply, keep the conversation, close the worker and exit. If the save
        fails (or does not finish), the conversation is written to the rescue folder
        instead and the terminal says where (it quit with the conversation lost: seen with a
        data folder that could not be written); if that fails too, the first Ctrl+Q only says
        so (``/save PATH`` or ``/export`` can still keep it) and the second quits without it.
        (Quitting once waited 10 s silently, the save's error report blocked behind the
        wait, and exited as if saved.)"""
        try:
            await self.chat.stop_generation()
        except LookupError:
            pass
        await self._stop_notebook()
        self._keep_draft()
        why = await self._save_and_wait(
            slow="Saving the conversation before quitting…")
        if why is None:
            self.worker.close()
            self.exit(0)
            return
        rescued = self._rescue_copy()
        if rescued is None and not self._quit_refused and not self._quitting_on_signal:
            self._quit_refused = True
            self.notify(f"The conversation could not be saved ({why}), nor a copy in "
                        f"{rescue.rescue_dir()}. /save PATH keeps it elsewhere; Ctrl+Q again "
                        "quits without it.", title="Not saved", severity="error", timeout=30,
                        markup=False)
            return
        self.worker.close()
        where = (f"; a copy was saved to {rescued} (chatui --load {rescued} opens it)"
                 if rescued is not None else "")
        self.exit(return_code=2,
                  message=f"chatui quit, but the conversation could not be saved ({why})"
                  f"{where}. Details are in {self.config.resolved_log_file()}.")

    def _keep_draft(self) -> None:
        """The unsent text in the prompt box kept for the next start (never raises)."""
        try:
            self.chat.keep_draft()
        except Exception:  # noqa: BLE001 - (no chat screen yet; an unwritable folder logs)
            log.exception("the unsent message could not be kept")

    _quit_refused = False
    """Ctrl+Q was pressed once with the conversation unsaved anywhere (the next one quits)."""

    async def _save_and_wait(self, slow: str = "", *, compact: bool = True) -> str | None:
        """Save the open conversation and wait for the write (``SAVE_ON_EXIT_S`` at most,
        ``slow`` shown after 0.2 s; ``compact``: its journal folded into the document too);
        why it is not saved, or None."""
        self._autosave_error = None
        self.save_conversation()
        wait = self.autosaver.flush if compact else self.autosaver.wait
        if slow and wait(timeout=0.2) is False:  # a slow disk: say so
            self.notify(slow, timeout=SAVE_ON_EXIT_S)
        saved = await asyncio.to_thread(wait, SAVE_ON_EXIT_S)
        error = self._autosave_error
        if error is None and saved:
            return None
        return describe_error(error) if error is not None else (
            f"the save did not finish within {SAVE_ON_EXIT_S:.0f} s")

    async def keep_conversation(self) -> str | None:
        """Before another conversation takes the screen (``/clear``, ``/load``): the open one
        saved and the write waited for (they said "saved" while the save could still fail,
        and the conversation was gone). Where its folder cannot be written, a rescue copy is
        made and a notice says where. None when it is kept (or the user was already told it
        cannot be, for this conversation: the command then goes on); else the sentence to
        show, and the command should not replace it."""
        try:
            conv = self.chat.state.conversation
        except LookupError:
            return None
        if not self.config.autosave or not conv.entries:
            return None
        why = await self._save_and_wait(compact=False)
        if why is None:
            return None
        rescued = await asyncio.to_thread(self._rescue_copy)
        if rescued is not None:
            self.notify(f"The conversation could not be saved in its folder ({why}); a copy "
                        f"is in {rescued}.", title="Saved elsewhere", severity="warning",
                        timeout=20, markup=False)
            return None
        if self._unsaved_warned == conv.id:
            return None
        self._unsaved_warned = conv.id
        return (f"The conversation could not be saved ({why}), nor a copy in "
                f"{rescue.rescue_dir()}. /save PATH keeps it; the command again goes on "
                "without it.")

    _unsaved_warned: str | None = None
    """The conversation the user was told could not be saved anywhere (by ``keep_conversation``)."""

    def _rescue_copy(self) -> Path | None:
        """The chat's conversation written to the rescue folder (its autosave failed); the
        file, or None where that failed too."""
        try:
            conv = self.chat.state.conversation
        except LookupError:
            return None
        return rescue.write_rescue_copy(conv)

    def _save_before_exit(self) -> tuple[bool, Path | None]:
        """As the process ends (a hang-up, an internal error; the loop may not run again): the
        conversation saved, waiting on this thread, or else a rescue copy written; (whether it
        was saved, the rescue copy or None)."""
        self._autosave_error = None
        self.save_conversation()
        saved = self.autosaver.flush(timeout=SAVE_ON_EXIT_S) and self._autosave_error is None
        if not saved:
            log.error("the save before exiting failed: %s", self._autosave_error)
        return saved, None if saved else self._rescue_copy()

    _model_ref: ModelRef | None = None
    _autosave_warned = False

    # ---- the services the chat screen is lent (chatui.chat_commands.AppServices) ----

    @property
    def model_ref(self) -> ModelRef | None:
        """The loaded model, as a transcript records it (None until it has loaded)."""
        return self._model_ref

    def flush_autosaves(self) -> None:
        """Wait for pending autosaves (before a save or a listing reads the files)."""
        self.autosaver.flush()

    def open_saved(self, path: Path) -> Conversation:
        """``/load``: the conversation at ``path`` with the identity to go on under (an older
        copy of a conversation opens as a branch of it, never rewinding its autosave).

        Raises:
            TranscriptError: the file does not load (one sentence).
        """
        return self.autosaver.open(path, self.config.transcripts_dir())

    def save_conversation(self, conv: Conversation | None = None) -> None:
        """Autosave the conversation (after every reply and on quit) on the autosaver's
        thread; never raises (a failure is shown once). ``conv``: another conversation than
        the chat's (raw mode's notebook)."""
        if not self.config.autosave:
            return
        try:
            conv = conv or self.chat.state.conversation
        except LookupError:
            return
        if not conv.entries:
            return
        if self._model_ref is not None and not conv.model.name:
            conv.model = self._model_ref
        self.autosaver.save(conv, self.config.transcripts_dir())

    def _autosave_failed(self, exc: Exception) -> None:
        if not self._autosave_warned:
            self._autosave_warned = True
            self.notify(f"Autosave failed: {exc}", severity="error", timeout=10, markup=False)

    _autosave_error: Exception | None = None
    """What the last failed autosave raised (reset when quitting saves once more)."""

    def _report_autosave_failure(self, exc: Exception) -> None:
        """Called on the autosaver's thread; never blocks it (``call_from_thread`` did, until
        the loop ran, while the loop waited for the autosaver on quit: a 10 s deadlock)."""
        self._autosave_error = exc
        self.post_message(AutosaveFailed(exc))

    def on_autosave_failed(self, event: AutosaveFailed) -> None:
        self._autosave_failed(event.error)

    def on_autosave_branched(self, event: AutosaveBranched) -> None:
        """Say so when the chat's conversation went on in a branch: its file held messages
        this window never had (another window, or another chatui, had added to it; the
        autosave went to a file of its own without a word)."""
        try:
            current = self.chat.state.conversation
        except LookupError:
            current = None
        for live, branch in self.autosaver.follow_branches():
            if live is current:
                self.chat.notice(
                    "This conversation's file was changed elsewhere (another chatui window?) "
                    f"since it was opened here: it goes on as a branch of it, sharing its first "
                    f"{branch.branched_at} messages, saved to a file of its own; /history "
                    "lists both.", "warning")

    def on_response_complete(self, event: ResponseComplete) -> None:
        self._restart_if_dead()  # a comparison whose columns partly failed

    def on_response_failed(self, event: ResponseFailed) -> None:
        self._restart_if_dead()

    def on_unmount(self) -> None:
        try:
            loop = asyncio.get_running_loop()
            for sig in self.HANG_UP_SIGNALS:
                loop.remove_signal_handler(sig)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        self.autosaver.flush(timeout=SAVE_ON_EXIT_S)
        self.worker.close()

    # ---- palette ----

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Every command of the registry (one that needs an argument is put in the prompt
        to be completed), the code copy, and one entry per theme."""
        yield from super().get_system_commands(screen)
        if not isinstance(screen, ChatScreen):
            return
        for spec in COMMANDS:
            if spec.needs_arg:
                yield SystemCommand(f"/{spec.name} {spec.args}", spec.help,
                                    _typer(screen, f"/{spec.name} "))
            else:
                yield SystemCommand(f"/{spec.name}", spec.help,
                                    _runner(screen, f"/{spec.name}"))
        yield SystemCommand("/copy code", "Copy the last code block of the last reply.",
                            _runner(screen, "/copy code"))
        for name in sorted(self.available_themes):
            yield SystemCommand(f"Theme: {name}", f"Switch to the {name} theme.",
                                _runner(screen, f"/theme {name}"))

    # ---- never a traceback on the terminal ----

    def fatal_error_message(self, error: BaseException | None) -> str:
        log.error("internal error", exc_info=error)
        where = ""
        self._keep_draft()
        try:
            saved, rescued = self._save_before_exit()
            if not saved:
                where = f" The conversation was saved to {rescued}." if rescued else (
                    " The conversation could not be saved.")
        except Exception:  # noqa: BLE001
            pass
        try:
            self.worker.close()
        except Exception:  # noqa: BLE001
            pass
        return (f"chatui stopped after an internal error: {error!s}.{where} "
                f"Details are in {self.config.resolved_log_file()}.")


def _runner(screen: ChatScreen, text: str):
    async def run() -> None:
        await screen.run_command(text)
    return run


def _typer(screen: ChatScreen, text: str):
    def put() -> None:
        screen.put_prompt(text)
    return put


def setup_logging(config: AppConfig) -> None:
    """Send logs to the log file (never to the terminal the app draws on)."""
    path = config.resolved_log_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def run_chat(factory: BackendFactory, config: AppConfig | None = None) -> int:
    """Run the chat app until it quits; returns the process exit code."""
    config = config or AppConfig()
    setup_logging(config)
    gcpolicy.freeze_imports()
    app = ChatApp(factory, config=config)
    try:
        result = app.run()
    except Exception:  # noqa: BLE001 - logged; the terminal gets one sentence
        log.exception("the app failed")
        print(f"chatui failed; details are in {config.resolved_log_file()}", file=sys.stderr)
        return 1
    finally:
        app.worker.close()
    return app.return_code if app.return_code is not None else (result or 0)


def _fresh(event: events.Event) -> events.Event:
    """A held key or paste as new (one already dispatched carries its handled state)."""
    if isinstance(event, events.Key):
        return events.Key(event.key, event.character)
    return events.Paste(event.text)  # type: ignore[attr-defined]
