"""The prompt box's history across sessions, and the message left unsent when chatui ended.

Up in the prompt box recalls earlier prompts; they were kept in memory only, so a new session
started with none (ollama's and a shell's history survive a restart), and a long message typed
but not sent was lost when chatui quit, its terminal closed or it stopped on an error. Each
prompt sent (message or command) is now appended to ``.prompt-history.jsonl`` beside the
conversations, one JSON line each:

    {"prompt": "text"}      // sent
    {"draft": "text"}       // in the box when chatui ended ("" once a draft put back is gone)
    {"notebook": "text"}    // raw mode's notebook when chatui ended (its document)

A draft on the last prompt or draft line is put back in the box at the next start (a later
prompt means it was superseded, and it is then only one more entry for Up). The last notebook
line's text is what raw mode's notebook opens with next (it opened empty: a document typed or
edited since its last continuation was lost). The file keeps the last
``MAX_PROMPTS`` entries: it is rewritten to them when it holds twice as many. Lines that do not
parse (a write cut short) are skipped. Reading and writing never raise: a history that cannot
be read or written is logged, and the box works as before. :class:`Carryover` is the one
owner of what a session reads from the file and writes back to it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = ".prompt-history.jsonl"
MAX_PROMPTS = 1000


@dataclass(frozen=True)
class Recalled:
    """What the history file holds: the prompts, oldest first, and the draft to put back."""

    prompts: list[str] = field(default_factory=list)
    draft: str = ""
    notebook: str = ""
    """Raw mode's notebook text when chatui last ended with it open."""


def history_path(directory: Path) -> Path:
    return directory / FILE_NAME


def _entries(path: Path) -> list[tuple[str, str]]:
    """(kind, text) for every line that parses, in order; [] when there is no file."""
    try:
        raw = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    except OSError as exc:
        log.warning("the prompt history %s could not be read: %s", path, exc)
        return []
    out: list[tuple[str, str]] = []
    for line in raw.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and len(item) == 1:
            [(kind, text)] = item.items()
            if isinstance(text, str) and (kind in ("draft", "notebook")
                                          or kind == "prompt" and text.strip()):
                out.append((kind, text))
    return out


def load(directory: Path) -> Recalled:
    """The last ``MAX_PROMPTS`` prompts of the history in ``directory`` (consecutive repeats
    once), and the draft left on its last line."""
    everything = _entries(history_path(directory))
    notebook = next((text for kind, text in reversed(everything) if kind == "notebook"), "")
    entries = [e for e in everything if e[0] != "notebook"]
    draft = ""
    if entries and entries[-1][0] == "draft":
        draft = entries.pop()[1]
    prompts: list[str] = []
    for _, text in entries[-MAX_PROMPTS:]:
        if text.strip() and (not prompts or prompts[-1] != text):
            prompts.append(text)
    return Recalled(prompts, draft, notebook)


def append(directory: Path, text: str, *, kind: str = "prompt") -> bool:
    """One line added to the history: a ``prompt`` sent, the unsent ``draft`` ("" says a
    draft put back is gone) or the ``notebook``'s text; whether it was written. Compacts the
    file to its last ``MAX_PROMPTS`` entries when it holds twice as many."""
    if kind == "prompt" and not text.strip():
        return False
    path = history_path(directory)
    line = json.dumps({kind: text}, ensure_ascii=False) + "\n"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(path, "a+b") as f:  # (writes go to the end whatever the position)
            if f.seek(0, 2):
                f.seek(-1, 2)
                if f.read(1) != b"\n":  # (a write cut short before)
                    line = "\n" + line
            f.write(line.encode("utf-8"))
            size = f.tell()
        if size > 4096 * 64:  # (a cheap guard before counting lines)
            _compact(path)
        return True
    except OSError as exc:
        log.warning("the prompt history %s could not be written: %s", path, exc)
        return False


def _compact(path: Path) -> None:
    from .transcript import TranscriptError, atomic_write

    entries = _entries(path)
    if len(entries) <= 2 * MAX_PROMPTS:
        return
    last = entries[-MAX_PROMPTS:]
    notebook = [e for e in entries if e[0] == "notebook"][-1:]
    if notebook and notebook[0] not in last:  # (the notebook's document stays)
        last = notebook + last
    kept = "".join(json.dumps({kind: text}, ensure_ascii=False) + "\n" for kind, text in last)
    try:
        atomic_write(path, kept.encode("utf-8"))
    except TranscriptError as exc:
        log.warning("the prompt history %s could not be compacted: %s", path, exc)


class Carryover:
    """What a session carries over to the next one, with one owner: the prompts for Up, the
    message left unsent and raw mode's notebook document. The chat screen reads it at start
    and hands it the box's text as chatui ends (plain strings; ``directory`` None: autosave is
    off, and nothing is read or written)."""

    def __init__(self, directory: Path | None) -> None:
        self.directory = directory
        recalled = load(directory) if directory is not None else Recalled()
        self.prompts = recalled.prompts
        """Earlier sessions' prompts, oldest first."""
        self.notebook_text = recalled.notebook
        """Raw mode's notebook document while the notebook is closed (it opens with it): the
        last session's at first, then what the notebook held when it was closed (F4)."""
        self.notebook_from_before = bool(recalled.notebook.strip())
        """Whether ``notebook_text`` is still the last session's (the notebook says so)."""
        self._draft = recalled.draft if recalled.draft.strip() else ""
        self._draft_given = False
        self._notebook_kept = recalled.notebook

    def take_draft(self) -> str:
        """The message left unsent when chatui last ended ("" if none), once."""
        draft, self._draft = self._draft, ""
        self._draft_given = self._draft_given or bool(draft)
        return draft

    def sent(self, text: str) -> None:
        """A prompt was sent (a message or a command)."""
        if self.directory is not None:
            append(self.directory, text)
            self._draft_given = False  # (a later prompt supersedes the draft line)

    def at_exit(self, box: str, notebook: str | None) -> None:
        """As chatui ends: the box's text kept as the draft (or the draft given back and since
        emptied marked gone, so it does not come back again), and the notebook's document
        (``notebook``: the open notebook's text, None when it is closed) where it changed."""
        if self.directory is None:
            return
        if box.strip() or self._draft_given:
            append(self.directory, box if box.strip() else "", kind="draft")
        document = self.notebook_text if notebook is None else notebook
        if document != self._notebook_kept:
            append(self.directory, document, kind="notebook")
            self._notebook_kept = document
