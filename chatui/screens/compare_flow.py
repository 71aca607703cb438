"""Compare mode of the chat: ``/compare`` arms a comparison, ``/pick`` chooses a column.

``/compare A | B | C`` (or a saved preset's name, or the compare screen) *arms* a comparison:
the next reply the chat asks for (the next prompt you send, or ``/retry`` / Ctrl+R on the last
prompt) is answered by every column at once. If the conversation already ends with a prompt
that has no reply, it is answered at once. All columns share one prefill and decode as one
batch; Esc stops them all; ``/pick N``, F6 (next column) or a click on a column's header
chooses the reply the conversation continues with (column 1 until you pick). ``/retry`` on a
comparison runs the same columns again.

:class:`CompareFlow` is composed into the chat screen and talks to it only through the narrow
:class:`CompareHost`; the columns stream through the screen's one streaming loop like any
reply (a single reply is a comparison of one row).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from inference.settings import SamplingParams, SettingsError

from ..conversation import Entry
from ..presets import (
    MAX_COLUMNS,
    PresetError,
    load_presets,
    looks_like_name,
    parse_columns,
    split_columns,
)
from ..state import DEFAULT_COLUMNS, ArmedComparison, ChatState

log = logging.getLogger(__name__)


class CompareHost(Protocol):
    """What compare mode needs of the chat screen."""

    state: ChatState

    def notice(self, text: str, kind: str = "info") -> object: ...

    def notify(self, text: str, **kwargs: Any) -> None: ...

    def settings_changed(self) -> None: ...

    def answer(self, prompt_text: str, again: Entry | None = None) -> None: ...

    def config_dir(self) -> Path: ...

    def open_compare_screen(self, columns: Sequence[str], base: SamplingParams,
                            done: Callable[[tuple[tuple[str, ...], str] | None], None]) -> None: ...

    def chosen_changed(self, entry: Entry) -> None: ...


class CompareFlow:
    """Compare mode (see the module docstring); the armed comparison lives in the state."""

    def __init__(self, host: CompareHost) -> None:
        self.host = host

    @property
    def state(self) -> ChatState:
        return self.host.state

    # ---- arming ----

    @property
    def armed(self) -> tuple[str, ...]:
        """The column specs of the armed comparison (empty: none)."""
        return self.state.armed.specs if self.state.armed else ()

    def arm(self, specs: Sequence[str], name: str = "") -> bool:
        """Check and arm ``specs``; answer a pending prompt at once. False if refused."""
        host, state = self.host, self.state
        specs = tuple(s.strip() for s in specs)
        try:
            rows = parse_columns(specs, state.settings)
        except SettingsError as exc:
            host.notice(str(exc), "error")
            return False
        state.armed = ArmedComparison(specs, name)
        state.last_columns = specs
        host.settings_changed()
        entries = state.conversation.entries
        last = entries[-1] if entries else None
        if (last is not None and last.role == "user" and state.info is not None
                and not state.generating and not state.waiting_for_model):
            host.answer("")
            return True
        labels = " | ".join(spec or "current" for spec in specs)
        what = f"preset {name!r}: " if name else ""
        host.notice(f"Comparing {len(rows)} settings on the next prompt ({what}{labels}). "
                    "Send a message, or Ctrl+R to compare on the last prompt again; "
                    "/compare off cancels.")
        return True

    def disarm(self) -> None:
        self.state.armed = None
        self.host.settings_changed()

    def rows_for_answer(self, again: Entry | None) -> tuple[SamplingParams, ...]:
        """The rows of the next answer when it is a comparison (the armed one, which this
        disarms, or the retried one), else ()."""
        state = self.state
        if state.armed is not None:
            rows: tuple[SamplingParams, ...] = ()
            try:
                rows = parse_columns(state.armed.specs, state.settings)
            except SettingsError as exc:  # settings changed since arming (e.g. /set)
                self.host.notice(f"The armed comparison no longer applies: {exc}", "error")
            self.disarm()
            if len(rows) > MAX_COLUMNS:
                raise ValueError(f"at most {MAX_COLUMNS} columns")
            return rows
        if again is not None and again.is_comparison:
            return tuple(r.settings for r in again.replies)
        return ()

    # ---- commands ----

    def command(self, arg: str) -> None:
        """``/compare [A | B ... | PRESET | off]``."""
        host = self.host
        arg = arg.strip()
        if not arg:
            self.open_screen()
            return
        if arg.lower() == "off":
            if self.state.armed is not None:
                self.disarm()
                host.notice("Comparison cancelled; the next reply uses the settings in force.")
            else:
                host.notice("No comparison is armed.")
            return
        if looks_like_name(arg):
            presets = load_presets(host.config_dir())
            if arg not in presets:
                names = ", ".join(sorted(presets)) or "none saved yet"
                host.notice(f"There is no compare preset {arg!r} (presets: {names}). Save one "
                            "from the compare screen (/compare with no argument), or give "
                            "settings: /compare temperature=0 | temperature=1", "error")
                return
            self.arm(presets[arg], name=arg)
            return
        self.arm(split_columns(arg))

    def preset_names(self) -> list[str]:
        return sorted(load_presets(self.host.config_dir()))

    def open_screen(self) -> None:
        """The compare screen: edit up to 6 columns, save and load presets, arm."""
        def done(result: tuple[tuple[str, ...], str] | None) -> None:
            if result is not None:
                self.arm(result[0], name=result[1])

        self.host.open_compare_screen(self.armed or self.state.last_columns,
                                      self.state.settings, done)

    def pick(self, arg: str) -> None:
        """``/pick N``."""
        entry = self.state.conversation.last_assistant
        if entry is None or not entry.is_comparison:
            self.host.notice("The last reply is not a comparison; /compare makes one.", "error")
            return
        n = len(entry.replies)
        try:
            column = int(arg.strip())
        except ValueError:
            column = 0
        if not 1 <= column <= n:
            self.host.notice(f"/pick needs a column number from 1 to {n}.", "error")
            return
        self.pick_column(entry, column - 1)

    def pick_column(self, entry: Entry, column: int) -> None:
        """Continue the conversation with ``entry``'s reply ``column`` (0-based)."""
        host = self.host
        if entry is not self.state.conversation.last_assistant:
            host.notice("Only the last comparison can be picked from: later messages were "
                        "answered after the earlier choice.", "error")
            return
        if self.state.generating:
            host.notice("The comparison is still streaming: wait for it, or Esc to stop it, "
                        "then pick.", "error")
            return
        entry.chosen = column  # the entry's text follows (derived)
        host.chosen_changed(entry)

    @property
    def can_pick(self) -> bool:
        """True when the last reply is a finished comparison (F6 is shown)."""
        entry = self.state.conversation.last_assistant
        return entry is not None and entry.is_comparison and not self.state.generating

    def pick_next(self) -> None:
        entry = self.state.conversation.last_assistant
        if entry is not None and entry.is_comparison:
            self.pick_column(entry, (entry.chosen + 1) % len(entry.replies))


def pick_bindings() -> list:
    """F6: continue with the next column of the last comparison (for the chat screen's
    BINDINGS; shown only while there is one to pick from). Alt+digit is not used: terminals
    and Textual's key parser turn several of them into symbols."""
    from textual.binding import Binding

    return [Binding("f6", "pick_next", "Pick", id="chat.pick", priority=True,
                    tooltip="Continue with the next column of the last comparison")]


__all__ = ["CompareFlow", "CompareHost", "DEFAULT_COLUMNS", "PresetError", "pick_bindings"]
