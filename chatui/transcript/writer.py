"""Autosaving a conversation again and again at a cost that does not grow with it.

:class:`AutosaveWriter` writes a new conversation's document in full, and after that appends
only what changed to the journal beside it (:mod:`.journal`): one fsynced line, planned by
:func:`.journal.plan` and checked against the tree the files hold before it is written: the
path's messages from the first one that differs, after a ``select`` when another branch was
chosen. Its cost does not grow with the conversation's tokens (snapshots share unchanged
replies' token columns, so comparing a message reads none of them) and grows with its
messages by about 2.5 microseconds each (~1 ms after 200 replies; measured with
``python -m chatui.transcript.bench`` and ``benchmarks/bench_long.py``). It remembers what the files hold and their stamps, so it
reads them back only for a conversation it has not written or been handed
(:meth:`AutosaveWriter.adopt`) in this session, or when something else changed them; it then
goes on with their journal (a torn end cut off) rather than rewriting the document. The
document is written again (folding the journal in) only when most of the journal is
superseded, or when :meth:`AutosaveWriter.compact` finds it small.

Before any write it checks that nothing on disk is lost (:mod:`.identity`): if the file holds
messages the new snapshot lacks, the snapshot is written as a branch under a new id instead,
and :meth:`AutosaveWriter.write` returns that branch so that the caller can follow it.

One writer belongs to one thread (the autosaver's); it is not thread-safe.
"""

from __future__ import annotations

import json
import os
import uuid
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..conversation import Conversation
from .history import _remove_stale_temps, autosave_path, claim
from .identity import branch, first_unheld, tree_holds
from .journal import Change, Skeleton, header, journal_path, plan
from .reader import _Bad, _entry
from .schema import TranscriptError, entry_json, model_json, parent_json
from .store import (
    MAX_BYTES, Loaded, Stamp, _fsync_dir, _os_problem, file_stamp, load_with_document,
    write_document,
)

COMPACT_SLACK = 8 * 1024 * 1024
"""A journal is folded into its document when more than this many of its bytes, and more than
half of all, hold messages written again since. Each message is journaled about twice (an
empty reply when it starts, the whole one when it ends), so this happens only after many
rewrites of long messages; a fold costs ~0.7 s of CPU after 200 replies."""

COMPACT_ON_FLUSH = 2 * 1024 * 1024
""":meth:`AutosaveWriter.compact` folds journals whose files together are at most this big
(tens of milliseconds); bigger ones wait for the next session's first save, so quitting
stays instant."""


@dataclass
class _Written:
    """What one autosave file (and its journal) holds, as this writer last wrote or read it."""

    path: Path
    conv: Conversation
    """The snapshot the files hold now."""
    stamp: Stamp | None
    rev: str | None
    """The document's rev (None: it has none, so the next change rewrites it in full)."""
    doc_bytes: int
    journal_bytes: int = 0
    """0: no journal yet (the next change starts one with its header)."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Bytes of the journal holding each message's latest version, by node id (absent: in
    the document)."""
    dead_bytes: int = 0
    """Journal bytes holding versions of messages written again since."""
    owner: weakref.ref[Conversation] | None = None
    """The live conversation saved here: once it is gone, so is this record (and the
    snapshot it keeps alive)."""
    skeleton: Skeleton | None = None
    """``conv``'s :class:`~.journal.Skeleton`, once a save has built it (the next save
    compares its snapshot with it without walking ``conv`` again)."""

    @property
    def wasteful(self) -> bool:
        """More than half of what a load reads is superseded, and by more than
        :data:`COMPACT_SLACK`: time to write the document again."""
        return (self.dead_bytes > COMPACT_SLACK
                and self.dead_bytes > self.doc_bytes + sum(self.sizes.values()))


def _encode_line(obj: object) -> bytes:
    try:
        return (json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
                + "\n").encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: \\u-escape everything
        return (json.dumps(obj, allow_nan=False, separators=(",", ":")) + "\n").encode("ascii")


_UNREADABLE_FILE: Any = object()


def _id_in(path: Path) -> str:
    """The conversation id an autosave file is named after (``date_time_slug_id.json``)."""
    return path.stem.split("_", 3)[-1]


class AutosaveWriter:
    """Writes successive snapshots of conversations to their autosave files."""

    def __init__(self) -> None:
        self._written: dict[tuple[str, Path | None], _Written] = {}

    def write(self, conv: Conversation, directory: Path | None,
              owner: Conversation | None = None) -> Conversation:
        """Save the snapshot ``conv`` to its autosave file in ``directory``; return what was
        written: ``conv``, or a branch of it (another id) when its file holds messages
        ``conv`` lacks. ``conv`` must not change afterwards (pass a snapshot). ``owner``, the
        live conversation ``conv`` is a snapshot of, lets the writer forget the conversation
        once it is gone (a weak reference).

        The first write of a conversation reads its file back once (to check it, and to go on
        with its journal); after that only what changed is written.

        Raises:
            TranscriptError: the snapshot is invalid or a file could not be written; the files
                are as they were (a failed journal line is cut off again).
        """
        self._prune()
        key = (conv.id, directory)
        rec = self._written.get(key)
        if rec is not None and file_stamp(rec.path) != rec.stamp:
            del self._written[key]  # changed behind our back (deleted, /save, another process)
            rec = None
        if rec is None:
            path = autosave_path(conv, directory)
            rec = self._read(path)
            if rec is _UNREADABLE_FILE:
                return self._write_branch(conv, 0, directory, owner)
        change = None
        if rec is not None:
            if not conv.deleted - rec.conv.deleted:  # a delete drops messages: in full
                change = plan(rec.conv, conv, rec.skeleton)
            if change is None and not tree_holds(conv, rec.conv):
                at = first_unheld(conv.entries, rec.conv.entries)
                return self._write_branch(conv, at, directory, owner)
        if not conv.entries:
            return conv
        if rec is None or rec.rev is None or rec.wasteful or change is None:
            self._write_full(key, conv, path if rec is None else rec.path)
        else:
            self._written[key] = rec
            self._append(key, rec, conv, *change)
        if owner is not None:
            self._written[key].owner = weakref.ref(owner)
        return conv

    def _prune(self) -> None:
        for key, rec in list(self._written.items()):
            if rec.owner is not None and rec.owner() is None:
                del self._written[key]

    def _read(self, path: Path) -> _Written | None:
        """What the files at ``path`` hold (None: nothing; ``_UNREADABLE_FILE``: a file that
        cannot be read, never to be written over). A journal with a cut or bad end is cut back
        to what loads, so that new lines follow it."""
        if file_stamp(path) is None:
            return None
        try:
            loaded = load_with_document(path)
        except TranscriptError:
            return _UNREADABLE_FILE
        return self._record(path, loaded)

    def adopt(self, path: Path, directory: Path | None, loaded: Loaded,
              owner: Conversation | None = None) -> None:
        """Take ``loaded`` (just read from the autosave file ``path``) as what the files
        hold, so that the next write of that conversation appends without reading them.
        Call it while no write runs (the autosaver holds its lock)."""
        rec = self._record(path, loaded)
        if rec is not None and rec is not _UNREADABLE_FILE:
            rec.owner = weakref.ref(owner) if owner is not None else None
            rec.conv = loaded.conv.snapshot()
            rec.skeleton = None
            self._written[(loaded.conv.id, directory)] = rec

    def _record(self, path: Path, loaded: Loaded) -> Any:
        stamp = loaded.stamp
        if stamp is None:
            return None
        rev = loaded.data.get("rev") if isinstance(loaded.data, dict) else None
        rev = rev if isinstance(rev, str) and loaded.conv.id == _id_in(path) else None
        used = loaded.journal_bytes
        if rev is not None and stamp[1] is not None and used != stamp[1][2]:
            try:
                os.truncate(journal_path(path), used)  # 0 when it is stale: started afresh
            except OSError:
                rev = None  # write the document in full instead
            stamp = file_stamp(path)
            if stamp is None:
                return None
        return _Written(path, loaded.conv, stamp, rev, stamp[0][2], used)

    def compact(self, limit: int = COMPACT_ON_FLUSH) -> None:
        """Fold every journal this writer keeps into its document, when both together are at
        most ``limit`` bytes (before quitting, ``/save``, ``/history``, ``/load``)."""
        for key, rec in list(self._written.items()):
            if 0 < rec.journal_bytes and rec.doc_bytes + rec.journal_bytes <= limit \
                    and rec.path.exists() and file_stamp(rec.path) == rec.stamp:
                self._write_full(key, rec.conv, rec.path)

    # ---- internals ----

    def _write_branch(self, conv: Conversation, at: int, directory: Path | None,
                      owner: Conversation | None = None) -> Conversation:
        target = claim(branch(conv, at), directory)
        self.write(target, directory, owner)
        return target

    def _write_full(self, key: tuple[str, Path | None], conv: Conversation, path: Path) -> None:
        rev = uuid.uuid4().hex[:12]
        self._written.pop(key, None)
        size = write_document(conv, path, rev=rev)
        self._written[key] = _Written(path, conv, file_stamp(path), rev, size)
        _remove_stale_temps(path.parent)

    def _append(self, key: tuple[str, Path | None], rec: _Written, conv: Conversation,
                change: Change, skeleton: Skeleton) -> None:
        old = rec.conv
        line: dict[str, object] = {}
        if change.select is not None:
            line["select"] = change.select
        if conv.title != old.title:
            line["title"] = conv.title
        if conv.system_prompt != old.system_prompt:
            line["system_prompt"] = conv.system_prompt
        if conv.model != old.model:
            line["model"] = model_json(conv.model)
        if (conv.parent, conv.branched_at) != (old.parent, old.branched_at) and conv.parent:
            line["parent"] = parent_json(conv)
        if change.chosen:
            line["chosen"] = dict(change.chosen)
        if not line and change.same:
            rec.conv, rec.skeleton = conv, skeleton
            return  # nothing changed
        messages = [entry_json(e, pos) for e, pos in zip(change.entries, change.positions)]
        at = change.at
        try:
            for i, m in enumerate(messages):  # checked as a load will check them
                _entry(m, f"messages[{at + i}]")
        except _Bad as e:
            raise TranscriptError(f"Could not save {rec.path}: the conversation is invalid "
                                  f"({e}); nothing was written.") from None
        data = _encode_line({"at": at, "messages": messages, **line})
        start = rec.journal_bytes
        if start == 0:
            data = _encode_line(header(conv.id, rec.rev)) + data
        if start + len(data) > MAX_BYTES:
            self._write_full(key, conv, rec.path)
            return
        jpath = journal_path(rec.path)
        try:
            flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if start == 0 else os.O_APPEND)
            fd = os.open(jpath, flags, 0o600)
        except OSError as e:
            raise TranscriptError(f"Could not save {rec.path}: {_os_problem(e)} (appending to "
                                  f"its journal); the saved conversation is unchanged.") from e
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as e:
                try:  # cut the partial line off, so the next one does not glue onto it
                    os.ftruncate(fd, start)
                except OSError:
                    pass
                self._written.pop(key, None)  # the next save reads the files back
                raise TranscriptError(f"Could not save {rec.path}: {_os_problem(e)}; the saved "
                                      f"conversation is unchanged.") from e
        finally:
            os.close(fd)
        if start == 0:
            _fsync_dir(jpath.parent)
        rec.conv, rec.skeleton = conv, skeleton
        rec.journal_bytes = start + len(data)
        rec.stamp = file_stamp(rec.path)
        per = len(data) // max(len(messages), 1)
        for e in change.entries:  # an earlier version of the same message is superseded
            rec.dead_bytes += rec.sizes.pop(e.node, 0)
            rec.sizes[e.node] = per
