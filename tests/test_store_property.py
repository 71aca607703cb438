"""Random sequences of what a user does to their conversations, at the store's level: after
every step, every message that was ever completed is still on disk in some transcript (unless
the user deleted every file holding it), and every file on disk loads.

The actions are the app's: a new exchange (autosaved when the reply starts and when it ends),
``/retry`` (the last reply replaced, or, as the app does since issue 18, a new sibling),
switching siblings (Alt+Left/Right: the chosen branch must come back as it was saved, from a
journal line), ``/edit`` (the last exchange taken back), ``/save PATH``,
``/load`` of any file (through today's ``load_transcript`` or through ``open_transcript``), an
autosave, ``/clear``, deleting a file from the history, quitting, and a kill (the in-memory
state dropped). Plain ``random`` with fixed seeds, so a failure replays exactly.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chatui.autosaver import Autosaver
from chatui.conversation import Conversation, Reply
from chatui.transcript import (
    TranscriptError, autosave_path, delete_transcript, load_transcript, open_transcript,
    save_transcript,
)
from inference.settings import SamplingParams
from inference.types import Token

SEEDS = range(40)
STEPS = 40


def _texts(conv: Conversation) -> set[str]:
    out = set()
    for e in conv.all_entries():  # every branch (issue 18)
        out.add(e.text) if e.role == "user" else out.update(r.text for r in e.replies)
    return out


class World:
    """The user's session and the files; ``required`` is what must be on disk."""

    def __init__(self, root: Path, rng: random.Random) -> None:
        self.rng = rng
        self.data = root / "data"
        self.exports = root / "exports"
        self.exports.mkdir(parents=True)
        self.errors: list[Exception] = []
        self.saver = Autosaver(self.errors.append)
        self.conv = Conversation()
        self.required: set[str] = set()
        self.n = 0
        self.log: list[str] = []

    # ---- the files ----

    def files(self) -> list[Path]:
        found = []
        for d in (self.data, self.exports):
            if d.exists():
                found += sorted(p for p in d.iterdir() if p.suffix == ".json")
        return found

    def on_disk(self) -> dict[Path, set[str]]:
        return {p: _texts(load_transcript(p)) for p in self.files()}

    def autosave(self) -> None:
        self.saver.save(self.conv, self.data)
        if self.rng.random() < 0.2:
            assert self.saver.flush(timeout=30)  # journals folded (quit, /save, /history)
        else:
            assert self.saver.wait(timeout=30)  # journal lines, as between two replies
        if self.conv.entries and not self.errors:  # the chosen branch is the one on disk
            disk = load_transcript(autosave_path(self.conv, self.data))
            assert [e.node for e in disk.entries] == [e.node for e in self.conv.entries], (
                f"after {self.log}")

    def _reply(self) -> Reply:
        self.n += 1
        text = f"a{self.n}"
        return Reply(SamplingParams(), text=text, tokens=[Token(0, self.n, text, -0.5, 0.5)],
                     finish_reason="stop")

    # ---- actions ----

    def exchange(self) -> None:
        self.n += 1
        user = f"u{self.n}"
        self.conv.add_user(user)
        entry = self.conv.add_assistant([SamplingParams()])
        self.autosave()  # ResponseStarted: the prompt is kept even if the reply never ends
        entry.replies[0] = self._reply()
        entry.text = entry.replies[0].text
        self.autosave()  # ResponseComplete
        self.required |= {user, entry.text}

    def retry(self) -> None:
        if not self.conv.entries or self.conv.entries[-1].role != "assistant":
            return
        entry = self.conv.entries[-1]
        entry.replies = [self._reply()]
        entry.text = entry.replies[0].text
        self.autosave()
        self.required.add(entry.text)

    def retry_sibling(self) -> None:
        if not self.conv.entries or self.conv.entries[-1].role != "assistant":
            return
        self.conv.rewind(self.conv.entries[-1])
        entry = self.conv.add_assistant([SamplingParams()])
        entry.replies[0] = self._reply()
        self.autosave()
        self.required.add(entry.text)

    def switch(self) -> None:
        """Alt+Left/Right at a random message with alternatives (sometimes twice before a
        save, sometimes a switch and a new exchange in one save)."""
        for _ in range(self.rng.choice([1, 1, 2])):
            choices = [e for e in self.conv.entries if len(self.conv.siblings(e)) > 1]
            if not choices:
                return
            self.conv.step_sibling(self.rng.choice(choices), self.rng.choice([-1, 1]))
        if self.rng.random() < 0.3:
            self.exchange()
        else:
            self.autosave()

    def edit(self) -> None:
        if len(self.conv.entries) >= 2:
            self.conv.truncate(len(self.conv.entries) - 2)

    def save_as(self) -> None:
        if self.conv.entries:
            try:
                save_transcript(self.conv, self.exports / f"copy{self.rng.randrange(4)}.json")
            except TranscriptError as e:  # the file holds more: refused, with one sentence
                assert "choose another name" in str(e)

    def load(self) -> None:
        files = self.files()
        if not files:
            return
        path = self.rng.choice(files)
        opener = self.rng.choice([load_transcript, lambda p: open_transcript(p, self.data)])
        conv = opener(path)
        self.saver.save(self.conv, self.data)  # the app saves the old conversation first
        self.conv = conv

    def clear(self) -> None:
        self.conv = Conversation()

    def delete(self) -> None:
        files = [p for p in self.files() if p.parent == self.data]
        if not files:
            return
        path = self.rng.choice(files)
        gone = _texts(load_transcript(path))
        delete_transcript(path)
        kept = set().union(*self.on_disk().values())
        self.required -= gone - kept  # the user chose to delete these

    def quit(self) -> None:
        self.autosave()
        self.kill()

    def kill(self) -> None:
        self.saver = Autosaver(self.errors.append)
        self.conv = Conversation()

    ACTIONS = {"exchange": 6, "retry": 2, "retry_sibling": 2, "switch": 3, "edit": 2, "save_as": 2, "load": 3, "autosave": 1,
               "clear": 1, "delete": 1, "quit": 1, "kill": 1}

    def step(self) -> None:
        name = self.rng.choices(list(self.ACTIONS), weights=list(self.ACTIONS.values()))[0]
        self.log.append(name)
        getattr(self, name)()

    def check(self) -> None:
        try:
            disk = self.on_disk()  # every file loads
        except TranscriptError as e:
            pytest.fail(f"after {self.log}: {e}")
        lost = self.required - set().union(*disk.values())
        assert not lost, f"after {self.log}: {sorted(lost)} are on disk nowhere"
        assert self.errors == [], f"after {self.log}"


@pytest.mark.parametrize("seed", SEEDS)
def test_no_sequence_of_actions_loses_a_message(tmp_path: Path, seed: int) -> None:
    world = World(tmp_path, random.Random(seed))
    for _ in range(STEPS):
        world.step()
        world.check()
