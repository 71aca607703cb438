"""Issue 14's promise, checked by random use of the app: whatever a user does (send, stop,
retry, edit, save a copy, load a copy or a listed conversation, delete from the history,
compare and pick, clear, quit and come back), every message that was ever completed is still on
disk in some transcript, and every transcript on disk loads. Issue 18's: with continuing from
an alternative token, sibling navigation (/sibling prev, /sibling next) and opening branches from the tree
view too, every reply completed in the conversation open is in its tree (reachable on
screen), and the screen shows exactly the conversation's path.

The app runs under the pilot with a scripted engine whose every reply is unique, so a text
found on disk can only be that reply. The store-level twin (``test_store_property.py``) drives
the transcript functions themselves, with kills, many more steps and seeds.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

import chatui.transcript as tr
from test_app import config_dir, make_app, send, settle, tap  # noqa: F401

SEEDS = range(4)
STEPS = 14
ACTIONS = ("send", "send", "send", "stop", "retry", "edit", "save", "load", "history_load",
           "delete", "compare", "clear", "quit", "fork", "prev", "next", "tree")


def _all_texts(folders: list[Path]) -> tuple[set[str], list[str]]:
    """Every user text and reply text in every transcript under ``folders`` (recursively,
    the history's ``deleted/`` folder included), and the files that failed to load."""
    texts: set[str] = set()
    broken: list[str] = []
    for folder in folders:
        for path in sorted(folder.rglob("*.json")):
            try:
                conv = tr.load_transcript(path)
            except tr.TranscriptError as exc:
                broken.append(f"{path}: {exc}")
                continue
            for entry in conv.all_entries():  # every branch of the tree (issue 18)
                if entry.role == "user":
                    texts.add(entry.text)
                texts.update(r.text for r in entry.replies)
    return texts, broken


@pytest.mark.parametrize("seed", SEEDS)
async def test_random_use_never_loses_a_completed_message(seed, tmp_path, config_dir):  # noqa: F811
    rng = random.Random(seed)
    counter = itertools.count()
    completed: set[str] = set()
    copies = tmp_path / "copies"
    copies.mkdir()

    def reply(request, row):
        return f"answer-{next(counter)} " + "word " * 12

    def fresh_app():
        return make_app(reply, delay_s=0.004)

    app = fresh_app()
    here: set[str] = set()
    """The replies completed in the conversation open now: all in its tree (on screen)."""
    data = None
    step = 0
    while step < STEPS:
        async with app.run_test(size=(110, 40)) as pilot:
            directory = app.config.transcripts_dir()
            data = Path(directory) if directory is not None else tr.data_dir()
            while step < STEPS:
                step += 1
                action = rng.choice(ACTIONS)
                conv = app.chat.state.conversation
                if action in ("send", "compare"):
                    if action == "compare":
                        await send(pilot, app, "/compare temperature=0 | temperature=1")
                    text = f"msg-{seed}-{step}"
                    await send(pilot, app, text)
                    completed.add(text)
                    last = conv.entries[-1] if conv.entries else None
                    if last is not None and last.role == "assistant":
                        completed.update(r.text for r in last.replies
                                         if r.finish_reason in ("stop", "length"))
                    if action == "compare" and last is not None and len(last.replies) > 1:
                        await send(pilot, app, f"/pick {rng.randint(1, len(last.replies))}")
                elif action == "stop":
                    text = f"msg-{seed}-{step}"
                    await send(pilot, app, text, wait=False)
                    completed.add(text)
                    await tap(app, "escape")
                    await settle(pilot, app)
                elif action == "retry":
                    await send(pilot, app, "/retry")
                    last = conv.entries[-1] if conv.entries else None
                    if last is not None and last.role == "assistant":
                        completed.update(r.text for r in last.replies
                                         if r.finish_reason in ("stop", "length"))
                elif action == "edit":
                    await send(pilot, app, "/edit", wait=True)
                    app.chat.prompt.text = ""
                elif action == "save":
                    await send(pilot, app, f"/save {copies / f'copy{step}.json'}")
                elif action == "load":
                    saved = sorted(copies.glob("*.json"))
                    if saved:
                        await send(pilot, app, f"/load {rng.choice(saved)}")
                elif action == "history_load":
                    await send(pilot, app, "/history")
                    listed = app.chat.state.history or []
                    if listed:
                        await send(pilot, app, f"/load {rng.randint(1, len(listed))}")
                elif action == "delete":
                    await send(pilot, app, "/history")
                    listed = app.chat.state.history or []
                    if listed:
                        await send(pilot, app, f"/history delete {rng.randint(1, len(listed))}")
                elif action == "clear":
                    await send(pilot, app, "/clear")
                    here.clear()
                elif action == "fork":  # continue from an alternative token (a sibling)
                    views = [v for v in app.chat._reply_views() if len(v.reply.tokens) > 2]
                    if views:
                        view = views[-1]
                        await app.chat.continue_from_alternative(
                            view.id, rng.randrange(len(view.reply.tokens) - 1),
                            rng.randint(1, 2))
                        await settle(pilot, app)
                        last = conv.entries[-1] if conv.entries else None
                        if last is not None and last.role == "assistant":
                            completed.update(r.text for r in last.replies
                                             if r.finish_reason in ("stop", "length"))
                elif action in ("prev", "next"):
                    await send(pilot, app, f"/sibling {action}")
                elif action == "tree":  # the tree view: open a random branch
                    await pilot.press("f5")
                    await pilot.pause()
                    nodes = [e.node for e in conv.all_entries()]
                    app.screen.dismiss(rng.choice(nodes) if nodes else None)
                    await settle(pilot, app)
                    await pilot.pause()
                elif action == "quit":
                    break
                if action in ("load", "history_load"):
                    here.clear()
                conv = app.chat.state.conversation
                for entry in conv.entries:
                    if entry.role == "assistant":
                        here.update(r.text for r in entry.replies
                                    if r.finish_reason in ("stop", "length"))
                in_tree = {r.text for e in conv.all_entries() for r in e.replies}
                assert here <= in_tree, f"step {step} ({action}): not in the tree"
                shown = [i.key for i in app.chat.window.items if i.tag == "reply"]
                assert shown == [e for e in conv.entries if e.role == "assistant"
                                 and e.replies], f"step {step} ({action}): screen != path"
                app.flush_autosaves()
                texts, broken = _all_texts([data, copies])
                assert not broken, f"step {step} ({action}): files that do not load: {broken}"
                lost = completed - texts
                assert not lost, f"seed {seed}, step {step} ({action}): lost {sorted(lost)}"
        # quit (or the last step): the app ends, its autosave is flushed; start again
        texts, broken = _all_texts([data, copies])
        assert not broken and not (completed - texts), (broken, completed - texts)
        app = fresh_app()
        here.clear()
