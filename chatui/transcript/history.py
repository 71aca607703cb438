"""Autosave and history: where conversations are saved, under which name, and the listing
``/history`` shows.
"""

from __future__ import annotations

import datetime as _dt
import glob
import os
import re
import time
import unicodedata
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from ..conversation import Conversation
from ..export import conversation_title, model_label
from .identity import branch, first_unheld, merge, tree_holds
from .journal import journal_path
from .reader import _is_num
from .schema import TranscriptError
from .store import (
    Loaded, Stamp, _fsync_dir, _os_problem, file_stamp, load_transcript, load_with_document,
    write_document,
)

def data_dir() -> Path:
    """Where conversations are autosaved: ``$CHATUI_DATA_DIR`` if set, else
    ``platformdirs.user_data_dir("chatui")/conversations``. Not created here."""
    env = os.environ.get("CHATUI_DATA_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("chatui")) / "conversations"


_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.)", re.S)


def slug(text: str, *, max_words: int = 6, max_len: int = 40) -> str:
    """``"Hello, World! How are you?"`` -> ``"hello-world-how-are-you"`` (letters of any
    script kept; at most ``max_words`` words and ``max_len`` characters)."""
    text = unicodedata.normalize("NFKC", _ANSI.sub("", text)).lower()
    words = re.findall(r"[^\W_]+", text)[:max_words]
    out = ""
    for w in words:
        cand = f"{out}-{w}" if out else w
        if len(cand) > max_len:
            if not out:
                out = w[:max_len]
            break
        out = cand
    return out


def _safe_id(conv_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", conv_id)[:64] or "chat"


def _stamp(t: float) -> str:
    try:
        return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d_%H%M")
    except (OverflowError, OSError, ValueError):
        return "0000-00-00_0000"


def _base_name(conv: Conversation) -> str:
    """``2026-11-22_0315_first-words-of-title_<id>``: created time, slug, id."""
    source = conv.title or next((e.text for e in conv.entries if e.role == "user"), "")
    return f"{_stamp(conv.created)}_{slug(source) or 'chat'}_{_safe_id(conv.id)}"


def autosave_path(conv: Conversation, directory: Path | None = None) -> Path:
    """The file a conversation autosaves to: ``2026-11-22_0315_first-words-of-title_<id>.json``.

    Stable for a conversation: if a file for its id already exists in the directory, that
    one is returned, so a title that appears or changes later never makes a second file.
    """
    directory = Path(directory) if directory is not None else data_dir()
    cid = _safe_id(conv.id)
    # date_time_slug_id: none of the first three holds "_", so the fourth part is the id
    # (an id "b_c" must not pick up the file of a conversation whose id is "a_b_c").
    existing = sorted(p for p in directory.glob(f"*_{glob.escape(cid)}.json")
                      if not p.name.startswith(".") and p.stem.split("_", 3)[-1] == cid)
    if existing:
        return existing[0]
    return directory / f"{_base_name(conv)}.json"


_STALE_TMP_S = 3600


def _remove_stale_temps(directory: Path) -> None:
    """Temporary files left by a save that was killed mid-write (older than an hour)."""
    now = time.time()
    for p in directory.glob(".*.json.*.tmp"):
        try:
            if now - p.stat().st_mtime > _STALE_TMP_S:
                p.unlink()
        except OSError:
            pass


_UNREADABLE = Conversation(id="unreadable")
_MAX_HOPS = 64


def _on_disk(path: Path) -> Conversation | None:
    """The conversation saved at ``path``, None if there is none, ``_UNREADABLE`` if the file
    cannot be read (it is then treated as holding something: it is never written over)."""
    if not path.exists():
        return None
    try:
        return load_transcript(path)
    except TranscriptError:
        return _UNREADABLE


def claim(conv: Conversation, directory: Path | None = None) -> Conversation:
    """``conv`` if writing it to its autosave file loses no message that file holds (the file
    is missing, or ``conv`` holds all of it); else the branch of ``conv`` for which that is
    true (see :mod:`.identity`). Reads the files it considers."""
    cur = conv
    for _ in range(_MAX_HOPS):
        disk = _on_disk(autosave_path(cur, directory))
        if disk is None:
            return cur
        if disk is not _UNREADABLE and tree_holds(cur, disk):
            return cur
        at = 0 if disk is _UNREADABLE else first_unheld(cur.entries, disk.entries)
        cur = branch(cur, at)
    return replace(conv, id=uuid.uuid4().hex[:12], parent=conv.id, branched_at=0)


def open_transcript(path: Path, directory: Path | None = None) -> Conversation:
    """The conversation at ``path``, with the identity to continue it under.

    The autosave file of a conversation opens as itself. A copy (any other file) keeps its id
    when its home in ``directory`` is missing or holds nothing the copy lacks, so that going on
    extends the home; if the home holds more (the copy is older, or went another way), the
    copy opens inside the home's tree (:func:`~.identity.merge`): its path is the copy's, the
    home's newer messages stay as a branch, and the next autosave extends the home's file
    without dropping anything.

    Raises:
        TranscriptError: as :func:`load_transcript`.
    """
    return open_loaded(path, directory)[0]


def open_loaded(path: Path, directory: Path | None = None) -> tuple[Conversation, Loaded | None]:
    """:func:`open_transcript`, and what was read when ``path`` is the conversation's own
    autosave file (for an autosave writer to go on from without reading it again)."""
    path = Path(path).expanduser()
    loaded = load_with_document(path)
    conv = loaded.conv
    home = autosave_path(conv, directory)
    try:
        same = home.exists() and os.path.samefile(home, path)
    except OSError:
        same = False
    if same:
        return conv, loaded
    disk = _on_disk(home)
    if disk is not None and disk is not _UNREADABLE and disk.id == conv.id \
            and not tree_holds(conv, disk):
        return merge(disk, conv), None  # an older copy: its messages join the home's tree
    return claim(conv, directory), None


def autosave(conv: Conversation, directory: Path | None = None) -> Path:
    """Save ``conv`` to its :func:`autosave_path`, in full, and return that path.

    If that file holds messages ``conv`` lacks (``conv`` is an older copy, or a reply was
    retried), ``conv`` becomes a branch first: its ``id``, ``parent`` and ``branched_at`` are
    changed in place and the branch's file is written (see :func:`claim`); nothing on disk is
    lost. Does nothing (but still returns the path) when the conversation has no messages.
    The app autosaves through :class:`chatui.autosaver.Autosaver`, which writes only what
    changed; this writes the whole document (``/save``).

    Raises:
        TranscriptError: as :func:`save_transcript`.
    """
    if not conv.entries:
        return autosave_path(conv, directory)
    target = claim(conv, directory)
    if target is not conv:
        conv.id, conv.parent, conv.branched_at = target.id, target.parent, target.branched_at
    path = autosave_path(conv, directory)
    write_document(conv, path)
    _remove_stale_temps(path.parent)
    return path


@dataclass(frozen=True)
class TranscriptSummary:
    """One saved conversation as ``/history`` lists it."""

    path: Path
    id: str
    created: float
    updated: float
    """When it was last saved."""
    model: str
    title: str
    """The title, else the first line of the first message."""
    messages: int
    error: str = ""
    """Why the file cannot be opened ("" when it can); the other fields are then guesses."""
    parent: str = ""
    """The id of the conversation this one is a branch of, if any."""


# (path) -> (file_stamp, summary): /history reopened on an unchanged folder is cheap.
_summary_cache: dict[Path, tuple[Stamp, TranscriptSummary]] = {}


def _summarise(path: Path) -> TranscriptSummary:
    try:
        st = path.stat()
    except OSError as e:
        return TranscriptSummary(path, "", 0.0, 0.0, "", path.name, 0,
                                 f"Could not load {path}: {_os_problem(e)}.")
    key = file_stamp(path)
    hit = _summary_cache.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    try:
        loaded = load_with_document(path)
        data, conv = loaded.data, loaded.conv
        saved = data.get("saved") if isinstance(data, dict) else None
        updated = saved if _is_num(saved) else st.st_mtime
        try:
            updated = max(updated, journal_path(path).stat().st_mtime)
        except OSError:
            pass
        summary = TranscriptSummary(
            path=path, id=conv.id, created=conv.created, updated=updated,
            model=model_label(conv), title=conversation_title(conv), messages=len(conv.entries),
            parent=conv.parent)
    except TranscriptError as e:
        summary = TranscriptSummary(path, "", st.st_mtime, st.st_mtime, "", path.name, 0, str(e))
    _summary_cache[path] = (key, summary)
    return summary


def list_transcripts(directory: Path | None = None) -> list[TranscriptSummary]:
    """Every transcript in ``directory`` (default :func:`data_dir`), newest first.

    Files that cannot be read are listed too, with ``error`` set; nothing is raised for them.
    A missing directory gives an empty list.
    """
    directory = Path(directory) if directory is not None else data_dir()
    return sorted((_summarise(p) for p in listed_paths(directory)), key=lambda s: s.updated,
                  reverse=True)


def newest_transcript(directory: Path | None = None) -> Path | None:
    """The transcript in ``directory`` (default :func:`data_dir`) saved last that loads, by
    its files' times (the document's or its journal's), without reading the others (``chatui
    --resume``); None when there is none."""
    directory = Path(directory) if directory is not None else data_dir()

    def touched(path: Path) -> float:
        times = []
        for p in (path, journal_path(path)):
            try:
                times.append(p.stat().st_mtime)
            except OSError:
                pass
        return max(times, default=0.0)

    for path in sorted(listed_paths(directory), key=touched, reverse=True):
        try:
            load_transcript(path)
        except TranscriptError:
            continue  # (a damaged one is listed by /history, with what is wrong with it)
        return path
    return None


def listed_paths(directory: Path) -> list[Path]:
    """The transcript files in ``directory`` that ``/history`` lists (and search finds); an
    empty list for a missing or unreadable folder."""
    try:
        return [p for p in Path(directory).iterdir()
                if p.suffix == ".json" and not p.name.startswith(".")
                and not p.name.endswith(".messages.json") and p.is_file()]
    except OSError:
        return []


def delete_transcript(path: Path) -> None:
    """Delete a saved transcript (ask the user first).

    Raises:
        TranscriptError: it is not a ``.json`` file, is gone already, or cannot be removed.
    """
    path = Path(path)
    if path.suffix != ".json" or path.is_dir():
        raise TranscriptError(f"Could not delete {path}: it is not a transcript (.json file).")
    try:
        path.unlink()
    except OSError as e:
        raise TranscriptError(f"Could not delete {path}: {_os_problem(e)}.") from None
    _summary_cache.pop(path, None)
    try:
        journal_path(path).unlink()
    except OSError:
        pass  # none, or a leftover that nothing reads without its document
    _fsync_dir(path.parent)
