"""Transcript files: atomic writes, and reads that never crash.

Writing never leaves a half-written file: the document goes to a temporary file in the same
directory, is flushed and fsynced, then renamed over the old one (and the directory is
fsynced). Reading never crashes: any problem becomes a :class:`TranscriptError` whose text is
one sentence naming the file and what is wrong with it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..conversation import Conversation
from .identity import tree_holds
from .journal import journal_path, replay_counted
from .reader import _Bad, _parse, from_json_dict
from .schema import TranscriptError, to_json_dict

MAX_BYTES = 64 * 1024 * 1024
"""Transcripts larger than this are refused on load (and on save)."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(directory: Path) -> None:
    if sys.platform == "win32":
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


def _os_problem(e: OSError) -> str:
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return "the disk is full"
    if e.errno == errno.EFBIG:
        return "the file would be larger than this system allows"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.EROFS:
        return "the file system is read-only"
    if e.errno == errno.EISDIR:
        return "it is a directory"
    if e.errno == errno.ENOENT:
        return "no such file or directory"
    return e.strerror or str(e)


def atomic_write(path: Path, data: bytes, *, verb: str = "save") -> None:
    """Replace ``path`` with ``data`` so that it holds either the old or the new bytes,
    never a mix, whatever happens (crash, kill, full disk).

    A temporary file in the same directory is written, flushed, fsynced and renamed over
    ``path``; then the directory is fsynced. An existing file keeps its permissions; a new
    one is private to the user (0600).

    Raises:
        TranscriptError: "Could not save PATH: the disk is full; ..." and the like.
    """
    path = Path(path)
    existed = path.exists()
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if existed:
            try:
                os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
            except OSError:
                pass
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        kept = "the previous file is unchanged" if existed else "nothing was written"
        raise TranscriptError(f"Could not {verb} {path}: {_os_problem(e)}; {kept}.") from e
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    _fsync_dir(path.parent)


def _encode(doc: Any) -> bytes:
    try:
        text = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as e:  # NaN or inf slipped through
        raise TranscriptError(f"Could not encode the transcript: {e}.") from e
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate in some text: \u-escape everything so it still round-trips.
        return json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def save_transcript(conv: Conversation, path: Path) -> None:
    """Write ``conv`` to ``path`` atomically (see :func:`atomic_write`), unless that would
    lose something: a file already at ``path`` is replaced only by a document that holds
    every message it holds (an older or another conversation's transcript, or a file that is
    no transcript at all, is left alone and the error says so).

    The document is checked as it would be on load first, so every file written loads back.
    A journal beside ``path`` is removed afterwards (the document holds all of it).

    Raises:
        TranscriptError: the file at ``path`` holds what ``conv`` lacks, the conversation
            holds a value a transcript cannot (nothing is written), or the file could not be
            written (the old file is intact).
    """
    path = Path(path)
    data = _document(conv, path, None)
    if os.path.lexists(path):
        try:
            old = load_transcript(path)
        except TranscriptError:
            if path.is_dir():
                raise TranscriptError(f"Could not save {path}: it is a directory.") from None
            raise TranscriptError(f"Could not save {path}: a file that is not a chatui "
                                  f"transcript is there; nothing was written.") from None
        if not tree_holds(conv, old):
            raise TranscriptError(f"Could not save {path}: it holds messages this "
                                  f"conversation does not (another or a later version of it); "
                                  f"nothing was written, choose another name.")
    atomic_write(path, data)
    remove_journal(path)


def write_document(conv: Conversation, path: Path, *, rev: str | None = None) -> int:
    """Write ``conv`` to ``path`` atomically, whatever is there; return the bytes written.

    The document is checked as it would be on load first; a journal beside ``path`` is
    removed afterwards. ``rev``, if given, is written into the document for a new journal to
    name as its base (see :class:`~chatui.transcript.writer.AutosaveWriter`).

    Raises:
        TranscriptError: as :func:`save_transcript`, except that nothing at ``path`` is
            protected: callers check that first (:func:`~chatui.transcript.history.claim`).
    """
    path = Path(path)
    data = _document(conv, path, rev)
    atomic_write(path, data)
    remove_journal(path)
    return len(data)


def _document(conv: Conversation, path: Path, rev: str | None) -> bytes:
    """The checked, encoded document for ``conv`` (raises TranscriptError naming ``path``)."""
    doc = to_json_dict(conv)
    if rev is not None:
        doc["rev"] = rev
    try:
        _parse(doc)
    except _Bad as e:
        raise TranscriptError(f"Could not save {path}: the conversation is invalid ({e}); "
                              f"nothing was written.") from None
    data = _encode(doc)
    if len(data) > MAX_BYTES:
        raise TranscriptError(f"Could not save {path}: the transcript would be "
                              f"{_human(len(data))}, more than the {_human(MAX_BYTES)} a "
                              f"transcript may have; nothing was written.")
    return data


Stamp = tuple[tuple[int, int, int], tuple[int, int, int] | None]


def file_stamp(path: Path) -> Stamp | None:
    """What tells one state of a document (and its journal) from another without reading
    them: inode, mtime and size of each (every save renames a new document into place, so the
    inode changes even within one mtime tick). None when the document is missing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    try:
        js = os.stat(journal_path(path))
        jkey: tuple[int, int, int] | None = (js.st_ino, js.st_mtime_ns, js.st_size)
    except OSError:
        jkey = None
    return (st.st_ino, st.st_mtime_ns, st.st_size), jkey


def remove_journal(path: Path) -> None:
    """Remove the journal beside ``path``, if any (a leftover one would be ignored anyway:
    its base no longer matches the document)."""
    try:
        os.unlink(journal_path(path))
    except FileNotFoundError:
        pass
    except OSError as e:
        raise TranscriptError(f"Could not save {path}: {_os_problem(e)} (removing its "
                              f"journal); the document is saved.") from None


def _human(n: int) -> str:
    if n < 2**20:
        return f"{n} bytes" if n < 2**10 else f"{n / 2**10:.0f} KiB"
    return f"{n / 2**20:.1f} MiB".replace(".0 MiB", " MiB")


def _read_json(path: Path) -> Any:
    def fail(problem: str) -> TranscriptError:
        return TranscriptError(f"Could not load {path}: {problem}.")

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise fail(f"it is {_human(size)}, more than the {_human(MAX_BYTES)} a "
                           f"transcript may have")
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise fail(_os_problem(e)) from None
    if len(raw) > MAX_BYTES:
        raise fail(f"it is more than the {_human(MAX_BYTES)} a transcript may have")
    if not raw.strip():
        raise fail("the file is empty")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise fail(f"it is not UTF-8 text (bad byte at offset {e.start})") from None

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not allowed")

    try:
        return json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            raise fail("it is cut off (the JSON ends before the document does); it may be "
                       "truncated") from None
        if text.lstrip().startswith("#"):  # `/export md` writes a Markdown title first
            raise fail("it is Markdown, not a transcript (an export in Markdown does not load "
                       "back: load the conversation's .json file, or its `/export messages`)"
                       ) from None
        raise fail(f"it is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise fail("it is nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, or an integer with thousands of digits
        raise fail(f"it holds a number that is not allowed ({e})") from None


def load_transcript(path: Path) -> Conversation:
    """Read, migrate and validate the transcript at ``path``.

    Raises:
        TranscriptError: one sentence naming the file and the problem (missing, too big, not
            JSON, truncated, from a newer chatui, invalid field...).

    The changes in a journal beside the file (an autosave's) are applied; see
    :mod:`.journal`.
    """
    return load_with_document(path).conv


@dataclass
class Loaded:
    """A transcript as read from disk."""

    data: Any
    """The JSON document."""
    conv: Conversation
    """Its conversation, with the journal applied."""
    journal_bytes: int
    """How many bytes of the journal were applied (0: none)."""
    stamp: Stamp | None
    """The files' :func:`file_stamp`, taken before reading them (so a change during the read
    shows as a different stamp later, never as the same one)."""


def load_with_document(path: Path) -> Loaded:
    """The JSON document at ``path`` and its conversation, with the journal beside it
    (if any) applied (see :func:`load_transcript`)."""
    path = Path(path)
    stamp = file_stamp(path)
    data = _read_json(path)
    conv = from_json_dict(data, source=str(path))
    if not isinstance(data, dict):  # (a list of role/content messages: no journal)
        return Loaded(data, conv, 0, stamp)
    return Loaded(data, conv, replay_counted(conv, data.get("rev"), path), stamp)
