"""The app's configuration (one typed object, built once by the CLI and passed in) and the
small remembered-settings file (the chosen theme) in the user config directory.

``CHATUI_CONFIG_DIR`` overrides where the settings file lives (tests point it at a temporary
folder so they never touch the real one).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from inference.settings import SamplingParams

log = logging.getLogger(__name__)

CONFIG_DIR_ENV = "CHATUI_CONFIG_DIR"
"""Environment variable that overrides the config directory (remembered theme)."""


def default_config_dir() -> Path:
    """Where the remembered settings live: ``$CHATUI_CONFIG_DIR`` or the user config dir."""
    env = os.environ.get(CONFIG_DIR_ENV)
    if env:
        return Path(env)
    from platformdirs import user_config_dir

    return Path(user_config_dir("chatui"))


def default_data_dir() -> Path:
    """Where logs (and transcripts) go by default."""
    from platformdirs import user_data_dir

    return Path(user_data_dir("chatui"))


@dataclass(frozen=True)
class AppConfig:
    """Everything the chat app needs to know besides the backend factory."""

    theme: str | None = None
    """Theme to start with; None means the remembered one (or chatui-dark)."""
    top_logprobs: int = 5
    """Alternatives the engine reports per token (0-20) for the token view."""
    settings: SamplingParams | None = None
    """Sampling settings to start with; None means the model's own defaults."""
    settings_overrides: Mapping[str, Any] = field(default_factory=dict)
    """Settings given on the command line (user names, e.g. ``{"temperature": 0.2}``), applied
    on top of the model's defaults (or of ``settings``) once the model has loaded."""
    system_prompt: str = ""
    """System prompt of a new conversation."""
    log_file: Path | None = None
    """Where ``run_chat`` writes logs; None means ``<data_dir>/chatui.log``."""
    data_dir: Path | None = None
    """Folder for logs, with transcripts in its ``conversations`` subfolder; None means the
    platform's user data dir (transcripts then honour ``$CHATUI_DATA_DIR``)."""
    config_dir: Path | None = None
    """Folder of the remembered-settings file; None means :func:`default_config_dir`."""
    load_path: Path | None = None
    """A saved transcript to open at start."""
    autosave: bool = True
    """Save the conversation after every message (once transcripts are available)."""
    token_view: bool = False
    """Start with replies shown as tokens on the heat scale instead of Markdown."""
    raw_mode: bool = False
    """Open raw mode's notebook (``chatui --raw``) over the chat."""
    stable_timings: bool = False
    """Show fixed timings (tokens/s, time to first token) so screenshots are reproducible."""

    def resolved_config_dir(self) -> Path:
        return self.config_dir or default_config_dir()

    def resolved_data_dir(self) -> Path:
        return self.data_dir or default_data_dir()

    def transcripts_dir(self) -> Path | None:
        """Where autosaves go; None means the transcript module's default."""
        return self.data_dir / "conversations" if self.data_dir else None

    def prompt_history_dir(self) -> Path | None:
        """Where the prompt box's history is kept (beside the conversations: see
        :mod:`chatui.prompt_history`); None when nothing is autosaved."""
        if not self.autosave:
            return None
        from .transcript import data_dir

        return self.transcripts_dir() or data_dir()

    def resolved_log_file(self) -> Path:
        return self.log_file or self.resolved_data_dir() / "chatui.log"


SETTINGS_FILE = "settings.json"


def read_json_file(path: Path) -> object:
    """A small JSON file of ours, or None when it is missing or unreadable (logged)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None


def write_json_file(path: Path, data: object) -> None:
    """Write a small JSON file atomically (temporary file, fsync, rename); raises OSError."""
    from .transcript import TranscriptError, atomic_write

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(path, json.dumps(data, indent=2).encode("utf-8"))
    except TranscriptError as exc:
        raise OSError(str(exc)) from None


def load_remembered(config_dir: Path) -> dict:
    """The remembered settings (``{"theme": ...}``); empty if missing or unreadable."""
    data = read_json_file(config_dir / SETTINGS_FILE)
    return data if isinstance(data, dict) else {}


def remember(config_dir: Path, **values: object) -> None:
    """Merge ``values`` into the settings file (atomic write; errors are logged, not raised)."""
    try:
        data = load_remembered(config_dir)
        data.update(values)
        write_json_file(config_dir / SETTINGS_FILE, data)
    except OSError as exc:
        log.warning("could not remember %s: %s", values, exc)
