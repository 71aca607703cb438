"""The autosave journal: what changed is appended and fsynced, a torn or bad line loses only
itself (and what follows it), a kill mid-write loses at most the change being written, and
documents without a journal load as before."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chatui.transcript.writer as writer_mod
from chatui.autosaver import Autosaver
from chatui.conversation import Conversation
from chatui.transcript import (
    TranscriptError, autosave_path, list_transcripts, load_transcript, save_transcript,
)
from chatui.transcript.journal import journal_path
from chatui.transcript.store import write_document
from chatui.transcript.writer import AutosaveWriter
from inference.settings import SamplingParams
from inference.types import Alternative, Token, Usage

REPO = Path(__file__).resolve().parents[1]


def add_exchange(conv: Conversation, n: int, tokens: int = 20) -> None:
    """A user message and a finished reply of ``tokens`` tokens with alternatives."""
    conv.add_user(f"question {n}")
    entry = conv.add_assistant([SamplingParams(seed=n)])
    reply = entry.replies[0]
    reply.tokens = [Token(i, 100 + i, f" w{n}.{i}", -0.5, 1.25,
                          tuple(Alternative(j, f" a{j}", -2.0 - j) for j in range(5)))
                    for i in range(tokens)]
    reply.text = "".join(t.text for t in reply.tokens)
    reply.finish_reason = "stop"
    reply.usage = Usage(10, tokens, 0, 0.1, 40.0)
    entry.text = reply.text


def journaled(tmp_path: Path, exchanges: int = 3) -> tuple[AutosaveWriter, list[Conversation]]:
    """A conversation autosaved after each exchange; the snapshots written, in order."""
    w = AutosaveWriter()
    conv = Conversation(id="jj")
    written = []
    for n in range(exchanges):
        add_exchange(conv, n)
        snap = conv.snapshot()
        assert w.write(snap, tmp_path) is snap
        written.append(snap)
    return w, written


def test_later_saves_append_to_the_journal_and_load_back(tmp_path: Path) -> None:
    w, written = journaled(tmp_path, 4)
    path = autosave_path(written[-1], tmp_path)
    doc = json.loads(path.read_bytes())
    assert len(doc["messages"]) == 2 and isinstance(doc["rev"], str)  # the first save only
    lines = journal_path(path).read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 1 + 1 + 3  # header, three changes
    assert json.loads(lines[0])["base"] == doc["rev"]
    assert [json.loads(x)["at"] for x in lines[1:-1]] == [2, 4, 6]
    assert load_transcript(path) == written[-1]
    [summary] = list_transcripts(tmp_path)  # the journal is no transcript of its own
    assert summary.messages == 8 and summary.path == path


def test_a_changed_reply_and_metadata_are_journaled(tmp_path: Path) -> None:
    w, written = journaled(tmp_path, 2)
    conv = written[-1].snapshot()
    conv.entries[-1].replies[0].text += " more"  # e.g. /continue
    conv.entries[-1].replies[0].tokens.append(Token(20, 7, " more", -0.1, 0.1))
    conv.title, conv.system_prompt = "New title", "Be terse."
    conv.model.name = "other-model"
    w.write(conv, tmp_path)
    path = autosave_path(conv, tmp_path)
    last = json.loads(journal_path(path).read_bytes().split(b"\n")[-2])
    assert last["at"] == 3 and len(last["messages"]) == 1 and last["title"] == "New title"
    assert load_transcript(path) == conv


def test_flush_folds_the_journal_into_the_document(tmp_path: Path) -> None:
    saver = Autosaver(lambda e: None)
    conv = Conversation(id="fold")
    for n in range(3):
        add_exchange(conv, n)
        saver.save(conv, tmp_path)
        time.sleep(0.05)
    assert saver.flush(timeout=10)
    path = autosave_path(conv, tmp_path)
    assert not journal_path(path).exists()
    assert len(json.loads(path.read_bytes())["messages"]) == 6
    assert load_transcript(path) == conv


def test_an_explicit_save_removes_the_journal_and_a_stale_one_is_ignored(tmp_path: Path) -> None:
    w, written = journaled(tmp_path, 3)
    path = autosave_path(written[-1], tmp_path)
    stale = journal_path(path).read_bytes()
    write_document(written[0], path)  # a whole document again (no rev): the journal goes
    assert not journal_path(path).exists()
    journal_path(path).write_bytes(stale)  # as if a kill hit between document and removal
    assert load_transcript(path) == written[0]
    # the writer notices the change behind its back and starts over from the file
    conv = written[-1].snapshot()
    add_exchange(conv, 9)
    assert w.write(conv, tmp_path).id == conv.id
    assert load_transcript(path) == conv


def test_a_file_cut_at_every_byte_of_the_last_line_loses_only_that_change(tmp_path: Path) -> None:
    w, written = journaled(tmp_path, 3)
    path = autosave_path(written[-1], tmp_path)
    jpath = journal_path(path)
    full = jpath.read_bytes()
    start = full.rstrip(b"\n").rfind(b"\n") + 1  # where the last line begins
    for cut in range(start, len(full) + 1):
        jpath.write_bytes(full[:cut])
        want = written[-1] if cut == len(full) else written[-2]
        assert load_transcript(path) == want, cut
    for cut in range(0, start, 97):  # earlier cuts keep every whole line before them
        jpath.write_bytes(full[:cut])
        got = load_transcript(path)
        assert got in written, cut


def test_a_bad_line_ends_the_journal(tmp_path: Path) -> None:
    w, written = journaled(tmp_path, 4)
    path = autosave_path(written[-1], tmp_path)
    jpath = journal_path(path)
    lines = jpath.read_bytes().split(b"\n")
    for bad in (b'{"at": 99, "messages": []}', b"\xff\xfe", b'{"at": 2, "messages": [{"role": '
                b'"robot", "text": "", "time": 0}]}', b"[1, 2]", b'{"at": 2}'):
        jpath.write_bytes(b"\n".join(lines[:2] + [bad] + lines[3:]))
        assert load_transcript(path) == written[1]  # the second change and after: ignored


def test_a_failed_append_is_cut_off_and_the_next_save_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w, written = journaled(tmp_path, 2)
    path = autosave_path(written[-1], tmp_path)
    before = journal_path(path).read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    conv = written[-1].snapshot()
    add_exchange(conv, 5)
    monkeypatch.setattr(writer_mod.os, "write", half_then_full)
    with pytest.raises(TranscriptError, match="the disk is full; the saved conversation is "
                                              "unchanged"):
        w.write(conv, tmp_path)
    monkeypatch.undo()
    assert journal_path(path).read_bytes() == before  # no half line for the next to glue onto
    assert load_transcript(path) == written[-1]
    w.write(conv, tmp_path)  # reads the files back, then appends again
    assert load_transcript(path) == conv
    assert journal_path(path).read_bytes().startswith(before)


def test_an_invalid_change_writes_nothing(tmp_path: Path) -> None:
    w, written = journaled(tmp_path, 2)
    path = autosave_path(written[-1], tmp_path)
    before = journal_path(path).read_bytes()
    conv = written[-1].snapshot()
    add_exchange(conv, 3)
    conv.entries[-1].replies[0].tokens[0] = Token(0, 1, "x", 0.5, 1.0)  # a logprob above 0
    with pytest.raises(TranscriptError, match="logprob"):
        w.write(conv, tmp_path)
    assert journal_path(path).read_bytes() == before


def test_documents_without_a_journal_load_as_before(tmp_path: Path) -> None:
    conv = Conversation(id="plain")
    add_exchange(conv, 0)
    path = tmp_path / "plain.json"
    save_transcript(conv, path)
    assert "rev" not in json.loads(path.read_bytes())
    journal_path(path).write_bytes(b'{"format": "chatui-journal", "version": 1, "id": "plain", '
                                   b'"base": null}\n{"at": 0, "messages": []}\n')
    assert load_transcript(path) == conv  # a journal needs its document's rev


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                       max_size=4), st.binary(max_size=40))
def test_damaged_journals_never_crash(cut: int, flips: list, tail: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        _damage_and_load(Path(d), cut, flips, tail)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                       max_size=4), st.binary(max_size=40))
def test_damaged_journals_with_retries_and_switches_never_crash(cut: int, flips: list,
                                                                 tail: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        _damage_and_load(Path(d), cut, flips, tail, switches=True)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                       max_size=4), st.binary(max_size=40))
def test_damaged_journals_with_picks_never_crash(cut: int, flips: list, tail: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        _damage_and_load(Path(d), cut, flips, tail, picks=True)


def _damage_and_load(tmp_path: Path, cut: int, flips: list, tail: bytes,
                     switches: bool = False, picks: bool = False) -> None:
    if picks:  # lines that choose another column of a comparison
        w, conv, path = _compared(tmp_path, columns=3, tokens=4)
        for column in (2, 1):
            conv.entries[3].chosen = column
            w.write(conv.snapshot(), tmp_path, conv)
        written = [conv]
    elif switches:  # lines that graft a sibling and lines that select another branch
        w, conv, written = branched(tmp_path)
        conv.step_sibling(conv.entries[3], -1)
        w.write(conv.snapshot(), tmp_path, conv)
        conv.step_sibling(conv.entries[3], +1)
        add_exchange(conv, 20)
        w.write(conv.snapshot(), tmp_path, conv)
    else:
        w, written = journaled(tmp_path, 3)
    path = autosave_path(written[-1], tmp_path)
    data = bytearray(journal_path(path).read_bytes())
    data = data[: cut % (len(data) + 1)]
    for pos, byte in flips:
        if data:
            data[pos % len(data)] = byte
    journal_path(path).write_bytes(bytes(data) + tail)
    assert load_transcript(path) is not None  # never raises: a bad journal only ends early


KILL_CHILD = """
import os, sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from chatui.conversation import Conversation
from chatui.transcript.writer import AutosaveWriter
import chatui.transcript.writer as wm
from tests.test_journal import add_exchange

real_write = os.write
def slow_write(fd, data):  # the real write, in small pieces, so that a kill lands inside
    print("writing", flush=True)
    n = 0
    for start in range(0, len(data), 4096):
        n += real_write(fd, data[start:start + 4096])
        time.sleep(0.002)
    return n

w = AutosaveWriter()
conv = Conversation(id="kill")
add_exchange(conv, 0)
w.write(conv.snapshot(), Path({dir!r}))
wm.os.write = slow_write
n = 1
while True:
    add_exchange(conv, n, tokens=400)
    w.write(conv.snapshot(), Path({dir!r}))
    print("saved", n, flush=True)
    n += 1
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_killed_while_journaling_loses_at_most_the_change_being_written(tmp_path: Path) -> None:
    rng = random.Random(7)
    torn = 0
    for round_ in range(5):
        d = tmp_path / str(round_)
        src = KILL_CHILD.format(repo=str(REPO), dir=str(d))
        proc = subprocess.Popen([sys.executable, "-c", src], stdout=subprocess.PIPE, text=True,
                                cwd=REPO)
        assert proc.stdout is not None
        saved = 0
        target = rng.randint(1, 4)
        while saved < target:
            line = proc.stdout.readline()
            assert line, "the child died"
            if line.startswith("saved"):
                saved = int(line.split()[1])
        assert proc.stdout.readline().startswith("writing")  # the next line is being written
        time.sleep(rng.uniform(0.0, 0.03))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        [path] = [p for p in d.iterdir() if p.suffix == ".json"]
        conv = load_transcript(path)
        assert len(conv.entries) in (2 * saved + 2, 2 * saved + 4)  # the last change, or not
        assert [e.text for e in conv.entries[::2]] == [f"question {n}"
                                                      for n in range(len(conv.entries) // 2)]
        torn += not journal_path(path).read_bytes().endswith(b"\n")
    assert torn >= 2  # the kills really cut lines short


KILL_SWITCH_CHILD = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
from pathlib import Path
from chatui.conversation import Conversation
from chatui.transcript.writer import AutosaveWriter
import chatui.transcript.writer as wm
from tests.test_journal import _reply_to, add_exchange

real_write = os.write
def slow_write(fd, data):
    print("writing", flush=True)
    n = 0
    for start in range(0, len(data), 512):
        n += real_write(fd, data[start:start + 512])
        time.sleep(0.002)
    return n

w = AutosaveWriter()
conv = Conversation(id="kills")
add_exchange(conv, 0)
w.write(conv.snapshot(), Path({dir!r}), conv)
wm.os.write = slow_write
n = 1
while True:
    forks = [e for e in conv.entries if len(conv.siblings(e)) > 1]
    if n % 3 == 0 and forks:  # Alt+Left/Right at the first message with alternatives
        conv.step_sibling(forks[0], -1 if n % 2 else 1)
    elif n % 3 == 1:  # /retry: a sibling
        conv.rewind(conv.entries[-1])
        _reply_to(conv, n, tokens=60)
    else:
        add_exchange(conv, n, tokens=60)
    print("state", json.dumps([e.node for e in conv.entries]), flush=True)
    w.write(conv.snapshot(), Path({dir!r}), conv)
    print("saved", n, flush=True)
    n += 1
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_killed_while_journaling_switches_loads_the_branch_saved_or_being_saved(
        tmp_path: Path) -> None:
    """Issue 18 with issue 21's journal: retries (siblings), sibling switches and new
    exchanges journaled one after another; a kill at any moment leaves a file that loads
    with the chosen branch last saved or the one being saved, and every reply saved."""
    rng = random.Random(11)
    for round_ in range(6):
        d = tmp_path / str(round_)
        src = KILL_SWITCH_CHILD.format(repo=str(REPO), dir=str(d))
        proc = subprocess.Popen([sys.executable, "-c", src], stdout=subprocess.PIPE, text=True,
                                cwd=REPO)
        assert proc.stdout is not None
        states: list[list[str]] = []
        saved = 0
        target = rng.randint(3, 9)
        while saved < target:
            line = proc.stdout.readline()
            assert line, "the child died"
            if line.startswith("state"):
                states.append(json.loads(line.split(" ", 1)[1]))
            elif line.startswith("saved"):
                saved = int(line.split()[1])
        time.sleep(rng.uniform(0.0, 0.03))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for line in proc.stdout.read().splitlines():  # what it printed before it died
            if line.startswith("state"):
                states.append(json.loads(line.split(" ", 1)[1]))
            elif line.startswith("saved"):
                saved = int(line.split()[1])
        proc.stdout.close()
        [path] = [p for p in d.iterdir() if p.suffix == ".json"]
        conv = load_transcript(path)
        got = [e.node for e in conv.entries]
        assert got in states[saved - 1:saved + 1], round_  # the last saved, or the next
        nodes = {e.node for e in conv.all_entries()}
        assert set().union(*map(set, states[:saved])) <= nodes  # every message saved


def test_the_next_session_goes_on_with_the_journal_after_a_torn_line(tmp_path: Path) -> None:
    """After a kill cut the last line short, the next session's writer reads the files once,
    cuts the torn piece off, and appends after what loads (no whole-document rewrite)."""
    w, written = journaled(tmp_path, 3)
    path = autosave_path(written[-1], tmp_path)
    jpath = journal_path(path)
    full = jpath.read_bytes()
    jpath.write_bytes(full[:-25])  # the third exchange's line, torn
    doc_before = path.read_bytes()
    conv = load_transcript(path)
    assert conv == written[-2]
    add_exchange(conv, 7)
    assert AutosaveWriter().write(conv.snapshot(), tmp_path).id == conv.id
    assert path.read_bytes() == doc_before  # the document was not rewritten
    assert load_transcript(path) == conv
    torn_start = full.rstrip(b"\n").rfind(b"\n") + 1
    assert jpath.read_bytes().startswith(full[:torn_start])


def test_opening_through_the_autosaver_needs_no_reading_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w, written = journaled(tmp_path, 3)
    path = autosave_path(written[-1], tmp_path)
    saver = Autosaver(lambda e: pytest.fail(str(e)))
    conv = saver.open(path, tmp_path)
    assert conv == written[-1] and conv.id == "jj"

    def no_reading(p: Path) -> None:
        raise AssertionError("the writer read the files back")

    monkeypatch.setattr(writer_mod, "load_with_document", no_reading)
    add_exchange(conv, 8)
    saver.save(conv, tmp_path)
    assert saver.flush(timeout=10)
    assert load_transcript(path) == conv
    copy = tmp_path / "copy.json"
    save_transcript(written[0], copy)
    monkeypatch.undo()
    opened = saver.open(copy, tmp_path)  # an older copy opens in its home's tree (issue 18)
    assert opened.id == "jj" and opened.parent == ""
    assert opened.entries == written[0].entries and len(opened.all_entries()) == len(
        conv.all_entries())


def test_the_writer_forgets_conversations_that_are_gone(tmp_path: Path) -> None:
    import gc

    saver = Autosaver(lambda e: pytest.fail(str(e)))
    conv = Conversation()
    add_exchange(conv, 0)
    saver.save(conv, tmp_path)
    assert saver.flush(timeout=10) and len(saver._writer._written) == 1
    del conv  # /clear or /load: the old conversation is garbage
    gc.collect()
    other = Conversation()
    add_exchange(other, 1)
    saver.save(other, tmp_path)
    assert saver.flush(timeout=10)
    assert [k[0] for k in saver._writer._written] == [other.id]  # no old snapshot kept alive


def _reply_to(conv: Conversation, n: int, tokens: int = 20) -> None:
    """A finished reply after the last message (a retry when the path ends before one)."""
    entry = conv.add_assistant([SamplingParams(seed=n)])
    reply = entry.replies[0]
    reply.tokens = [Token(i, 300 + i, f" r{n}.{i}", -0.5, 1.0,
                          tuple(Alternative(j, f" b{j}", -2.0 - j) for j in range(3)))
                    for i in range(tokens)]
    reply.text = "".join(t.text for t in reply.tokens)
    reply.finish_reason = "stop"


def branched(tmp_path: Path) -> tuple[AutosaveWriter, Conversation, list[Conversation]]:
    """Four exchanges, the second reply retried (the first version keeps an exchange of its
    own below it), autosaved after each change as the app does; the snapshots written."""
    w = AutosaveWriter()
    conv = Conversation(id="sw")
    written: list[Conversation] = []

    def save() -> None:
        snap = conv.snapshot()
        assert w.write(snap, tmp_path, conv) is snap
        written.append(snap)

    for n in range(3):
        add_exchange(conv, n)
        save()
    conv.rewind(conv.entries[3])  # /retry of the second reply
    _reply_to(conv, 10)
    save()
    add_exchange(conv, 11)
    save()
    return w, conv, written


def _nodes(conv: Conversation) -> list[str]:
    return [e.node for e in conv.entries]


def test_a_retry_and_a_sibling_switch_are_journal_lines(tmp_path: Path) -> None:
    """Issue 18: switching siblings (Alt+Left/Right, /sibling) appends a line naming the
    branch switched to, instead of rewriting the document (or the path below the switch);
    a reload gives the same chosen path. A retry (a new sibling) is a line too."""
    w, conv, written = branched(tmp_path)
    path = autosave_path(conv, tmp_path)
    doc = path.read_bytes()
    assert len(json.loads(doc)["messages"]) == 2  # the first save only: the rest are lines
    retry = json.loads(journal_path(path).read_bytes().split(b"\n")[-3])
    assert retry["at"] == 3 and [m["sibling"] for m in retry["messages"]] == [1]
    switched = conv.step_sibling(conv.entries[3], -1)  # back to the first reply
    assert len(conv.entries) == 6 and conv.entries[-1].text.startswith(" w2.")
    assert w.write(conv.snapshot(), tmp_path, conv).id == conv.id
    assert path.read_bytes() == doc  # not rewritten
    line = journal_path(path).read_bytes().split(b"\n")[-2]
    assert json.loads(line) == {"select": conv.entries[-1].node, "at": 6, "messages": []}
    loaded = load_transcript(path)
    assert loaded == conv and _nodes(loaded) == _nodes(conv)
    assert switched is conv.entries[3]
    # back again, and a new exchange, in one save: one line, the new messages only
    conv.step_sibling(conv.entries[3], +1)
    add_exchange(conv, 12)
    assert w.write(conv.snapshot(), tmp_path, conv).id == conv.id
    assert path.read_bytes() == doc
    line = json.loads(journal_path(path).read_bytes().split(b"\n")[-2])
    assert line["select"] == conv.entries[5].node and line["at"] == 6
    assert [m["text"] for m in line["messages"]] == ["question 12", conv.entries[-1].text]
    loaded = load_transcript(path)
    assert loaded == conv and _nodes(loaded) == _nodes(conv)
    # a switch inside a branch that is not shown keeps that branch's own choice
    conv.step_sibling(conv.entries[3], -1)
    assert w.write(conv.snapshot(), tmp_path, conv).id == conv.id
    conv.step_sibling(conv.entries[3], +1)  # back: the path goes on to the newest exchange
    assert len(conv.entries) == 8
    assert w.write(conv.snapshot(), tmp_path, conv).id == conv.id
    assert path.read_bytes() == doc
    loaded = load_transcript(path)
    assert loaded == conv and _nodes(loaded) == _nodes(conv)


def test_a_journal_cut_in_a_switch_line_loads_the_branch_before_or_after(tmp_path: Path) -> None:
    w, conv, written = branched(tmp_path)
    before = conv.snapshot()
    conv.step_sibling(conv.entries[3], -1)
    w.write(conv.snapshot(), tmp_path, conv)
    path = autosave_path(conv, tmp_path)
    jpath = journal_path(path)
    full = jpath.read_bytes()
    start = full.rstrip(b"\n").rfind(b"\n") + 1
    for cut in range(start, len(full) + 1):
        jpath.write_bytes(full[:cut])
        got = load_transcript(path)
        want = conv if cut == len(full) else before
        assert got == want and _nodes(got) == _nodes(want), cut


def test_a_switch_line_naming_no_message_ends_the_journal(tmp_path: Path) -> None:
    w, conv, written = branched(tmp_path)
    path = autosave_path(conv, tmp_path)
    with open(journal_path(path), "ab") as f:
        f.write(b'{"select": "nosuchnode", "at": 0, "messages": []}\n')
    loaded = load_transcript(path)
    assert loaded == written[-1] and _nodes(loaded) == _nodes(conv)


def test_what_no_line_can_say_writes_the_document(tmp_path: Path) -> None:
    """A message off the chosen path changed (no line writes it): the document in full."""
    w, conv, written = branched(tmp_path)
    path = autosave_path(conv, tmp_path)
    doc = path.read_bytes()
    hidden = conv.siblings(conv.entries[3])[0]
    hidden.replies[0].text += " changed"
    hidden.replies[0].tokens.append(Token(20, 9, " changed", -0.1, 0.1))
    w.write(conv.snapshot(), tmp_path, conv)
    assert path.read_bytes() != doc and not journal_path(path).exists()
    loaded = load_transcript(path)
    assert loaded == conv and _nodes(loaded) == _nodes(conv)


def test_the_readme_describes_this_journal_and_the_fan_out_flag() -> None:
    from chatui.transcript.journal import JOURNAL_VERSION

    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert f'{{"format": "chatui-journal", "version": {JOURNAL_VERSION},' in text
    assert '"select": <node id>' in text and '"fan_out": true' in text
    assert '"chosen": {<node id>: column}' in text


def _compared(tmp_path: Path, columns: int = 8, tokens: int = 64
              ) -> tuple[AutosaveWriter, Conversation, Path]:
    """An exchange, then a comparison of ``columns`` settings with a follow-up below it,
    autosaved after each as the app does."""
    w = AutosaveWriter()
    conv = Conversation(id="cmp")
    add_exchange(conv, 0)
    w.write(conv.snapshot(), tmp_path, conv)
    conv.add_user("compare these")
    entry = conv.add_assistant([SamplingParams(seed=c) for c in range(columns)])
    for c, reply in enumerate(entry.replies):
        reply.tokens = [Token(i, 100 + i, f" c{c}.{i}", -0.5, 1.25,
                              tuple(Alternative(j, f" a{j}", -2.0 - j) for j in range(5)))
                        for i in range(tokens)]
        reply.text = "".join(t.text for t in reply.tokens)
        reply.finish_reason = "stop"
    w.write(conv.snapshot(), tmp_path, conv)
    conv.add_user("and then?")
    w.write(conv.snapshot(), tmp_path, conv)
    return w, conv, autosave_path(conv, tmp_path)


def test_a_pick_of_a_column_is_a_line_of_a_few_bytes(tmp_path: Path) -> None:
    """F6 / /pick / a click on a column's header gives a comparison another chosen column:
    the journal line says so in a few bytes (it held the whole group again, every column's
    tokens: 1.13 MB a press at 8 columns of 512 tokens with top-5); a reload, and a reload of
    a line cut at any byte, gives the column chosen then or before."""
    w, conv, path = _compared(tmp_path)
    group = conv.entries[3]
    doc = path.read_bytes()
    jpath = journal_path(path)
    before_pick = conv.snapshot()
    for column in (5, 2, 2, 0):  # (the same column twice: nothing to write the second time)
        size = jpath.stat().st_size
        group.chosen = column
        assert w.write(conv.snapshot(), tmp_path, conv).id == conv.id
        assert path.read_bytes() == doc  # not rewritten
        added = jpath.read_bytes()[size:]
        if column == 2 and added == b"":
            continue
        assert json.loads(added) == {"at": len(conv.entries), "messages": [],
                                     "chosen": {group.node: column}}, added
        assert len(added) < 100
        loaded = load_transcript(path)
        assert loaded == conv and loaded.entries[3].chosen == column
        assert loaded.entries[3].text == group.replies[column].text
    assert json.loads(jpath.read_bytes().split(b"\n")[-2])["chosen"] == {group.node: 0}
    # a line cut at any byte: the pick before it or the one it writes
    full = jpath.read_bytes()
    start = full.rstrip(b"\n").rfind(b"\n") + 1
    group.chosen = 2
    before = conv.snapshot()
    group.chosen = 0
    for cut in range(start, len(full) + 1):
        jpath.write_bytes(full[:cut])
        got = load_transcript(path)
        assert got == (conv if cut == len(full) else before), cut
    assert before_pick.entries[3].chosen == 0  # (snapshots are not changed by a pick)
    # and a pick together with a new message is one line with both
    group.chosen = 7
    add_exchange(conv, 9)
    jpath.write_bytes(full)
    w2 = AutosaveWriter()
    assert w2.write(conv.snapshot(), tmp_path, conv).id == conv.id
    line = json.loads(jpath.read_bytes().split(b"\n")[-2])
    assert line["chosen"] == {group.node: 7} and len(line["messages"]) == 2
    assert load_transcript(path) == conv


def test_a_pick_naming_no_group_or_column_ends_the_journal(tmp_path: Path) -> None:
    w, conv, path = _compared(tmp_path, columns=3, tokens=4)
    held = load_transcript(path)
    group = conv.entries[3]
    for bad in ({"nosuchnode": 1}, {group.node: 3}, {group.node: -1}, {group.node: "1"},
                {conv.entries[2].node: 0}, [group.node, 1], {group.node: True}):
        with open(journal_path(path), "ab") as f:
            f.write(json.dumps({"at": 5, "messages": [], "chosen": bad}).encode() + b"\n")
            f.write(json.dumps({"at": 5, "messages": [], "title": "after"}).encode() + b"\n")
        loaded = load_transcript(path)
        assert loaded == held and loaded.title != "after", bad
        jpath = journal_path(path)
        jpath.write_bytes(b"\n".join(jpath.read_bytes().split(b"\n")[:-3]) + b"\n")
