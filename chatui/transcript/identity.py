"""What a conversation's identity is, and when a save would lose something.

A conversation is named by its ``id``; its autosave file (``..._<id>.json`` in the history
folder) is its home, and a home only ever gains messages. Any other file holding the same id
(``/save PATH``, a file mailed to you) is a *copy*: a picture of the conversation at one moment.

Writing a document over a file is safe when the document *holds* everything the file holds:
the same messages, in order, where a reply on disk may have grown since (a streamed or
continued reply extends its tokens and text; a comparison may gain columns; ``chosen`` and the
settings may change). When it does not (a copy older than its home was opened, a reply was
retried, a prompt edited), the document is written as a *branch* instead: a new id, with
``parent`` naming the conversation it left and ``branched_at`` the messages they share. The
branch's id is derived from the parent's id and the branch point, so two writers that branch
the same conversation at the same message (the app's autosaver and an explicit ``/save``) find
the same file rather than making two; if that file is taken by other content, the branch
branches again from it.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Sequence

from ..conversation import Conversation, Entry, Reply, index_of, new_node_id, walk
from ..token_records import TokenRecords


def reply_holds(new: Reply, old: Reply) -> bool:
    """``new`` keeps everything ``old`` has: its tokens and text start with ``old``'s."""
    if new is old:
        return True
    if isinstance(new.tokens, TokenRecords) and isinstance(old.tokens, TokenRecords):
        # columns, not tokens: a snapshot's unchanged reply shares them with the one saved
        # before it, so this is a few identity checks (see TokenRecords.copy)
        return new.tokens.startswith(old.tokens) and new.text.startswith(old.text)
    n = len(old.tokens)
    return (len(new.tokens) >= n and new.tokens[:n] == old.tokens
            and new.text.startswith(old.text))


def entry_holds(new: Entry, old: Entry) -> bool:
    """``new`` is ``old``, or ``old`` grown: the same role and user text, and every reply of
    ``old`` held by the reply in the same column of ``new``."""
    if new is old or new == old:
        return True
    if new.role != old.role:
        return False
    if new.role == "user":
        return new.text == old.text
    return (len(new.replies) >= len(old.replies)
            and all(reply_holds(n, o) for n, o in zip(new.replies, old.replies)))


def first_unheld(new: Sequence[Entry], old: Sequence[Entry]) -> int:
    """The index of the first message of ``old`` that ``new`` does not hold; ``len(old)`` when
    it holds them all."""
    for i, o in enumerate(old):
        if i >= len(new) or not entry_holds(new[i], o):
            return i
    return len(old)


def holds(new: Sequence[Entry], old: Sequence[Entry]) -> bool:
    """Writing ``new`` over a file holding ``old`` loses no message."""
    return len(new) >= len(old) and first_unheld(new, old) == len(old)


def tree_holds(new: Conversation, old: Conversation) -> bool:
    """Writing ``new`` over a file holding ``old`` loses no message of any branch: every
    message of ``old`` is held (equal, or grown) by the message of ``new`` with the same
    node id, or else by the one at the same place in the tree (the same child of the same
    child...: two copies built apart, or a version 2 file, name their messages apart),
    unless the user deleted it (:meth:`Conversation.delete`).

    The autosave asks this after every reply, so its cost matters (issue 21): successive
    snapshots share each unchanged reply's token columns, which makes a message's check a
    few identity tests (:meth:`TokenRecords.copy`), and places are worked out only when a
    node id is not found (they cost O(depth) each: O(messages²) for a long chat)."""
    by_id: dict[str, Entry] = {e.node: e for _, e in walk(new.tops)}
    by_place: dict[tuple[int, ...], Entry] = {}
    old_places: dict[int, tuple[int, ...]] = {}
    for _, e in walk(old.tops):
        n = by_id.get(e.node)
        if n is not None and entry_holds(n, e):
            continue
        if n is None and e.node in new.deleted:
            continue
        if not old_places:  # the first message not found by its node: places, once
            by_place = {place: x for place, x in _places(new.tops)}
            old_places = {id(x): place for place, x in _places(old.tops)}
        n = by_place.get(old_places[id(e)])
        if n is not None and entry_holds(n, e):
            continue
        return False
    return True


def _places(tops: Sequence[Entry]) -> list[tuple[tuple[int, ...], Entry]]:
    """Every entry with its place: the child indices that lead to it from the top."""
    out: list[tuple[tuple[int, ...], Entry]] = []
    stack = [((i,), e) for i, e in enumerate(tops)]
    while stack:
        place, e = stack.pop()
        out.append((place, e))
        stack.extend((place + (i,), c) for i, c in enumerate(e.children))
    return out


def branch_id(conv_id: str, at: int) -> str:
    """The id of the branch of ``conv_id`` that leaves it at message ``at``."""
    return hashlib.sha256(f"{conv_id}/{at}".encode()).hexdigest()[:12]


def branch(conv: Conversation, at: int) -> Conversation:
    """``conv`` as a branch leaving the conversation ``conv.id`` at message ``at`` (the entries
    are shared, not copied)."""
    return replace(conv, id=branch_id(conv.id, at), parent=conv.id, branched_at=at)


def _alike(a: Entry, b: Entry) -> bool:
    """One of the two holds the other (the same message, perhaps grown)."""
    return entry_holds(a, b) or entry_holds(b, a)


def merge(home: Conversation, copy: Conversation) -> Conversation:
    """``home`` (read from the conversation's own file) with every message of ``copy`` (an
    older copy of it, or one that went another way) in its tree (issue 18: loading an older
    copy adds a sibling instead of a file of its own). A copy's message that is in ``home``
    (the same node, or the same place with the same text) is shared, the longer version
    kept; the others are added as alternatives where they leave. The path is the copy's
    (ending where it ended); ``home`` keeps its id and every message it had, so the next save
    extends its file. ``home`` is changed and returned; ``copy`` is left alone."""
    taken = {e.node for e in home.all_entries()}
    mapping: dict[int, Entry] = {}
    for cparent, e in walk(copy.tops):
        mparent = None if cparent is None else mapping[id(cparent)]
        kids = home.tops if mparent is None else mparent.children
        match = (next((k for k in kids if k.node == e.node and _alike(k, e)), None)
                 or next((k for k in kids if _alike(k, e)), None))
        if match is None:
            node = e.node if e.node not in taken else new_node_id()
            taken.add(node)
            match = replace(e, children=[], active=-1, node=node)
            kids.append(match)
        elif not entry_holds(match, e):  # the copy's version grew: it replaces, in place
            grown = replace(e, children=match.children, active=match.active, node=match.node)
            kids[index_of(kids, match)] = grown
            match = grown
        mapping[id(e)] = match
    path = copy.entries
    if path:
        last = mapping[id(path[-1])]
        home.select(last)
        last.active = -1
    else:
        home.top = -1
    return home
