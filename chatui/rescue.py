"""Where a conversation goes when its own folder cannot be written as it leaves the screen.

The autosave writes into the conversations' folder; when that fails (the folder is on a full
or read-only disk, a file is in its way, it was removed) quitting, a closed terminal, an
internal error, ``/clear`` and ``/load`` used to go on and the conversation was lost. They now
write it here instead and say where (``chatui --load PATH`` opens it)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from .conversation import Conversation

log = logging.getLogger(__name__)


def rescue_dir() -> Path:
    """``chatui-rescue`` in the system's temporary folder."""
    return Path(tempfile.gettempdir()) / "chatui-rescue"


def write_rescue_copy(conv: Conversation) -> Path | None:
    """``conv`` written to :func:`rescue_dir`; the file, or None where that failed too or
    there is nothing to keep (never raises: the caller says so)."""
    from . import transcript

    if not conv.entries:
        return None
    try:
        directory = rescue_dir()
        directory.mkdir(parents=True, exist_ok=True)
        path = transcript.autosave_path(conv, directory)
        transcript.save_transcript(conv, path)
    except Exception:  # noqa: BLE001 - any failure: the conversation is not saved here either
        log.exception("the rescue copy could not be written")
        return None
    log.info("the conversation was saved to %s instead", path)
    return path
