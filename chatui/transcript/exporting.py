"""The export entry point: a conversation written as Markdown or role/content messages, to a
file named after its autosave. The formats themselves are :mod:`chatui.export`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..conversation import Conversation, walk
from ..export import conversation_line, export_markdown, export_messages
from .history import _base_name
from .schema import TranscriptError
from .store import atomic_write

EXPORT_FORMATS = {"md": ".md", "markdown": ".md", "messages": ".messages.json"}

EXPORT_READ_LIMIT = 64 * 2**20
"""A file larger than this at an export's path is taken for no export without reading it (a
film or a disk image given by mistake is not read into memory to be kept)."""


def export_to_file(conv: Conversation, fmt: str, path: Path | None = None, *,
                   directory: Path | None = None, all_branches: bool = False,
                   keep_others: bool = False) -> Path:
    """Write ``conv`` as ``fmt`` ("md" or "messages") and return the path written.

    With no ``path`` (or a directory as ``path``) the file is named after the conversation's
    autosave name, e.g. ``2026-11-22_0315_first-words_<id>.md``, in ``directory`` (default:
    the current directory). The write is atomic. ``all_branches`` (Markdown only) adds every
    branch of the tree after the chosen path. ``keep_others`` (the chat's ``/export``): a
    file already at an explicit ``path`` is replaced only if it is an export of this
    conversation (:func:`is_export_of`); "/export md notes.md" replaced a person's own
    notes before.

    Raises:
        TranscriptError: an unknown format, a file that ``keep_others`` keeps, or the file
            could not be written.
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
        path = base / f"{_base_name(conv)}{EXPORT_FORMATS[key]}"  # (named by its id)
    elif keep_others and os.path.lexists(path) and not is_export_of(conv, path):
        raise TranscriptError(f"Could not export to {path}: a file that is not an export of "
                              "this conversation is there; nothing was written, choose "
                              "another name.")
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


def is_export_of(conv: Conversation, path: Path) -> bool:
    """Whether the file at ``path`` is an export of ``conv`` that a new one may replace: its
    Markdown (which names the conversation's id, :func:`chatui.export.export_markdown`), or
    a messages list whose every message is in the conversation (any branch: an export made
    before a retry holds the reply the retry replaced)."""
    try:
        if Path(path).stat().st_size > EXPORT_READ_LIMIT:
            return False
        text = Path(path).read_text("utf-8", errors="replace")
    except OSError:
        return False
    if conversation_line(conv) in text:
        return True
    try:
        data = json.loads(text)
    except ValueError:
        return False
    if not isinstance(data, list):
        return False
    said = {conv.system_prompt} | {
        t for _, e in walk(conv.tops) for t in ([e.text] if e.role == "user"
                                                 else [r.text for r in e.replies])}
    return all(isinstance(m, dict) and m.get("content") in said for m in data)
