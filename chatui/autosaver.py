"""Autosaving off the event loop, writing only what changed.

Saving a whole transcript serialises, checks and fsyncs the whole conversation: about 100 ms
for three replies of 2,000 tokens with their alternatives, growing with the conversation (a
second of CPU after 200 replies of ~330 tokens). Done on the event loop after every reply, that
froze the app for as long (a keypress answered in 55 ms). :class:`Autosaver` takes a snapshot
of the conversation on the loop (a copy of its lists, about a millisecond after 200 replies)
and hands it to a thread of its own, where a
:class:`~chatui.transcript.writer.AutosaveWriter` appends to the conversation's journal only
the messages that changed since the last save (see ``python -m chatui.transcript.bench``). A
newer snapshot of the same conversation replaces one not yet written, and
:meth:`Autosaver.flush` waits for the writes (before quitting, listing the saved
conversations, or an explicit ``/save``) and folds small journals into their documents.
:meth:`Autosaver.open` is ``/load``: it opens a file under the right identity and hands what
it read to the writer.

When saving would drop messages the file holds (another window or chatui added to it since),
the writer saves a branch under a new id instead; the autosaver then gives the live
conversation that id (on the caller's thread, at the next :meth:`Autosaver.save` or
:meth:`Autosaver.flush`, or when the caller, told by ``on_branch``, calls
:meth:`Autosaver.follow_branches`), so that it goes on in the branch.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from .conversation import Conversation
from .transcript.history import autosave_path, open_loaded
from .transcript.writer import AutosaveWriter

log = logging.getLogger(__name__)


class Autosaver:
    """Writes conversations' autosaves on its own thread, newest snapshot first."""

    def __init__(self, on_error: Callable[[Exception], None],
                 on_branch: Callable[[], None] = lambda: None) -> None:
        """``on_error`` is called on the writer's thread with what a save raised, and
        ``on_branch`` when a save was written as a branch (neither may block)."""
        self._on_error = on_error
        self._on_branch = on_branch
        self._followed: list[tuple[Conversation, Conversation]] = []
        """(live conversation, the branch it now goes on in), until :meth:`follow_branches`
        hands them over."""
        self._cond = threading.Condition()
        self._pending: dict[tuple[str, Path | None], tuple[Conversation, Conversation]] = {}
        self._compact = False
        self._busy = False
        self._thread: threading.Thread | None = None
        self._writer = AutosaveWriter()  # used on the thread only
        self._branched: list[tuple[Conversation, str, Conversation]] = []
        """(live conversation, its id when saved, the branch written for it)."""

    def save(self, conv: Conversation, directory: Path | None) -> None:
        """Queue a save of ``conv`` as it is now (to its autosave file in ``directory``)."""
        self._follow_branches()
        snapshot = conv.snapshot()
        with self._cond:
            self._pending[(conv.id, directory)] = (snapshot, conv)
            self._start()
            self._cond.notify_all()

    def open(self, path: Path, directory: Path | None) -> Conversation:
        """``/load``: the conversation at ``path`` with the identity to go on under (see
        :func:`chatui.transcript.open_transcript`: an older copy opens as a branch). When
        ``path`` is the conversation's own autosave, the writer takes what was read as what
        its files hold, so the next save appends to the journal at once instead of reading
        the files back (about 0.75 s of CPU for 200 replies).

        Raises:
            TranscriptError: as :func:`chatui.transcript.load_transcript`.
        """
        self.flush()
        conv, loaded = open_loaded(path, directory)
        if loaded is not None:
            with self._cond:
                self._cond.wait_for(lambda: not self._pending and not self._busy)
                self._writer.adopt(autosave_path(conv, directory), directory, loaded, conv)
        return conv

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued save is written and small journals are folded into their
        documents; False if ``timeout`` ran out first."""
        with self._cond:
            if self._thread is not None:
                self._compact = True
                self._cond.notify_all()
            done = self._cond.wait_for(
                lambda: not self._pending and not self._busy and not self._compact, timeout)
        self._follow_branches()
        return done

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every queued save is written, leaving journals as they are (what the
        files hold between two replies); False if ``timeout`` ran out first."""
        with self._cond:
            done = self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)
        self._follow_branches()
        return done

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="chatui-autosave",
                                            daemon=True)
            self._thread.start()

    def _follow_branches(self) -> None:
        """Give live conversations the ids of the branches saved for them."""
        with self._cond:
            branched, self._branched = self._branched, []
        for live, old_id, target in branched:
            if live.id == old_id:
                live.id, live.parent, live.branched_at = (target.id, target.parent,
                                                          target.branched_at)
                self._followed.append((live, target))

    def follow_branches(self) -> list[tuple[Conversation, Conversation]]:
        """On the caller's thread: every live conversation that went on in a branch since the
        last call, with that branch (its id, parent and the messages they share)."""
        self._follow_branches()
        followed, self._followed = self._followed, []
        return followed

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending) or self._compact)
                if self._pending:
                    key, (snapshot, live) = next(iter(self._pending.items()))
                    del self._pending[key]
                    compact = False
                else:
                    compact, snapshot, live = True, None, None
                self._busy = True
            try:
                if snapshot is not None and live is not None:
                    written = self._writer.write(snapshot, key[1], live)
                    if written.id != snapshot.id:
                        with self._cond:
                            self._branched.append((live, snapshot.id, written))
                        self._on_branch()
                if compact:
                    self._writer.compact()
            except Exception as exc:  # noqa: BLE001 - reported; saving never ends the chat
                log.exception("autosave failed")
                self._on_error(exc)
            finally:
                with self._cond:
                    self._busy = False
                    if compact:
                        self._compact = False
                    self._cond.notify_all()
