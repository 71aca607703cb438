"""The journal beside an autosave: what changed since the document was written, one line each.

Rewriting the whole document after every reply costs time that grows with the conversation
(about a second of CPU after 200 replies of ~330 tokens with their alternatives, most of it
in ``json.dumps`` holding the GIL). Instead the autosaver writes the document once, then
appends one fsynced JSON line per change to ``<document>.journal``:

    {"format": "chatui-journal", "version": 2, "id": "3f9c0a1b2c4d", "base": "<rev>"}
    {"at": 4, "messages": [<message>, ...]}                  // keep 4 messages, then these
    {"at": 6, "messages": [...], "title": "...", "system_prompt": "...", "model": {...},
     "parent": {"id": ..., "messages": n}}                   // changed fields only
    {"select": "<node>", "at": 9, "messages": []}            // another branch chosen
    {"at": 9, "messages": [], "chosen": {"<node>": 2}}       // a comparison's column picked

A line's ``select`` (version 2) first makes the chosen path end at the message with that node
id (every message above it chooses the branch that leads to it): a sibling switch
(Alt+Left/Right, ``/sibling``) is then a line naming the message switched to, or the deepest
message of the branch the conversation goes on with, rather than the whole document or the
whole path below the switch written again. ``at`` then counts from the top of that path.
Version 1 journals (no ``select``) load as before; a version 2 journal is ignored by a chatui
that only knows version 1.

A line's ``chosen`` (optional, so the version stays 2) gives messages already in the files
another chosen column: a comparison's pick (F6, ``/pick``, a click on a header)
was a line holding the whole group again (every column's tokens with their alternatives:
1.13 MB a press for 8 columns of 512 tokens with top-5, fsynced), and is now 49 bytes (both
measured with ``tests/test_journal.py``'s ``_compared``). It is applied after the rest of
the line. A chatui that does not know it ignores it, as any unknown key, and shows the
column chosen before.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..conversation import Conversation, Entry, walk
from .identity import entry_holds
from .reader import _Bad, _entry, _model, _Obj, _parent, _sibling
from .schema import _MAX_INDEX

log = logging.getLogger(__name__)

JOURNAL_FORMAT = "chatui-journal"
JOURNAL_VERSION = 2
JOURNAL_VERSIONS = (1, 2)
"""What this chatui reads (a line with ``select`` needs version 2)."""
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
    selected: Entry | None = None
    if "select" in o.d:
        node = o.str("select")
        chain = _chain(conv, node)
        if chain is None:
            raise _Bad(f"{o.at('select')} names no message ({node!r})")
        selected, path = chain[-1], tuple(chain)
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
    picks = _picks(conv, o) if "chosen" in o.d else []
    if selected is not None:  # everything is checked: from here on nothing fails
        conv.select(selected)
        selected.active = -1
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
    for entry, column in picks:
        entry.chosen = column
    conv.title, conv.system_prompt, conv.model = title, system_prompt, model
    if parent is not None:
        conv.parent, conv.branched_at = parent.get("parent", ""), parent.get("branched_at", 0)


def _picks(conv: Conversation, o: _Obj) -> list[tuple[Entry, int]]:
    """A line's ``chosen``: the messages it names (each a group of replies already there) with
    the column each now goes on with (raises :class:`_Bad` if one is not there)."""
    where = o.at("chosen")
    raw = o.d["chosen"]
    if not isinstance(raw, dict) or len(raw) > _MAX_INDEX:
        raise _Bad(f"{where} is not an object of message ids and columns")
    held = {e.node: e for _, e in walk(conv.tops)}
    out = []
    for node, column in raw.items():
        entry = held.get(node)
        if entry is None or not entry.replies:
            raise _Bad(f"{where} names no group of replies ({node!r})")
        if type(column) is not int or not 0 <= column < len(entry.replies):
            raise _Bad(f"{where}[{node!r}] is not a column of its {len(entry.replies)}")
        out.append((entry, column))
    return out


def _chain(conv: Conversation, node: str) -> list[Entry] | None:
    """The messages from the top down to the one with ``node`` (None: there is none)."""
    parents: dict[int, Entry | None] = {}
    for parent, e in walk(conv.tops):
        parents[id(e)] = parent
        if e.node == node:
            chain: list[Entry] = []
            x: Entry | None = e
            while x is not None:
                chain.append(x)
                x = parents[id(x)]
            chain.reverse()
            return chain
    return None


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
            and head.get("version") in JOURNAL_VERSIONS and head.get("id") == conv.id
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


# ---- what one line can say (the writer's side) ----


class Skeleton:
    """A tree's shape, without its contents: each message's children (by node id), the one
    chosen, and its parent; the top level is the children of None. Built in one pass, kept
    by the writer for the next save (what the files hold), so that a save walks only the new
    snapshot's tree."""

    __slots__ = ("kids", "active", "parent", "entry")

    def __init__(self, conv: Conversation) -> None:
        self.kids: dict[str | None, list[str]] = {None: [e.node for e in conv.tops]}
        self.active: dict[str | None, int] = {None: conv.top}
        self.parent: dict[str, str | None] = {}
        self.entry: dict[str, Entry] = {}
        kids, active, parents, entries = self.kids, self.active, self.parent, self.entry
        stack: list[tuple[str | None, Entry]] = [(None, e) for e in conv.tops]
        while stack:  # (every message once; the order does not matter here)
            above, e = stack.pop()
            node = e.node
            parents[node] = above
            entries[node] = e
            active[node] = e.active
            children = e.children
            kids[node] = [c.node for c in children]
            stack.extend([(node, c) for c in children])

    def path(self) -> list[str]:
        """The chosen path's nodes."""
        out: list[str] = []
        at: str | None = None
        while True:
            kids, i = self.kids[at], self.active[at]
            if not 0 <= i < len(kids):
                return out
            at = kids[i]
            out.append(at)

    def chain(self, node: str) -> list[str]:
        """The nodes from the top down to ``node``."""
        out: list[str] = []
        at: str | None = node
        while at is not None:
            out.append(at)
            at = self.parent[at]
        out.reverse()
        return out


@dataclass(frozen=True)
class Change:
    """What one journal line says about the tree: end the path at ``select`` (when not None),
    keep its first ``at`` messages, then ``entries`` (the new snapshot's chosen path from
    ``at`` on, each at its place among its siblings: ``positions``)."""

    select: str | None
    at: int
    entries: tuple[Entry, ...]
    positions: tuple[int, ...]
    same: bool = False
    """The tree is as the files hold it (a line would say nothing about it)."""
    chosen: tuple[tuple[str, int], ...] = ()
    """Messages the files hold as they are but for the column they go on with (a pick):
    their node ids and new columns."""


def plan(old: Conversation, new: Conversation, skeleton: Skeleton | None = None
         ) -> tuple[Change, Skeleton] | None:
    """The line that turns ``old`` (what the files hold; ``skeleton`` its :class:`Skeleton`
    if known) into ``new``, with ``new``'s skeleton; None when no line can say it (a message
    off the chosen path changed or went, a message would shrink...): then the document is
    written in full, or, when ``new`` does not hold ``old``, as a branch.

    The line is checked by applying it to ``old``'s skeleton exactly as :func:`_apply` will
    on load and comparing the result with ``new``'s: the same children in the same order,
    the same choices everywhere, and every message not written by the line equal to the one
    the files hold (but for a column picked: ``chosen``). A retry, an edit, a continuation, a
    fan-out, a sibling switch and a pick are all one line; the path is written from the first message that differs, except for messages
    that are in the files already (a switch to another branch only names it).

    Cost (issue 21): one pass over ``new``'s tree, a dictionary look-up and an equality test
    per message (an unchanged reply shares its token columns with the saved one, so the test
    reads none of them), then the messages the line writes."""
    old_sk = skeleton if skeleton is not None else Skeleton(old)
    new_sk = Skeleton(new)
    new_path = new.entries
    picks: list[tuple[str, int]] = []

    def held_as_is(o: Entry, e: Entry) -> bool:
        """``o`` (held) and ``e`` are the same message, perhaps with another column chosen
        (then noted in ``picks``: a line says it without writing the message)."""
        if _same(o, e):
            return True
        if o.chosen != e.chosen and _same(o, e, chosen=False):
            picks.append((e.node, e.chosen))
            return True
        return False

    # How many messages of the new path are in the files as they are, at the same place.
    k = 0
    above: str | None = None
    old_entry, old_parent, old_kids, new_kids = (old_sk.entry, old_sk.parent, old_sk.kids,
                                                 new_sk.kids)
    for e in new_path:
        node = e.node
        o = old_entry.get(node)
        if (o is None or old_parent[node] != above
                or old_kids[above].index(node) != new_kids[above].index(node)
                or not held_as_is(o, e)):
            break
        above = node
        k += 1
    old_path = old_sk.path()
    keep = 0
    while keep < min(k, len(old_path)) and old_path[keep] == new_path[keep].node:
        keep += 1
    select = new_path[k - 1].node if keep < k else None
    entries = tuple(new_path[k:])
    positions = tuple(new_sk.kids[new_path[i - 1].node if i else None].index(new_path[i].node)
                      for i in range(k, len(new_path)))
    # The line applied to what the files hold, as _apply does it, must give the new tree.
    kids = dict(old_sk.kids)  # a list is copied before it changes: old_sk stays as it was
    active = dict(old_sk.active)
    path = old_path
    if select is not None:
        path = old_sk.chain(select)
        for a, b in zip([None, *path], path):
            active[a] = kids[a].index(b)
        active[select] = -1
    if entries:
        parent = path[k - 1] if k else None
        for e, pos in zip(entries, positions):
            siblings = kids[parent]
            if e.node in siblings:
                i = siblings.index(e.node)
                held = old_sk.entry[e.node]
                if not (held is e or entry_holds(e, held)):
                    return None  # the files hold more of it
            else:
                i = min(pos, len(siblings))
                kids[parent] = siblings = [*siblings[:i], e.node, *siblings[i:]]
                kids[e.node] = []
            active[parent] = i
            parent = e.node
        active[parent] = -1
    elif k < len(path):
        active[path[k - 1] if k else None] = -1
    if kids != new_sk.kids or active != new_sk.active:
        return None
    checked = {e.node for e in new_path}  # on the path: written, or compared above
    for node, e in new_sk.entry.items():
        if node not in checked and not held_as_is(old_sk.entry[node], e):
            return None
    same = select is None and not entries and k == len(old_path) and not picks
    return Change(select, k, entries, positions, same, tuple(picks)), new_sk


def _same(a: Entry, b: Entry, chosen: bool = True) -> bool:
    """``a == b`` (what the entries say; with ``chosen`` false, whatever column each goes on
    with), cheapest tests first and without deriving texts: the replies' equality compares
    their texts, and their token columns by identity when a snapshot shares them (the
    autosave asks this of every message, issue 21)."""
    if a is b:
        return True
    if a.time != b.time or (chosen and a.chosen != b.chosen) or a.fan_out != b.fan_out \
            or a.role != b.role:
        return False
    if a.replies or b.replies:
        return a.replies == b.replies
    return a._text == b._text  # type: ignore[attr-defined]  # (stored for user messages)
