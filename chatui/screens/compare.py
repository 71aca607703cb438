"""The compare screen: edit up to 6 columns of sampling settings, keep them as named presets.

Opened by ``/compare`` with no argument or from the command palette. Each line is one column
(``temperature=0.7 top_p=0.9``, applied on top of the settings in force; ``current`` means
those unchanged); empty lines are skipped. "Compare" arms the comparison for the next prompt;
"Save" stores the columns under the name (``/compare NAME`` uses them later). Presets live in
``compare-presets.json`` in the config directory, next to the remembered theme.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from textual import on
from textual.actions import SkipAction
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static

from inference.settings import SamplingParams, SettingsError

from ..presets import (
    MAX_COLUMNS,
    PresetError,
    delete_preset,
    load_presets,
    parse_columns,
    save_preset,
)
from .held_keys import behind_typed_keys, hold_keys, release_keys
from .once import DismissOnce

EXAMPLES = ("temperature=0", "temperature=0.7 top_p=0.9", "temperature=1.2 min_p=0.05",
            "top_k=40 seed=7", "repetition_penalty=1.2", "current")

Result = tuple[tuple[str, ...], str]
"""(column specs, preset name or "") to arm; None when the screen is closed."""


class CompareScreen(DismissOnce, ModalScreen[Result | None]):
    """Edit the columns of a comparison and its presets (see the module docstring).

    Args:
        config_dir: where presets are stored.
        columns: the columns to start with.
        base: the settings in force (columns are checked against them).
    """

    AUTO_FOCUS = "#col-0"
    """The first column has the focus from the start: Textual's default gave it to the
    presets' list until ``on_mount``'s focus took effect, and the keys typed right after
    ``/compare`` and Enter went there and were lost (seen in tmux)."""

    BINDINGS = [
        Binding("escape", "close", "Close", id="compare.close", tooltip="Close without arming",
                priority=True),
        Binding("ctrl+enter,ctrl+j", "arm", "Compare", id="compare.arm", priority=True,
                tooltip="Compare these columns on the next prompt"),
        Binding("enter", "enter", show=False, priority=True),
    ]
    """Priority bindings: a key that closes the screen runs as it arrives, and the app holds
    the keys typed after it until the chat is back, so they go to the chat's prompt (as a
    normal binding, or a field's Enter, it waited in the focused field's queue while the keys
    after it were handed to the closing screen and lost); what it does waits behind the keys
    typed before it, in the focused field's queue, so that it reads the whole field."""

    DEFAULT_CSS = """
    CompareScreen { align: center middle; }
    CompareScreen > #compare-dialog {
        width: 84; max-width: 100%; height: auto; max-height: 100%;
        padding: 1 2; background: $surface; border: round $primary;
    }
    CompareScreen .compare-title { text-style: bold; color: $primary; }
    CompareScreen .compare-help { color: $text-muted; margin-bottom: 1; }
    CompareScreen .compare-row { height: 1; }
    CompareScreen .compare-row > Label { width: 4; color: $text-muted; }
    CompareScreen .compare-row > Input { width: 1fr; }
    CompareScreen #presets { height: auto; max-height: 6; margin-bottom: 1; }
    CompareScreen #compare-error { color: $error; height: auto; }
    CompareScreen .compare-buttons { height: auto; margin-top: 1; }
    CompareScreen .compare-buttons > Button { margin-right: 1; }
    CompareScreen #preset-name { width: 1fr; }
    """

    def __init__(self, config_dir: Path, *, columns: Sequence[str] = (),
                 base: SamplingParams | None = None) -> None:
        super().__init__()
        self.config_dir = config_dir
        self.base = base or SamplingParams()
        self.initial = list(columns)[:MAX_COLUMNS]
        self.presets: dict[str, tuple[str, ...]] = {}

    # ---- typed accessors ----

    def column_input(self, i: int) -> Input:
        return self.query_one(f"#col-{i}", Input)

    @property
    def name_input(self) -> Input:
        return self.query_one("#preset-name", Input)

    @property
    def preset_list(self) -> OptionList:
        return self.query_one("#presets", OptionList)

    @property
    def error(self) -> Static:
        return self.query_one("#compare-error", Static)

    def compose(self) -> ComposeResult:
        with Vertical(id="compare-dialog"):
            yield Static(Content("Compare sampling settings"), classes="compare-title")
            yield Static(Content(
                "One column per line, applied on top of the settings in force (current: "
                "unchanged). The next prompt, or Ctrl+R on the last one, is answered by every "
                "column in one batched decode."), classes="compare-help")
            yield OptionList(id="presets", compact=True)
            for i in range(MAX_COLUMNS):
                with Horizontal(classes="compare-row"):
                    yield Label(f"{i + 1}")
                    value = self.initial[i] if i < len(self.initial) else ""
                    yield Input(value, placeholder=f"e.g. {EXAMPLES[i]}", id=f"col-{i}",
                                compact=True)
            yield Static(id="compare-error")
            with Horizontal(classes="compare-buttons"):
                yield Input(placeholder="preset name, e.g. fast-vs-creative", id="preset-name",
                            compact=True)
                yield Button("Save", id="save", compact=True)
                yield Button("Delete", id="delete", compact=True)
            with Horizontal(classes="compare-buttons"):
                yield Button("Compare", id="arm", variant="primary", compact=True)
                yield Button("Cancel", id="cancel", compact=True)

    def on_mount(self) -> None:
        self.error.display = False
        self._reload_presets()
        self.column_input(0).focus()

    # ---- presets ----

    def _reload_presets(self) -> None:
        self.presets = load_presets(self.config_dir)
        options = self.preset_list
        options.clear_options()
        for name, cols in sorted(self.presets.items()):
            options.add_option(f"{name}: {' | '.join(c or 'current' for c in cols)}")
        options.display = bool(self.presets)

    @on(OptionList.OptionSelected, "#presets")
    def _preset_chosen(self, event: OptionList.OptionSelected) -> None:
        name = sorted(self.presets)[event.option_index]
        self.load_preset(name)

    def load_preset(self, name: str) -> None:
        """Fill the columns from a saved preset."""
        cols = self.presets[name]
        for i in range(MAX_COLUMNS):
            self.column_input(i).value = cols[i] if i < len(cols) else ""
        self.name_input.value = name
        self._say("")

    def columns(self) -> tuple[str, ...]:
        """The non-empty column lines, in order."""
        values = (self.column_input(i).value.strip() for i in range(MAX_COLUMNS))
        return tuple(v for v in values if v)

    def _checked(self) -> tuple[str, ...] | None:
        cols = self.columns()
        try:
            parse_columns(cols, self.base)
        except SettingsError as exc:
            self._say(str(exc))
            return None
        return cols

    def _say(self, text: str) -> None:
        self.error.update(Content(text))
        self.error.display = bool(text)

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        cols = self._checked()
        if cols is None:
            return
        try:
            name = save_preset(self.config_dir, self.name_input.value, cols)
        except (PresetError, SettingsError) as exc:
            self._say(str(exc))
            return
        self._reload_presets()
        self._say("")
        self.app.notify(f"Saved compare preset {name!r}: /compare {name} uses it.", timeout=4)

    @on(Button.Pressed, "#delete")
    def action_delete(self) -> None:
        name = self.name_input.value.strip()
        try:
            found = delete_preset(self.config_dir, name)
        except PresetError as exc:
            self._say(str(exc))
            return
        if not found:
            self._say(f"There is no preset {name!r} to delete.")
            return
        self._reload_presets()
        self._say("")
        self.app.notify(f"Deleted compare preset {name!r}.", timeout=3)

    # ---- closing ----

    @on(Button.Pressed, "#arm")
    def action_arm(self) -> None:
        hold = hold_keys(self)
        behind_typed_keys(self, self._arm, hold)

    def _arm(self, hold: int | None) -> None:
        cols = self._checked() if self.is_active else None
        if cols is not None:
            name = self.name_input.value.strip()
            self.dismiss((cols, name if self.presets.get(name) == cols else ""))
        release_keys(self, hold)

    def action_enter(self) -> None:
        """Enter in a field: the preset's name saves it, a column arms the comparison (other
        widgets, the buttons and the presets' list, take Enter themselves)."""
        field = self.focused
        if not isinstance(field, Input):
            raise SkipAction()
        if field.id == "preset-name":
            field.call_later(self.action_save)
        else:
            self.action_arm()

    @on(Button.Pressed, "#cancel")
    def action_close(self) -> None:
        self.dismiss(None)
