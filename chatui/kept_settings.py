"""The sampling settings ``/set`` chose, kept for the next chat with the same model.

Every session began from the model's defaults again: a user who works at temperature 0.3 and
500 tokens typed ``/set temp 0.3 max 500`` each time (peers keep them too: LM Studio per model,
llama.cpp's web UI in the browser). Each model (its weights' hash, or a server's model name)
keeps the fields ``/set`` changed to something other than the model's own default, in
``kept-settings.json`` in the config directory, next to the remembered theme. The next chat with
that model starts from them, with the command line's flags on top (a flag is for one session and
is not kept); the chat says so when it starts, and ``/set reset`` goes back to the model's
defaults and forgets them. The file is read when it is needed (small), never cached: it is the
one owner of what is kept. Pure logic and small file IO, no Textual import.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping

from inference.settings import SamplingParams, SettingsError
from inference.types import ModelInfo

from .config import read_json_file, write_json_file

log = logging.getLogger(__name__)

KEPT_FILE = "kept-settings.json"
RESET_WORDS = ("reset", "default", "defaults")
"""``/set reset`` (or these): the model's defaults, and nothing kept."""


def model_key(info: ModelInfo) -> str:
    """Which model settings are kept for: its backend and its weights' hash (the same weights
    under another path or name are the same model), or its name where there is no hash."""
    return f"{info.backend}:{info.weights_hash or info.name}"


def kept_values(config_dir: Path, key: str) -> dict[str, Any]:
    """The settings kept for model ``key`` (``SamplingParams.to_dict`` names and values);
    empty when none are, or the file is missing or unreadable (logged)."""
    data = read_json_file(config_dir / KEPT_FILE)
    values = data.get(key) if isinstance(data, dict) else None
    return dict(values) if isinstance(values, dict) else {}


def with_kept(base: SamplingParams, values: Mapping[str, Any]) -> SamplingParams:
    """``base`` with the kept ``values``; ``base`` itself when they do not apply (a file edited
    by hand, a setting renamed: logged, and the chat starts as if nothing were kept)."""
    try:
        return base.with_values(**dict(values)) if values else base
    except (SettingsError, TypeError) as exc:
        log.warning("ignoring kept settings %s: %s", dict(values), exc)
        return base


def kept_after(values: Mapping[str, Any], old: SamplingParams, new: SamplingParams,
               defaults: SamplingParams) -> dict[str, Any]:
    """What is kept once ``/set`` has changed ``old`` into ``new``: the fields it changed join
    ``values``, and a field back at the model's default is kept no more."""
    before, after, default = old.to_dict(), new.to_dict(), defaults.to_dict()
    kept = {**values, **{k: v for k, v in after.items() if before.get(k) != v}}
    return {k: v for k, v in kept.items() if default.get(k) != v}


def keep(config_dir: Path, key: str,
         update: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Replace what is kept for model ``key`` with ``update`` of it (nothing: the model's
    entry goes), the file read once; atomic, and a failure is logged, not raised (the
    settings still apply in this session)."""
    path = config_dir / KEPT_FILE
    data = read_json_file(path)
    data = dict(data) if isinstance(data, dict) else {}
    before = data.get(key)
    values = update(dict(before) if isinstance(before, dict) else {})
    if values:
        data[key] = values
    elif key in data:
        del data[key]
    else:
        return
    try:
        write_json_file(path, data)
    except OSError as exc:
        log.warning("could not keep the settings %s: %s", values, exc)
