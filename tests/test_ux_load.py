"""Issue 14, section 4: after /load (and --load) every reply is drawn in full, at once: the
screen the terminal got equals a fresh render of it, and each reply view is as tall as its
text (most replies once showed only their first lines until a resize)."""

from __future__ import annotations

import pytest

from chatui.textual_compat.testing import render_screen
from chatui.widgets.reply import ReplyView
from chatui.widgets.items import SiblingBar
from test_app import config_dir, make_app, notices, send  # noqa: F401

RICH = """# Heading

Some *text* that wraps over several lines because it is long enough to need wrapping on a
narrow terminal, and then some more.

- item one
- item two, which is also fairly long so that it wraps on narrow screens

```python
def f(x):
    return x * 2
```

| a | b |
|---|---|
| 1 | 2 |

> a quote

Last paragraph.
"""


LONG = " ".join(f"w{i}" for i in range(400))
"""A reply that streams for a few seconds at 10 ms a word."""


async def streaming(pilot, app, chars: int) -> None:
    """"go" sent; back once more than ``chars`` characters of its reply have streamed."""
    app.chat.prompt.text = "go"
    await pilot.press("enter")
    for _ in range(200):
        await pilot.pause(0.05)
        entries = app.chat.conversation.entries
        if len(entries) == 2 and len(entries[1].text) > chars:
            break


@pytest.mark.parametrize("size", [(70, 24), (120, 36)])
async def test_a_loaded_conversation_is_drawn_in_full(tmp_path, size):
    app = make_app(lambda r, row: RICH)
    async with app.run_test(size=size) as pilot:
        for text in ("one", "two", "three"):
            await send(pilot, app, text)
        await send(pilot, app, f"/save {tmp_path / 's.json'}")
        await send(pilot, app, "/clear")
        await send(pilot, app, f"/load {tmp_path / 's.json'}")
        await pilot.pause(0.3)
        views = list(app.chat.query(ReplyView))
        # the replies near the end are drawn (the window mounts only those; issue 21), the
        # last one among them
        assert views and views[-1].reply is app.chat.conversation.entries[-1].reply
        heights = {v.size.height for v in views}
        assert len(heights) == 1 and min(heights) > 15, heights  # same text, same height
        shown = [s.text for s in render_screen(app)]
        assert shown == [s.text for s in render_screen(app, fresh=True)]
        app.chat.log_view.scroll_home(animate=False)
        await pilot.pause(0.2)
        shown = "\n".join(s.text for s in render_screen(app))
        assert "Heading" in shown


async def test_loading_an_older_copy_adds_a_sibling_and_keeps_the_newer_conversation(
        tmp_path, config_dir):  # noqa: F811
    """Issue 14, section 1, and issue 18, through the app: /save a copy after one exchange, go
    on, /load the copy, go on, quit. The conversation's own file holds both exchanges and the
    copy's continuation, as alternatives after the first answer (no file of its own); the
    user is told."""
    import chatui.transcript as tr

    app = make_app(lambda r, row: "an answer")
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "first")
        await send(pilot, app, f"/save {tmp_path / 'copy.json'}")
        await send(pilot, app, "second")
        original = app.chat.state.conversation.id
        await send(pilot, app, f"/load {tmp_path / 'copy.json'}")
        await pilot.pause(0.2)
        told = " ".join(str(n.render()) for n in notices(app))
        assert "opens inside its conversation's tree" in told, told
        conv = app.chat.state.conversation
        assert conv.id == original and [e.text for e in conv.entries] == ["first", "an answer"]
        await send(pilot, app, "third")
        assert "‹ 2/2 ›" in [str(b.render()) for b in app.chat.query(SiblingBar)]
    directory = app.config.transcripts_dir()
    directory = directory if directory is not None else tr.data_dir()
    convs = [tr.load_transcript(p) for p in directory.glob("*.json")]
    assert [c.id for c in convs] == [original]
    home = convs[0]
    assert [e.text for e in home.entries] == ["first", "an answer", "third", "an answer"]
    assert [e.text for e in home.tops[0].children[0].children] == ["second", "third"]


async def test_a_file_changed_elsewhere_makes_a_branch_and_the_user_is_told(config_dir):  # noqa: F811
    """Two windows on one conversation: another chatui adds to its file while this one has it
    open. This window's next save goes to a branch of its own (nothing of the other's is
    lost) and says so in one notice (it went on in the branch without a word)."""
    import chatui.transcript as tr

    app = make_app(lambda r, row: "an answer")
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "first")
        app.flush_autosaves()
        conv = app.chat.state.conversation
        path = tr.autosave_path(conv, app.config.transcripts_dir())
        other = tr.load_transcript(path)  # the other window: one more exchange
        other.add_user("from elsewhere")
        other.add_assistant([other.entries[1].replies[0].settings])
        other.entries[-1].replies[0].text = other.entries[-1].text = "its answer"
        other.entries[-1].replies[0].finish_reason = "stop"
        tr.save_transcript(other, path)
        await send(pilot, app, "second")
        app.flush_autosaves()
        await pilot.pause(0.2)
        told = [str(n.render()) for n in notices(app, "warning")]
        assert any("changed elsewhere" in t and "branch" in t for t in told), told
        assert conv.id != other.id and conv.parent == other.id
        await send(pilot, app, "/history")  # the two share a title: the branch says whose
        listing = str(notices(app)[-1].render())
        assert "4 messages · scripted · a branch of 2" in listing, listing
        from textual.widgets import OptionList

        await pilot.press("ctrl+f")  # the search box's list says it too
        await pilot.pause(0.3)
        rows = app.screen.query_one(OptionList)
        shown = [str(rows.get_option_at_index(i).prompt) for i in range(rows.option_count)]
        assert sum("4 messages · a branch" in row for row in shown) == 1, shown
        await pilot.press("escape")
    directory = app.config.transcripts_dir()
    directory = directory if directory is not None else tr.data_dir()
    saved = {c.id: c for c in (tr.load_transcript(p) for p in directory.glob("*.json"))}
    assert [e.text for e in saved[other.id].entries] == [
        "first", "an answer", "from elsewhere", "its answer"]
    assert [e.text for e in saved[conv.id].entries] == [
        "first", "an answer", "second", "an answer"]
    import subprocess
    import sys

    listed = subprocess.run([sys.executable, "-m", "chatui", "history", "list", "--dir",
                             str(directory)], capture_output=True, text=True, timeout=60)
    assert f"— 4 messages, a branch of {other.id}" in listed.stdout, listed


async def test_a_streaming_reply_is_saved_as_it_streams_and_loads_as_stopped(
        config_dir, tmp_path, monkeypatch):  # noqa: F811
    """A reply is autosaved while it streams (every CHECKPOINT_S), not only when it starts
    and ends: a terminal closed or the app killed mid-reply lost all of it. Loaded again, a
    reply that was streaming when its file was written is a stopped one: the notice says so
    and /continue goes on with it ("finished on its own", it said)."""
    import chatui.screens.chat as chat_module
    from chatui import transcript as tr

    monkeypatch.setattr(chat_module, "CHECKPOINT_S", 0.2)
    app = make_app(lambda r, row: LONG, delay_s=0.01)
    async with app.run_test(size=(100, 30)) as pilot:
        await streaming(pilot, app, 100)
        await pilot.pause(0.5)
        assert app.chat.generating
        app.autosaver.wait()
        path = tr.autosave_path(app.chat.conversation, app.config.transcripts_dir())
        saved = tr.load_transcript(path)
        streamed = saved.entries[1].replies[0]
        assert streamed.finish_reason is None and streamed.text.startswith("w0 w1 w2")
        await pilot.press("escape")
        await pilot.pause(0.2)
    copy = tmp_path / "copy.json"
    tr.save_transcript(saved, copy)
    import shutil

    shutil.rmtree(tmp_path / "data")  # (else the copy opens inside its newer autosave)
    app = make_app(lambda r, row: " and the rest.")
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, app, f"/load {copy}")
        reply = app.chat.conversation.entries[1].replies[0]
        assert reply.finish_reason == "cancelled"
        assert "still streaming when it was saved" in str(notices(app)[-1].render())
        await send(pilot, app, "/continue")
        assert reply.finish_reason == "stop" and reply.text.endswith(" and the rest.")
        assert reply.text.startswith(streamed.text)



async def test_a_messages_export_opens_as_a_conversation(config_dir, tmp_path):  # noqa: F811
    """/export messages, then /load of that file: the same messages, the replies text only
    (their statistics line says so: it said "0 tokens"), and the conversation goes on."""
    import json

    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, app, "/system Be brief.")
        await send(pilot, app, "hello")
        await send(pilot, app, f"/export messages {tmp_path / 'c.messages.json'}")
        exported = json.loads((tmp_path / "c.messages.json").read_text())
        await send(pilot, app, "/clear")
        await send(pilot, app, f"/load {tmp_path / 'c.messages.json'}")
        await pilot.pause(0.2)
        conv = app.chat.conversation
        assert conv.system_prompt == "Be brief." and [e.role for e in conv.entries] == [
            "user", "assistant"]
        [view] = app.chat.query(ReplyView)
        assert "text only" in str(view.query_one(".reply-stats").render())
        await send(pilot, app, "and then?")
        sent = app.holder["backend"].requests[-1].messages
        assert [{"role": m.role, "content": m.content} for m in sent[:-1]] == exported


async def test_a_hang_up_saves_even_when_stopping_the_reply_fails(config_dir, monkeypatch):  # noqa: F811
    """SIGHUP's handler saves the conversation whatever else fails in it (an import inside it
    that failed, the package changed under the running app, ended the handler before the
    save: the reply streamed so far was lost), and the process still ends."""
    import os
    import signal

    from chatui import transcript as tr
    from chatui.recorder import ReplyRecorder

    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    app = make_app(lambda r, row: LONG, delay_s=0.01)
    async with app.run_test(size=(100, 30)) as pilot:
        await streaming(pilot, app, 50)
        assert app.chat.generating

        def broken(self):
            raise RuntimeError("broken")

        monkeypatch.setattr(ReplyRecorder, "finish", broken)
        app._hung_up(signal.SIGHUP)
        assert exits == [0]
        path = tr.autosave_path(app.chat.conversation, app.config.transcripts_dir())
        saved = tr.load_transcript(path)
        assert saved.entries[1].replies[0].text.startswith("w0 w1 w2")


async def test_a_loaded_conversation_says_its_system_prompt(tmp_path):
    """The system prompt shows nowhere in the conversation, and every reply heeds it: /load
    says it (a loaded pirate conversation answered as a pirate with nothing on screen saying
    why; seen in tmux); a conversation without one says nothing of it."""
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, app, "/system You are a pirate.")
        await send(pilot, app, "ahoy")
        await send(pilot, app, f"/save {tmp_path / 'p.json'}")
        await send(pilot, app, "/clear")  # (keeps the system prompt)
        assert app.chat.conversation.system_prompt == "You are a pirate."
        await send(pilot, app, "/system none")  # (it could not be taken back)
        assert "cleared" in str(notices(app)[-1].render())
        assert app.chat.conversation.system_prompt == ""
        await send(pilot, app, "plain")
        assert all(m.role != "system" for m in app.holder["backend"].requests[-1].messages)
        await send(pilot, app, f"/save {tmp_path / 'q.json'}")
        await send(pilot, app, f"/load {tmp_path / 'p.json'}")
        told = str(notices(app)[-1].render())
        assert "Loaded" in told and "Its system prompt: You are a pirate." in told
        await send(pilot, app, f"/load {tmp_path / 'q.json'}")
        assert "system prompt" not in str(notices(app)[-1].render())


async def test_a_send_given_back_after_its_question_was_saved_makes_no_branch(config_dir):  # noqa: F811
    """Found using chatui in tmux: a message too long for the context failed after its question
    had been autosaved; the question went back to the box, taken out of the tree, and the next
    save found the file holding a message the conversation lacked: it went on in a branch
    ("This conversation's file was changed elsewhere (another chatui window?)"), which no other
    window had done. A send given back is the user's own removal: the file drops it."""
    import time

    import chatui.transcript as tr

    def reply(request, row):
        if request.messages[-1].content.startswith("LONG"):
            time.sleep(0.3)  # the engine reads the prompt; meanwhile the question is saved
            raise ValueError("The message is too long for the model's context: it takes "
                             "9000 tokens and at most 7680 fit (with room kept for the reply).")
        return "an answer"

    app = make_app(reply)
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "first")
        conv = app.chat.state.conversation
        first_id = conv.id
        await send(pilot, app, "LONG " + "words " * 50)
        assert app.chat.prompt.text.startswith("LONG")  # given back
        app.flush_autosaves()
        await send(pilot, app, "second")
        app.flush_autosaves()
        await pilot.pause(0.2)
        told = [str(n.render()) for n in notices(app, "warning")]
        assert not any("changed elsewhere" in t for t in told), told
        assert conv.id == first_id and not conv.parent
    directory = app.config.transcripts_dir()
    directory = directory if directory is not None else tr.data_dir()
    saved = [tr.load_transcript(p) for p in directory.glob("*.json")]
    assert [[e.text for e in c.entries] for c in saved] == [
        ["first", "an answer", "second", "an answer"]]
