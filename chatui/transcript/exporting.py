"""The export entry point: a conversation written as Markdown or role/content messages, to a
file named after its autosave. The formats themselves are :mod:`chatui.export`.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..conversation import Conversation
from ..export import export_markdown, export_messages
from .history import _base_name
from .schema import TranscriptError
from .store import atomic_write

EXPORT_FORMATS = {"md": ".md", "markdown": ".md", "messages": ".messages.json"}


def export_to_file(conv: Conversation, fmt: str, path: Path | None = None, *,
                   directory: Path | None = None, all_branches: bool = False) -> Path:
    """Write ``conv`` as ``fmt`` ("md" or "messages") and return the path written.

    With no ``path`` (or a directory as ``path``) the file is named after the conversation's
    autosave name, e.g. ``2026-11-22_0315_first-words_<id>.md``, in ``directory`` (default:
    the current directory). The write is atomic. ``all_branches`` (Markdown only) adds every
    branch of the tree after the chosen path.

    Raises:
        TranscriptError: an unknown format, or the file could not be written.
    """
    key = fmt.strip().lower()
    if key not in EXPORT_FORMATS:
        raise TranscriptError(f"Could not export: unknown format {fmt!r}; use md or messages.")
    if all_branches and EXPORT_FORMATS[key] != ".md":
        raise TranscriptError("Could not export: --all writes every branch as Markdown only "
                              "(messages are one conversation); use md.")
    if path is not None:
        path = Path(path).expanduser()
    if path is None or path.is_dir():
        base = path if path is not None else (Path(directory) if directory else Path.cwd())
        path = base / f"{_base_name(conv)}{EXPORT_FORMATS[key]}"
    if EXPORT_FORMATS[key] == ".md":
        data = export_markdown(conv, all_branches=all_branches).encode(
            "utf-8", "backslashreplace")
    else:
        text = json.dumps(export_messages(conv), ensure_ascii=False, indent=2) + "\n"
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = (json.dumps(export_messages(conv), indent=2) + "\n").encode("ascii")
    atomic_write(path, data, verb="export to")
    return path
