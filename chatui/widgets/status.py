"""The status bar (model, settings, context meter, speed) and the model-loading panel."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import ProgressBar, Static

CONTEXT_WARN = 0.8
"""The meter turns to a warning at this share of the context limit..."""
CONTEXT_FULL = 0.95
"""...and to an error here (the oldest turns are about to be dropped)."""


NARROW = 130
"""Below this many columns the context meter drops its bar (the count always shows)."""


def context_meter(used: int, limit: int, width: int = 10) -> Content:
    """``ctx ▰▰▰▱▱ 1.2k/4.1k`` coloured by how full the context is (``width`` 0: no bar,
    the count coloured instead)."""
    if limit <= 0:
        return Content(f"ctx {_k(used)}")
    share = min(1.0, used / limit)
    filled = round(share * width)
    style = "$error" if share >= CONTEXT_FULL else "$warning" if share >= CONTEXT_WARN \
        else "$success"
    if width <= 0:
        return Content.assemble("ctx ", (f"{_k(used)}/{_k(limit)}", style))
    bar = "▰" * filled + "▱" * (width - filled)
    return Content.assemble("ctx ", (bar, style), f" {_k(used)}/{_k(limit)}")


def _k(n: int) -> str:
    return f"{n / 1000:.1f}k" if n >= 1000 else str(n)


SEPARATOR = " · "


def fit_items(text: str, width: int) -> str:
    """``text``'s " · "-separated items that fit in ``width`` cells, then " …" where some
    were left out: cut between items, never inside one (the settings read "max 51…" where
    max_tokens was 512)."""
    if Content(text).cell_length <= width:
        return text
    items = text.split(SEPARATOR)
    for n in range(len(items) - 1, 0, -1):
        shown = SEPARATOR.join(items[:n]) + " …"
        if Content(shown).cell_length <= width:
            return shown
    return "…" if width >= 1 else ""


class ItemsLine(Static):
    """One line of " · "-separated items fitted to its width by :func:`fit_items`."""

    text: reactive[str] = reactive("", layout=True)

    def render(self) -> Content:
        return Content(fit_items(self.text, self.content_region.width))


class StatusBar(Horizontal):
    """One line: model · device · precision | settings | context meter | speed.

    The screen sets the reactives; each piece redraws itself.
    """

    DEFAULT_CSS = """
    StatusBar { height: 1; background: $panel; color: $text; }
    StatusBar > Static { width: auto; padding: 0 1; text-wrap: nowrap; }
    StatusBar > #status-settings { width: 1fr; color: $text-muted; }
    StatusBar > #status-model { color: $primary; text-style: bold; text-overflow: ellipsis; }
    StatusBar > #status-context, StatusBar > #status-speed { min-width: 8; }
    """
    """The model and the settings give way (ellipsis) before the context meter and the
    speed, which always show: at 70 columns the meter was pushed off the line. The model's
    60% is cut further where the meter and the speed need it (``_fit``): at 60 columns the
    speed lost its last characters ("115.3 to")."""

    model: reactive[str] = reactive("loading…")
    settings: reactive[str] = reactive("")
    context_used: reactive[int] = reactive(0)
    context_limit: reactive[int] = reactive(0)
    speed: reactive[str] = reactive("")

    def compose(self) -> ComposeResult:
        yield Static(id="status-model")
        yield ItemsLine(id="status-settings")
        yield Static(id="status-context")
        yield Static(id="status-speed")

    def watch_model(self, value: str) -> None:
        field = self.query_one("#status-model", Static)
        field.update(Content(value))
        field.tooltip = value  # the whole text, where the line cuts it short

    def watch_settings(self, value: str) -> None:
        field = self.query_one("#status-settings", ItemsLine)
        field.text = value
        field.tooltip = value
        self._fit()

    def _meter(self) -> None:
        bar = 0 if self.size.width and self.size.width < NARROW else 10
        meter = context_meter(self.context_used, self.context_limit, bar)
        self._meter_cells = meter.cell_length
        self.query_one("#status-context", Static).update(meter)
        self._fit()

    _meter_cells = 0

    SETTINGS_CELLS = 22
    """What the settings keep of the line before the model's name gives way ("temp 0.7 · max
    512 …" whole, with its padding): at 80 columns the name's "int8 weigh…" left them
    "tem…"."""

    def _fit(self) -> None:
        """At most what the line leaves the model once the meter, the speed (each at least 8
        cells with their padding) and the settings (up to ``SETTINGS_CELLS`` with their
        padding) have theirs, and at most 60%."""
        width = self.size.width
        if not width:
            return
        taken = max(8, self._meter_cells + 2) + max(8, Content(self.speed).cell_length + 2) \
            + min(self.SETTINGS_CELLS, Content(self.settings).cell_length + 2)
        room = max(4, min(width * 6 // 10, width - taken))
        self.query_one("#status-model", Static).styles.max_width = room

    def on_resize(self) -> None:
        self._meter()

    def watch_context_used(self) -> None:
        self._meter()

    def watch_context_limit(self) -> None:
        self._meter()

    def watch_speed(self, value: str) -> None:
        self.query_one("#status-speed", Static).update(Content(value))
        self._fit()

    @property
    def context_share(self) -> float:
        return self.context_used / self.context_limit if self.context_limit else 0.0


class LoadingPanel(Vertical):
    """Shown while the model loads: the stage and a progress bar."""

    DEFAULT_CSS = """
    LoadingPanel { height: auto; padding: 0 1; background: $surface; }
    LoadingPanel > #loading-stage { color: $text-muted; }
    """

    def compose(self) -> ComposeResult:
        yield Static(Content("Loading the model…"), id="loading-stage")
        yield ProgressBar(total=None, show_eta=False, id="loading-bar")

    def progress(self, stage: str, done: float, total: float | None) -> None:
        """Show a Progress event."""
        self.query_one("#loading-stage", Static).update(Content(f"Loading the model: {stage}"))
        bar = self.query_one(ProgressBar)
        bar.update(total=total, progress=done)
