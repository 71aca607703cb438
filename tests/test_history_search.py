"""Issue 18, "Finding old conversations": full-text search over every saved conversation,
from an index kept beside the transcripts that the JSON files can always rebuild."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from chatui.conversation import Conversation
from chatui.transcript import save_transcript
from chatui.transcript.search import INDEX_NAME, SearchIndex, fts_query, search_transcripts
from inference.settings import SamplingParams
from chatui.widgets.text import shorten, shorten_around
from test_app import SIZE, config_dir, make_app, notices, send, until_at_top  # noqa: F401


def conversation(user: str, *replies: str, title: str = "", system: str = "") -> Conversation:
    conv = Conversation(title=title, system_prompt=system)
    conv.add_user(user)
    entry = conv.add_assistant([SamplingParams() for _ in replies])
    for reply, text in zip(entry.replies, replies):
        reply.text, reply.finish_reason = text, "stop"
    return conv


def saved(folder: Path, name: str, conv: Conversation) -> Path:
    path = folder / f"{name}.json"
    save_transcript(conv, path)
    return path


def found(folder: Path, text: str) -> list[str]:
    return [h.path.stem for h in search_transcripts(text, folder)]


def test_every_text_of_every_reply_is_found_by_word_prefixes(tmp_path):
    saved(tmp_path, "a", conversation("How do kernels tile matrices?", "Blocking along K."))
    saved(tmp_path, "b", conversation("Name a fruit", "A pear.", "A quince, surely.",
                                      title="Fruit talk"))
    saved(tmp_path, "c", conversation("hello", "hi", system="You are a pirate captain."))
    assert found(tmp_path, "quince") == ["b"]  # a comparison's column that was not chosen
    assert found(tmp_path, "kern") == ["a"]  # words match as prefixes
    assert found(tmp_path, "fruit talk") == ["b"]  # the title
    assert found(tmp_path, "pirate") == ["c"]  # the system prompt
    assert found(tmp_path, "tile blocking") == ["a"]  # every word, across messages
    assert found(tmp_path, "tile pear") == []  # every word must be in one conversation
    hit = search_transcripts("quince", tmp_path)[0]
    assert hit.where == "reply" and "[quince]" in hit.snippet and hit.title == "Fruit talk"
    # a passage over two replies shows where one ends ('A pear. A quince' ran together)
    assert hit.snippet == "A pear. · A [quince], surely.", hit.snippet


def test_what_a_user_types_is_only_ever_words():
    assert fts_query('"NEAR(a b)" OR -x* ^y') == '"near"* AND "a"* AND "b"* AND "or"* AND "x"* AND "y"*'
    assert fts_query("  ?! ") == ""


def test_the_index_follows_the_files(tmp_path):
    conv = conversation("apples", "red")
    path = saved(tmp_path, "a", conv)
    saved(tmp_path, "b", conversation("apples", "green"))
    assert sorted(found(tmp_path, "apples")) == ["a", "b"]
    conv.add_user("and bananas")
    save_transcript(conv, path)  # the same conversation, one message longer
    assert found(tmp_path, "bananas") == ["a"]
    path.unlink()
    assert found(tmp_path, "apples") == ["b"]  # a deleted file is gone from the index
    index = SearchIndex(tmp_path)
    try:
        assert index.refresh() == 0  # nothing changed since: nothing read
    finally:
        index.close()


def test_a_broken_or_old_index_is_rebuilt_from_the_files(tmp_path):
    saved(tmp_path, "a", conversation("walrus", "tusks"))
    assert found(tmp_path, "walrus") == ["a"]
    (tmp_path / INDEX_NAME).write_bytes(b"this is not a database" * 100)
    for suffix in ("-wal", "-shm"):
        Path(f"{tmp_path / INDEX_NAME}{suffix}").unlink(missing_ok=True)
    assert found(tmp_path, "tusks") == ["a"]
    import sqlite3

    db = sqlite3.connect(tmp_path / INDEX_NAME)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    assert found(tmp_path, "walrus") == ["a"]


def test_an_unreadable_transcript_is_skipped_not_fatal(tmp_path):
    saved(tmp_path, "good", conversation("otters", "float"))
    (tmp_path / "bad.json").write_text('{"format": "chatui-transcript", "version": 2, "ent')
    assert found(tmp_path, "otters") == ["good"]
    assert found(tmp_path, "format") == []


def test_a_read_only_folder_is_searched_from_memory(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    saved(folder, "a", conversation("lighthouse", "keeper"))
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):  # root ignores the mode
            return
        assert found(folder, "lighthouse") == ["a"]
        assert not (folder / INDEX_NAME).exists()
    finally:
        folder.chmod(0o755)


async def test_history_words_lists_matches_that_load_opens(tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "tell me about narwhals")
        await send(pilot, app, "/clear")
        await send(pilot, app, "tell me about walruses")
        await send(pilot, app, "/clear")
        await send(pilot, app, "/history narwh")
        listing = str(notices(app)[-1].render())
        assert "narwhals" in listing and "walruses" not in listing
        await send(pilot, app, "/load 1")
        assert app.chat.conversation.entries[0].text == "tell me about narwhals"
        await send(pilot, app, "/history zebras")
        assert "No saved conversation holds 'zebras'" in str(notices(app)[-1].render())


async def test_history_words_lists_each_match_in_two_lines_that_fit(tmp_path):
    """A long title and a long message were one line, wrapped back under the numbers (seen in
    tmux): the listing's two lines now, the words found kept in view."""
    app = make_app()
    story = ("Please write a long and detailed story about a lighthouse keeper who lives alone "
             "on a rocky island, far from anyone, and one morning finds narwhals in the bay")
    async with app.run_test(size=(80, 30)) as pilot:
        await send(pilot, app, story)
        await send(pilot, app, "/clear")
        await send(pilot, app, "/history")
        listing = notices(app)[-1]
        await pilot.pause(0.1)
        assert listing.size.height == 3  # no line wraps at 80 columns (the title's did)
        await send(pilot, app, "/history narwhals")
        await pilot.pause(0.1)
        lines = str(notices(app)[-1].render()).splitlines()
        assert notices(app)[-1].size.height == len(lines) == 3, lines
        assert lines[1].startswith("  1. ") and lines[1].endswith("…")
        assert lines[2].lstrip().startswith("2 messages · ") and "[narwhals]" in lines[2]


def test_shorten_around_keeps_the_mark_in_view():
    text = " ".join(f"w{i}" for i in range(40)) + " [hit] and the rest of it"
    for width in (20, 33, 60):
        line = shorten_around(text, width)
        assert len(line) <= width and "[hit]" in line and line.startswith("…"), line
    assert shorten_around("[hit] " + "x " * 40, 20) == shorten("[hit] " + "x " * 40, 20)
    assert shorten_around("short [hit]", 20) == "short [hit]"


def test_history_search_headless(tmp_path):
    saved(tmp_path, "a", conversation("ocelots", "spotted"))
    env = {**os.environ, "CHATUI_DATA_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "chatui", "history", "search"]
    out = subprocess.run(cmd + ["ocel", "--json"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    hit = json.loads(out.stdout)
    assert Path(hit["path"]).name == "a.json" and hit["where"] == "user"
    out = subprocess.run(cmd + ["spot", "ocel"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "a.json" in out.stdout, out.stderr  # words unquoted
    out = subprocess.run(cmd + ["?!"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "at least one word" in out.stderr
    out = subprocess.run(cmd + ["absent"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout == "" and "no saved conversation" in out.stderr


async def test_the_search_box_finds_as_you_type_and_opens_with_enter(tmp_path):
    from textual.widgets import OptionList

    from chatui.screens.history import HistoryScreen

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "tell me about narwhals")
        await send(pilot, app, "/clear")
        await send(pilot, app, "tell me about walruses")
        await send(pilot, app, "/clear")
        await pilot.press("ctrl+f")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        assert len(screen.found) == 2  # an empty box lists every saved conversation
        for key in "narwh":
            await pilot.press(key)
        for _ in range(100):
            await pilot.pause(0.02)
            if len(screen.found) == 1:
                break
        assert [f.title for f in screen.found] == ["tell me about narwhals"]
        assert "[narwhals]" in screen.found[0].passage
        assert screen.query_one(OptionList).option_count == 1
        await pilot.press("enter")
        for _ in range(500):  # (the open waits for the search's answer; a loaded CI is slow)
            await pilot.pause(0.02)
            if not isinstance(app.screen, HistoryScreen):
                break
        assert not isinstance(app.screen, HistoryScreen)
        for _ in range(100):
            if app.chat.conversation.entries:
                break
            await pilot.pause(0.02)
        assert app.chat.conversation.entries[0].text == "tell me about narwhals"
        await pilot.press("ctrl+f")
        await pilot.pause(0.2)
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HistoryScreen)


async def test_a_long_title_never_splits_the_rows_count():
    """A row whose title fills the line keeps "N messages" whole (it came after the title,
    and a "2" ended one line with "messages" on the next; seen in tmux)."""
    from chatui.screens.history import HistoryScreen

    title = "Write a haiku about autumn rain, then explain it in two sentences."
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, app, title)
        await pilot.press("ctrl+f")
        await pilot.pause(0.3)
        screen = app.screen
        assert isinstance(screen, HistoryScreen) and len(screen.found) == 1
        rows = screen.query_one("OptionList")
        text = [strip.text.rstrip(" ▎") for strip in rows.render_lines(rows.region.reset_offset)]
        assert any("2 messages  Write a haiku" in row for row in text), text
        assert any(row.endswith("two") or "sentences." in row for row in text), text


async def test_a_hit_opens_on_the_branch_that_holds_the_words(config_dir):  # noqa: F811
    """The index answers per conversation; Enter on a hit shows the branch whose message holds
    the words searched for (here the reply a retry replaced), and says so; the branch shown is
    saved, so the next open starts there. A search whose words are on the path shown keeps
    it. The conversation open is not loaded again from its file: the same conversation goes
    on, with what the log showed (a reload said "Loaded ..." and dropped the notices)."""
    from chatui.screens.history import HistoryScreen

    texts = iter(["the narwhal swims north", "the walrus sleeps", "a third reply"])
    app = make_app(lambda request, row: next(texts))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "tell me about sea animals")
        await send(pilot, app, "/retry")  # the narwhal's reply becomes a sibling, not shown
        conv = app.chat.conversation
        assert conv.entries[-1].reply.text == "the walrus sleeps"
        app.flush_autosaves()
        await send(pilot, app, "/settings")
        shown_before = 0
        for query, shown, switched in (("narwh", "the narwhal swims north", True),
                                       ("narwhal swims", "the narwhal swims north", False),
                                       ("walrus sleeps", "the walrus sleeps", True)):
            await pilot.press("ctrl+f")
            await pilot.pause(0.2)
            screen = app.screen
            assert isinstance(screen, HistoryScreen)
            for key in query:
                await pilot.press("space" if key == " " else key)
            for _ in range(100):
                await pilot.pause(0.02)
                if len(screen.found) == 1 and "[" in screen.found[0].passage:
                    break
            await pilot.press("enter")
            for _ in range(100):
                await pilot.pause(0.02)
                entries = app.chat.conversation.entries
                if len(entries) == 2 and entries[-1].reply.text == shown:
                    break
            assert app.chat.conversation.entries[-1].reply.text == shown, query
            assert app.chat.conversation is conv
            said = [str(n.render()) for n in notices(app)]
            assert said[0].startswith("Settings in force") and not any(
                s.startswith("Loaded") for s in said), said
            showing = sum(s.startswith("Showing the branch that holds") for s in said)
            assert showing == shown_before + switched, said
            shown_before = showing


async def test_a_hit_far_up_a_long_conversation_opens_scrolled_to_it(config_dir):  # noqa: F811
    """Enter on a search's hit shows the message that holds the words at the top of the view:
    in a long conversation the view stayed at its end, thirty exchanges below the message
    searched for (seen in tmux). The tree view's Enter shows the message it opens the same
    way (``ChatScreen.show_entry``)."""
    from chatui.screens.history import HistoryScreen

    conv = Conversation(title="a long one")
    for i in range(30):
        conv.add_user("tell me about narwhals" if i == 2 else f"question number {i}")
        entry = conv.add_assistant([SamplingParams()])
        reply = entry.replies[0]
        reply.text = "\n\n".join(f"paragraph {j} of reply {i}" for j in range(6))
        reply.finish_reason = "stop"
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        from chatui.transcript.history import data_dir

        folder = app.chat.services.config.transcripts_dir() or data_dir()
        folder.mkdir(parents=True, exist_ok=True)
        saved(folder, "long", conv)
        await pilot.press("ctrl+f")
        await pilot.pause(0.2)
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        for key in "narwh":
            await pilot.press(key)
        for _ in range(100):
            await pilot.pause(0.02)
            if len(screen.found) == 1 and "[" in screen.found[0].passage:
                break
        await pilot.press("enter")
        chat = app.chat
        for _ in range(200):
            await pilot.pause(0.02)
            if len(chat.conversation.entries) == 60:
                break
        target = chat.conversation.entries[4]
        assert target.text == "tell me about narwhals"
        assert await until_at_top(pilot, app, target), (
            chat.log_view.scroll_y, chat.log_view.max_scroll_y)
        assert chat.log_view.scroll_y < chat.log_view.max_scroll_y


async def test_words_and_enter_typed_at_once_open_the_words_hit():
    """Ctrl+F, "narwh" and Enter typed before the search answered opened the newest
    conversation, first in the list of all (seen in tmux): Enter, and a move, wait for the
    answer to what was typed. "wal", Down, Enter (one hit: Down stays on it) opens it too.
    What is typed after Enter is the chat's."""
    from textual import events

    from chatui.screens.history import HistoryScreen
    from chatui.textual_compat.testing import deliver

    app = make_app()
    app.HOLD_MAX_S = 600.0  # (only the chat's being back lets the held keys go)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "tell me about narwhals")
        await send(pilot, app, "/clear")
        await send(pilot, app, "tell me about walruses")
        await send(pilot, app, "/clear")
        for words, keys, opened in (("narwh", ["enter"], "tell me about narwhals"),
                                    ("wal", ["down", "enter"], "tell me about walruses")):
            deliver(app, events.Key("ctrl+f", None))
            for key in [*words, *keys, *"next"]:
                deliver(app, events.Key(key, "\r" if key == "enter" else
                                        None if key == "down" else key))
            for _ in range(500):
                await pilot.pause(0.02)
                if not isinstance(app.screen, HistoryScreen) and app.chat.conversation.entries \
                        and app.chat.prompt.text:
                    break
            assert not isinstance(app.screen, HistoryScreen)
            assert app.chat.conversation.entries[0].text == opened
            # typed after Enter: the chat's (it went to the search's box, closed with it),
            # let go once the chat was back (the hold's time limit is out of reach here)
            assert app.chat.prompt.text == "next"
            app.chat.prompt.text = ""
            await send(pilot, app, "/clear")
