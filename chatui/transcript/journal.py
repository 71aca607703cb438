"""The journal beside an autosave: what changed since the document was written, one line each.

Rewriting the whole document after every reply costs time that grows with the conversation
(about a second of CPU after 200 replies of ~330 tokens with their alternatives, most of it
in ``json.dumps`` holding the GIL). Instead the autosaver writes the document once, then
appends one fsynced JSON line per change to ``<document>.journal``:

    {"format": "chatui-journal", "version": 1, "id": "3f9c0a1b2c4d", "base": "<rev>"}
    {"at": 4, "messages": [<message>, ...]}                  // keep 4 messages, then these
    {"at": 6, "messages": [...], "title": "...", "system_prompt": "...", "model": {...},
     "parent": {"id": ..., "messages": n}}                   // changed fields only

The header's ``base`` is the ``rev`` of the document the journal extends: a journal left
beside a newer document (a kill between writing the document and removing the journal) no
longer matches and is ignored. Each line is written with one ``write`` and fsynced, so a kill
leaves at most the last line cut short; a line that does not end in a newline, or that does
not parse, ends the journal, and what came before it loads. Messages are checked as strictly
as the document's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from ..conversation import Conversation, Entry
from .reader import _Bad, _entry, _model, _Obj, _parent, _sibling
from .schema import _MAX_INDEX

log = logging.getLogger(__name__)

JOURNAL_FORMAT = "chatui-journal"
JOURNAL_VERSION = 1
SUFFIX = ".journal"
MAX_JOURNAL_BYTES = 256 * 1024 * 1024
"""Lines past this many bytes are ignored on load (the autosaver compacts long before)."""


def journal_path(path: Path) -> Path:
    """The journal beside the document at ``path``."""
    return path.with_name(path.name + SUFFIX)


def header(conv_id: str, base: str) -> dict[str, Any]:
    return {"format": JOURNAL_FORMAT, "version": JOURNAL_VERSION, "id": conv_id, "base": base}


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


def _loads(line: bytes) -> Any:
    return json.loads(line.decode("utf-8"), parse_constant=_no_constants)


def _apply(conv: Conversation, data: Any, where: str) -> None:
    """Apply one change line to ``conv``; checks everything first, so a bad line changes
    nothing (raises :class:`_Bad`)."""
    o = _Obj(data, where)
    path = conv.entries
    at = o.int("at", 0, min(len(path), _MAX_INDEX))
    assert at is not None
    raw = o.list("messages")
    mw = o.at("messages")
    tree = all(isinstance(m, dict) and "node" in m for m in raw)
    entries = [_entry(m, f"{mw}[{i}]", f"m{at + i}") for i, m in enumerate(raw)]
    sibs = [_sibling(m, f"{mw}[{i}]") for i, m in enumerate(raw)]
    title = o.str("title", conv.title)
    system_prompt = o.str("system_prompt", conv.system_prompt)
    model = _model(o.d["model"]) if "model" in o.d else conv.model
    parent = _parent(o.d["parent"]) if "parent" in o.d else None
    if tree and raw:
        _graft(conv, path[at - 1] if at else None, entries, sibs)
    else:  # a version 2 line (or the path cut short): keep `at` messages, then these
        if at < len(path):
            if tree:
                conv.rewind(path[at])
            else:
                conv.discard(path[at])
        for e in entries:
            conv.append(e)
    conv.title, conv.system_prompt, conv.model = title, system_prompt, model
    if parent is not None:
        conv.parent, conv.branched_at = parent.get("parent", ""), parent.get("branched_at", 0)


def _graft(conv: Conversation, parent: Entry | None, entries: list[Entry],
           sibs: list[int]) -> None:
    """Put the path ``entries`` below ``parent``: a message whose node is there already
    replaces it in place (it grew; its other branches stay), a new one is added as a
    sibling at its place; each is chosen, and the path ends after the last."""
    for entry, pos in zip(entries, sibs):
        kids = conv.tops if parent is None else parent.children
        old = next((i for i, k in enumerate(kids) if k.node == entry.node), None)
        if old is not None:
            entry.children = kids[old].children
            kids[old] = entry
            index = old
        else:
            index = min(pos, len(kids))
            kids.insert(index, entry)
        if parent is None:
            conv.top = index
        else:
            parent.active = index
        parent = entry
    assert parent is not None
    parent.active = -1


def replay(conv: Conversation, base: Any, path: Path) -> Conversation:
    """``conv`` (the document at ``path``, whose ``rev`` is ``base``) with the changes of the
    journal beside it applied, in place. A missing, stale or unreadable journal changes
    nothing; a cut or bad line ends it."""
    replay_counted(conv, base, path)
    return conv


def replay_counted(conv: Conversation, base: Any, path: Path) -> int:
    """:func:`replay`; returns how many bytes of the journal were applied (0 when none), so
    that a writer going on with it can cut off what follows first."""
    jpath = journal_path(path)
    try:
        with open(jpath, "rb") as f:
            raw = f.read(MAX_JOURNAL_BYTES)
    except FileNotFoundError:
        return 0
    except OSError as e:
        log.warning("could not read the journal %s: %s", jpath, e)
        return 0
    lines = raw.split(b"\n")[:-1]  # the piece after the last newline is cut short (or empty)
    if not lines or not isinstance(base, str):
        return 0
    try:
        head = _loads(lines[0])
    except (ValueError, UnicodeDecodeError, RecursionError):
        return 0
    if not (isinstance(head, dict) and head.get("format") == JOURNAL_FORMAT
            and head.get("version") == JOURNAL_VERSION and head.get("id") == conv.id
            and head.get("base") == base):
        return 0  # another document's journal (e.g. left by a kill during compaction)
    used = len(lines[0]) + 1
    for n, line in enumerate(lines[1:], 2):
        try:
            _apply(conv, _loads(line), f"{jpath.name} line {n}")
        except (ValueError, UnicodeDecodeError, RecursionError, _Bad) as e:
            log.warning("the journal %s ends at a bad line %d: %s", jpath, n, e)
            break
        used += len(line) + 1
    return used
