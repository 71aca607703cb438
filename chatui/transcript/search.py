"""Full-text search over every saved conversation, through an index kept beside them.

The JSON transcripts stay the source of truth: the index (SQLite FTS5 from the standard
library, in ``.search-index.sqlite`` inside the transcripts' folder) is a cache of their texts,
brought up to date on every search by comparing each file's stamp (inode, mtime and size of the
document and its journal, as ``/history``'s listing does) with the one it was indexed at. A file
that changed is read again, one that is gone is dropped, and an index that is missing, from
another version of this module or unreadable is rebuilt from the files. Nothing here ever
writes a transcript.

What is indexed: the title, the system prompt, every user message and every reply of every
column (the replies a comparison did not choose too), so a reply that was shown once can be
found again. A search is a list of words, each matching as a prefix ("tok" finds "tokens"),
all of them required, ranked by BM25 with the newest conversation first among equals.

Measured (``python benchmarks/bench_history.py``, 1,000 transcripts of 6 messages of ~120 words
each): see the README's "Finding old conversations" row; an up-to-date search stats the files
and queries the index, a first search after many changes reads those files once.
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..conversation import Conversation, Entry
from ..export import conversation_title
from .history import data_dir, listed_paths
from .journal import journal_path
from .schema import TranscriptError
from .store import Stamp, file_stamp, load_transcript

INDEX_NAME = ".search-index.sqlite"
INDEX_VERSION = 3
"""Bumped when what is indexed changes: an index of another version is rebuilt."""
BETWEEN = "\n\x1e\n"
"""Between two messages of one column (a record separator, which the tokenizer skips): a
snippet shows it as " · ", where two replies' texts ran together ('"Paris". The answer…')."""
_WORD = re.compile(r"\w+", re.UNICODE)
KINDS = ("title", "system", "user", "reply")
"""The texts of a conversation, one column each in one row per conversation (so every word
of a search may match in a different message)."""


@dataclass(frozen=True)
class SearchHit:
    """One conversation that matches, with where and how."""

    path: Path
    id: str
    title: str
    updated: float
    """mtime of the document or its journal, whichever is newer."""
    messages: int
    snippet: str
    """The best matching passage, the matched words between ``[`` and ``]``."""
    where: str
    """Which text matched: "title", "system", "user" or "reply"."""


def fts_query(text: str) -> str:
    """The user's words as an FTS5 query: each word a quoted prefix term, all required (so
    quotes, operators and parentheses typed by the user are only ever words)."""
    return " AND ".join(f'"{w}"*' for w in _WORD.findall(text.lower()))


def _texts(conv: Conversation) -> list[tuple[str, str]]:
    """(where, text) for everything a search should find in ``conv``."""
    out = [("title", conversation_title(conv))]
    if conv.system_prompt:
        out.append(("system", conv.system_prompt))
    for entry in conv.all_entries():  # every branch (issue 18)
        out.extend(("user" if entry.role == "user" else "reply", t)
                   for t in _entry_texts(entry))
    return [(w, t) for w, t in out if t.strip()]


def _entry_texts(entry: Entry) -> list[str]:
    """A message's texts a search finds: a user message's, or every column of a reply."""
    return [entry.text] if entry.role == "user" else [r.text for r in entry.replies if r.text]


def best_entry(conv: Conversation, text: str) -> Entry | None:
    """The message of ``conv`` that a search for ``text`` found best: the one whose text (a
    user message, or any column of a reply) holds the most of the search's words as prefixes
    of its words, those on the path shown first among equals, then the earliest; None when
    no message holds any (the words matched the title or the system prompt). Opening a hit
    shows this message's branch: the index answers per conversation, and the branch shown
    may not be the one that holds the words."""
    words = _WORD.findall(text.lower())
    if not words:
        return None
    on_path = {id(e) for e in conv.entries}
    best: tuple[int, int] = (0, 0)
    found: Entry | None = None
    for entry in conv.all_entries():
        have = {w for t in _entry_texts(entry) for w in _WORD.findall(t.lower())}
        score = (sum(any(h.startswith(w) for h in have) for w in words), id(entry) in on_path)
        if score > best:
            best, found = score, entry
    return found


def _stamp_text(stamp: Stamp | None) -> str:
    return repr(stamp)


class SearchIndex:
    """The index of one transcripts folder. ``search`` keeps it up to date by itself."""

    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else data_dir()
        self.path = self.directory / INDEX_NAME
        self._db: sqlite3.Connection | None = None

    # ---- the database ----

    def _connect(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                db = self._open(self.path)
            except sqlite3.DatabaseError:  # not a database, or a broken one: only a cache
                self._remove_files()
                db = self._open(self.path)
        except (OSError, sqlite3.Error):
            # a read-only folder: search still works, from an index that lives in memory
            db = self._open(":memory:")
        self._db = db
        return db

    @staticmethod
    def _open(where: Path | str) -> sqlite3.Connection:
        db = sqlite3.connect(where, timeout=2.0, isolation_level=None)
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version != INDEX_VERSION:
                db.executescript(
                    "DROP TABLE IF EXISTS files; DROP TABLE IF EXISTS texts;"
                    "CREATE TABLE files (path TEXT PRIMARY KEY, stamp TEXT NOT NULL,"
                    " id TEXT, title TEXT, updated REAL, messages INTEGER);"
                    "CREATE VIRTUAL TABLE texts USING fts5(title, system, user, reply,"
                    " path UNINDEXED, tokenize='unicode61 remove_diacritics 2');"
                    f"PRAGMA user_version = {INDEX_VERSION};")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("SELECT count(*) FROM files").fetchone()
            return db
        except sqlite3.DatabaseError:
            db.close()
            raise

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            try:
                os.unlink(f"{self.path}{suffix}")
            except OSError:
                pass

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    # ---- keeping it up to date ----

    def refresh(self) -> int:
        """Bring the index up to date with the folder; returns how many files were (re)read."""
        db = self._connect()
        known = dict(db.execute("SELECT path, stamp FROM files"))
        now: dict[str, tuple[Path, str]] = {}
        for path in listed_paths(self.directory):
            now[str(path)] = (path, _stamp_text(file_stamp(path)))
        stale = [p for p in known if p not in now]
        changed = [(path, stamp) for key, (path, stamp) in now.items() if known.get(key) != stamp]
        if not stale and not changed:
            return 0
        db.execute("BEGIN")
        try:
            for key in stale:
                self._forget(db, key)
            for path, stamp in changed:
                self._forget(db, str(path))
                self._add(db, path, stamp)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return len(changed)

    @staticmethod
    def _forget(db: sqlite3.Connection, key: str) -> None:
        db.execute("DELETE FROM files WHERE path = ?", (key,))
        db.execute("DELETE FROM texts WHERE path = ?", (key,))

    @staticmethod
    def _add(db: sqlite3.Connection, path: Path, stamp: str) -> None:
        try:
            conv = load_transcript(path)
            updated = max(os.stat(path).st_mtime, _journal_mtime(path))
        except (TranscriptError, OSError):
            # unreadable now: remembered with its stamp (not read again until it changes),
            # found by nothing; /history lists it with its error
            db.execute("INSERT INTO files VALUES (?, ?, '', '', 0, 0)", (str(path), stamp))
            return
        db.execute("INSERT INTO files VALUES (?, ?, ?, ?, ?, ?)",
                   (str(path), stamp, conv.id, conversation_title(conv), updated,
                    len(conv.entries)))
        texts: dict[str, list[str]] = {kind: [] for kind in KINDS}
        for kind, text in _texts(conv):
            texts[kind].append(text)
        db.execute("INSERT INTO texts (title, system, user, reply, path) VALUES (?, ?, ?, ?, ?)",
                   [*(BETWEEN.join(texts[kind]) for kind in KINDS), str(path)])

    # ---- searching ----

    def search(self, text: str, limit: int = 30) -> list[SearchHit]:
        """The conversations whose texts hold every word of ``text`` (as prefixes), best
        first; an empty list for a text with no words."""
        query = fts_query(text)
        if not query:
            return []
        self.refresh()
        snippets = ", ".join(f"snippet(texts, {c}, '\x02', '\x03', '…', 12)"
                             for c in range(len(KINDS)))
        rows = self._connect().execute(
            f"SELECT t.path, f.id, f.title, f.updated, f.messages, {snippets}"
            " FROM texts t JOIN files f ON f.path = t.path"
            " WHERE texts MATCH ? ORDER BY bm25(texts), f.updated DESC LIMIT ?",
            (query, limit)).fetchall()
        hits = []
        for path, cid, title, updated, messages, *parts in rows:
            # where it matched: the first of reply, user, system, title with a match
            where = next((k for k in ("reply", "user", "system", "title")
                          if "\x02" in parts[KINDS.index(k)]), "title")
            snippet = " · ".join(" ".join(piece.split()) for piece in
                                 parts[KINDS.index(where)].split("\x1e") if piece.strip())
            hits.append(SearchHit(Path(path), cid, title, updated, messages,
                                  snippet.replace("\x02", "[").replace("\x03", "]"), where))
        return hits


def _journal_mtime(path: Path) -> float:
    try:
        return os.stat(journal_path(path)).st_mtime
    except OSError:
        return 0.0


def search_transcripts(text: str, directory: Path | None = None,
                       limit: int = 30) -> list[SearchHit]:
    """Search the transcripts in ``directory`` (default :func:`data_dir`) once."""
    index = SearchIndex(directory)
    try:
        return index.search(text, limit)
    finally:
        index.close()
