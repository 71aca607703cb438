"""Transcripts: one versioned JSON document per conversation, saved atomically, loaded back
exactly, and checked field by field on the way in.

The package along its seams:

- :mod:`.schema`: the format (name, version, limits) and the writer, conversation -> JSON.
- :mod:`.reader`: JSON -> conversation, every field checked; older versions migrated.
- :mod:`.token_columns`: a reply's tokens as columns (base64 numbers, joined texts), written
  and checked; :mod:`.limits`: the bounds every value is checked against.
- :mod:`.store`: files: atomic writes, reads that never crash, save and load.
- :mod:`.identity`: what a copy and a branch are; when a save would lose messages.
- :mod:`.history`: the autosave folder, file names, opening a file under the right identity,
  ``/history``'s listing, deleting.
- :mod:`.journal` and :mod:`.writer`: autosaves that append what changed (the app's
  :class:`chatui.autosaver.Autosaver` drives a writer); ``python -m chatui.transcript.bench``
  measures them.
- :mod:`.exporting`: ``/export`` and ``chatui export``'s entry point.

The format is described in the README ("Transcripts"). The public names are re-exported here,
so callers write ``from chatui.transcript import load_transcript``.
"""

from __future__ import annotations

from ..export import export_markdown, export_messages
from .exporting import EXPORT_FORMATS, export_to_file
from .history import (
    TranscriptSummary, autosave, autosave_path, claim, data_dir, delete_transcript,
    list_transcripts, open_transcript, slug,
)
from .reader import from_json_dict
from .schema import FORMAT_NAME, FORMAT_VERSION, TranscriptError, strip_credentials, to_json_dict
from .store import MAX_BYTES, atomic_write, load_transcript, save_transcript

__all__ = [
    "EXPORT_FORMATS", "FORMAT_NAME", "FORMAT_VERSION", "MAX_BYTES", "TranscriptError",
    "TranscriptSummary", "atomic_write", "autosave", "autosave_path", "claim", "data_dir",
    "delete_transcript", "export_markdown", "export_messages", "export_to_file",
    "from_json_dict", "list_transcripts", "load_transcript", "open_transcript",
    "save_transcript", "slug", "strip_credentials", "to_json_dict",
]
