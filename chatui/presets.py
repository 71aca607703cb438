"""Compare presets: the ``/compare`` argument syntax and named presets saved in the config dir.

A comparison is 2 to :data:`MAX_COLUMNS` columns of sampling settings, written the way
``/compare`` takes them: ``temperature=0 | temperature=0.7 top_p=0.9 | temperature=1.2 seed=7``.
Each column is a list of assignments applied on top of the settings in force when the
comparison runs (so ``/set max_tokens 100`` still applies); an empty column or the word
``current`` means the settings in force unchanged.

Presets are stored as those column strings in ``compare-presets.json`` in the config directory,
next to the remembered theme (``settings.json``). Pure logic, no Textual import.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from chatui.config import read_json_file, write_json_file
from inference.settings import SamplingParams, SettingsError, parse_assignments

log = logging.getLogger(__name__)

MAX_COLUMNS = 6
"""Most settings compared at once (one batched decode of this many rows)."""
PRESETS_FILE = "compare-presets.json"
CURRENT = "current"
"""A column spelled like this (or left empty) uses the settings in force unchanged."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,39}$")


class PresetError(ValueError):
    """A preset name or file is not usable; the message says why and how to fix it."""


def split_columns(text: str) -> list[str]:
    """``"a=1 | b=2"`` -> ``["a=1", "b=2"]`` (whitespace trimmed; empty columns kept)."""
    return [part.strip() for part in text.split("|")]


def parse_column(spec: str, base: SamplingParams) -> SamplingParams:
    """One column's settings on top of ``base`` (``""``/``current`` means ``base``)."""
    spec = spec.strip()
    if not spec or spec.lower() == CURRENT:
        return base
    return parse_assignments(spec, base)


def parse_columns(specs: list[str] | tuple[str, ...],
                  base: SamplingParams) -> tuple[SamplingParams, ...]:
    """Every column's settings on top of ``base``.

    Raises:
        SettingsError: fewer than 2 or more than :data:`MAX_COLUMNS` columns, or a bad value
            (the message names the column).
    """
    if not 2 <= len(specs) <= MAX_COLUMNS:
        raise SettingsError(
            f"a comparison needs 2 to {MAX_COLUMNS} columns separated by '|', e.g. "
            "/compare temperature=0 | temperature=0.7 top_p=0.9; got "
            f"{len(specs)} column{'s' if len(specs) != 1 else ''}")
    out = []
    for i, spec in enumerate(specs, 1):
        try:
            out.append(parse_column(spec, base))
        except SettingsError as exc:
            raise SettingsError(f"column {i} ({spec!r}): {exc}") from None
    return tuple(out)


def looks_like_name(arg: str) -> bool:
    """True when a ``/compare`` argument is a preset name rather than settings."""
    return bool(_NAME.match(arg.strip())) and "=" not in arg and "|" not in arg


def check_name(name: str) -> str:
    """The name, stripped, or :class:`PresetError` saying what a valid name looks like."""
    name = name.strip()
    if not _NAME.match(name) or name.lower() in (CURRENT, "off"):
        raise PresetError(f"{name!r} cannot be a preset name; use letters, digits, '-', '_' "
                          "or '.' (at most 40, not 'off' or 'current'), e.g. fast-vs-creative")
    return name


def presets_path(config_dir: Path) -> Path:
    return config_dir / PRESETS_FILE


def load_presets(config_dir: Path) -> dict[str, tuple[str, ...]]:
    """Saved presets by name; empty when there is no file. A damaged file or entry is
    skipped (and logged), never fatal."""
    path = presets_path(config_dir)
    data = read_json_file(path)
    presets = data.get("presets") if isinstance(data, dict) else None
    if not isinstance(presets, dict):
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for name, columns in presets.items():
        if (isinstance(name, str) and _NAME.match(name) and isinstance(columns, list)
                and 2 <= len(columns) <= MAX_COLUMNS
                and all(isinstance(c, str) for c in columns)):
            out[name] = tuple(columns)
        else:
            log.warning("ignoring bad preset %r in %s", name, path)
    return out


def _write(config_dir: Path, presets: dict[str, tuple[str, ...]]) -> None:
    write_json_file(presets_path(config_dir),
                    {"presets": {k: list(v) for k, v in sorted(presets.items())}})


def save_preset(config_dir: Path, name: str, columns: list[str] | tuple[str, ...]) -> str:
    """Validate and store a preset (replacing one of the same name); returns the name.

    Columns are checked against default settings so a typo is refused when saving, not when
    the preset is used.

    Raises:
        PresetError: bad name, or the file cannot be written.
        SettingsError: bad columns.
    """
    name = check_name(name)
    columns = [c.strip() for c in columns]
    parse_columns(columns, SamplingParams())
    presets = load_presets(config_dir)
    presets[name] = tuple(columns)
    try:
        _write(config_dir, presets)
    except OSError as exc:
        raise PresetError(f"could not save preset {name!r} in {config_dir}: "
                          f"{exc.strerror or exc}") from None
    return name


def delete_preset(config_dir: Path, name: str) -> bool:
    """Remove a preset; False when there was none of that name."""
    presets = load_presets(config_dir)
    if presets.pop(name, None) is None:
        return False
    try:
        _write(config_dir, presets)
    except OSError as exc:
        raise PresetError(f"could not update {presets_path(config_dir)}: "
                          f"{exc.strerror or exc}") from None
    return True
