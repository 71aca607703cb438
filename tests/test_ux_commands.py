"""Issue 14, section 4: each command does what /help says. Each test failed on main."""

from __future__ import annotations

import json

from chatui import transcript
from test_app import SIZE, config_dir, loaded, make_app, notices, send  # noqa: F401


def last_notice(app, kind=None) -> str:
    return str(notices(app, kind)[-1].render())


async def test_export_takes_a_format_word_then_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "export me")
        await send(pilot, app, f"/export md {tmp_path / 'a.md'}")
        assert "export me" in (tmp_path / "a.md").read_text()
        await send(pilot, app, f"/export messages {tmp_path / 'b.json'}")
        data = json.loads((tmp_path / "b.json").read_text())
        assert data[0]["content"] == "export me"
        await send(pilot, app, "/export messages")
        written = list(tmp_path.glob("*.messages.json"))
        assert len(written) == 1 and json.loads(written[0].read_text())[0]["role"] == "user"
        await send(pilot, app, "/export")
        assert len(list(tmp_path.glob("*.md"))) == 2
    names = {p.name for p in tmp_path.iterdir()}
    assert not names & {"md", "messages", f"md {tmp_path / 'a.md'}"}, names


async def test_export_replaces_only_an_export_of_this_conversation(tmp_path, monkeypatch):
    """Found using chatui: "/export md notes.md" replaced whatever notes.md held (a person's
    own notes, a README) without a word. A file already there is replaced only by a new
    export of the same conversation (its Markdown names the conversation, its messages are
    the conversation's, a retried reply's included); anything else is left as it was and the
    error says so in one sentence."""
    monkeypatch.chdir(tmp_path)
    notes, saved = tmp_path / "notes.md", tmp_path / "saved.json"
    notes.write_text("my own notes\n")
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first question")
        await send(pilot, app, f"/save {saved}")
        transcript_bytes = saved.read_bytes()
        for fmt, target in (("md", notes), ("messages", notes), ("md", saved)):
            await send(pilot, app, f"/export {fmt} {target}")
            error = last_notice(app, "error")
            assert "not an export of this conversation" in error and "nothing was written" \
                in error, error
        assert notes.read_text() == "my own notes\n" and saved.read_bytes() == transcript_bytes
        await send(pilot, app, f"/export md {tmp_path / 'chat.md'}")
        await send(pilot, app, f"/export messages {tmp_path / 'chat.json'}")
        await send(pilot, app, "/retry")
        await send(pilot, app, "second question")
        errors = len(notices(app, "error"))
        await send(pilot, app, f"/export md {tmp_path / 'chat.md'}")
        await send(pilot, app, f"/export messages {tmp_path / 'chat.json'}")
        assert len(notices(app, "error")) == errors, last_notice(app, "error")
        assert "second question" in (tmp_path / "chat.md").read_text()
        contents = [m["content"] for m in json.loads((tmp_path / "chat.json").read_text())]
        assert contents[0] == "first question" and "second question" in contents
        await send(pilot, app, f"/export md {tmp_path / 'chat.json'}")  # (a format change)
        assert len(notices(app, "error")) == errors, last_notice(app, "error")


async def test_an_export_path_without_an_extension_gets_the_formats(tmp_path, monkeypatch):
    """Found using chatui: "/export xyz" (or "/export html", a format chatui does not write)
    wrote Markdown into a file named "xyz" that nothing opens as Markdown. A path with no
    extension gets the format's; a folder still takes the conversation's own file name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "export me")
        await send(pilot, app, "/export xyz")
        assert f"Exported to {tmp_path / 'xyz.md'}" in last_notice(app)  # (where: absolute)
        assert "export me" in (tmp_path / "xyz.md").read_text()
        await send(pilot, app, "/export messages notes")
        assert json.loads((tmp_path / "notes.json").read_text())[0]["content"] == "export me"
        await send(pilot, app, "/export md folder")
        assert [p.suffix for p in (tmp_path / "folder").iterdir()] == [".md"]
    assert not (tmp_path / "xyz").exists() and not (tmp_path / "notes").exists()


async def test_export_of_an_empty_conversation_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/export")
        assert "nothing to export" in last_notice(app, "error")


async def test_set_stop_none_clears_the_stop_strings():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/set stop ###,END")
        assert app.chat.settings.stop == ("###", "END")
        await send(pilot, app, "/set stop none")
        assert app.chat.settings.stop == ()
        await send(pilot, app, "/set stop=END")
        await send(pilot, app, "/set stop=off")
        assert app.chat.settings.stop == ()
        await send(pilot, app, "/set stop none,")  # the literal word, when wanted
        assert app.chat.settings.stop == ("none",)


async def test_history_delete_moves_a_conversation_out_of_the_list(tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "first conversation")
        await send(pilot, app, "/clear")
        await send(pilot, app, "second conversation")
        await send(pilot, app, "/clear")
        await send(pilot, app, "/history")
        listing = last_notice(app)
        assert "first conversation" in listing and "second conversation" in listing
        await send(pilot, app, "/history delete 2")
        assert "Deleted" in last_notice(app)
        await send(pilot, app, "/history")
        assert "first conversation" not in last_notice(app)
        kept = list((tmp_path / "data").rglob("deleted/*.json"))
        assert len(kept) == 1
        assert transcript.load_transcript(kept[0]).entries[0].text == "first conversation"
        await send(pilot, app, "/history delete 9")
        assert "no conversation 9" in last_notice(app, "error")


async def test_numbers_keep_meaning_the_listing_shown_after_a_delete(tmp_path):
    """After /history delete 1, /load 2 opens what the listing on screen numbers 2 (the list was
    read again at the delete, and /load 2 opened the old number 3; seen in tmux); the deleted
    number says so."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        for text in ("one", "two", "three"):
            await send(pilot, app, f"conversation {text}")
            await send(pilot, app, "/clear")
        await send(pilot, app, "/history")
        listing = last_notice(app).splitlines()
        second = next(line for line in listing if line.startswith("  2. "))
        await send(pilot, app, "/history delete 1")
        await send(pilot, app, "/load 2")
        assert app.chat.conversation.entries[0].text in second
        for command in ("/load 1", "/history delete 1"):
            await send(pilot, app, command)
            assert "1 was deleted from the history" in last_notice(app, "error")
        await send(pilot, app, "/clear")
        await send(pilot, app, "/history")  # numbered afresh
        assert "  1. " in last_notice(app) and "conversation three" not in last_notice(app)


async def test_history_lines_fit_80_columns_with_the_details_under_the_title(tmp_path):
    """A long title made the listing's one line per conversation wrap back to the notice's
    margin, under the numbers; now the title is cut and the details go on a line of their own."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "a rather long first message " * 8)
        await send(pilot, app, "/clear")
        await send(pilot, app, "/history")
        lines = last_notice(app).splitlines()
        assert all(len(line) <= 80 for line in lines), lines
        assert lines[1].startswith("  1. ") and lines[1].endswith("…")
        assert lines[2].strip() == "2 messages · scripted"


async def test_a_file_that_cannot_be_opened_is_listed_in_80_columns(tmp_path):
    """A cut file in the folder is listed by its name with the start of the reason under it
    (the whole sentence on the numbered line wrapped back under the numbers; seen in tmux);
    /load N gives the whole reason."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "a conversation")
        await send(pilot, app, "/clear")
        folder = app.config.transcripts_dir() or transcript.data_dir()
        (folder / "cut.json").write_text('{"format": "chatui-transcript", "version": 3')
        await send(pilot, app, "/history")
        lines = last_notice(app).splitlines()
        assert all(len(line) <= 80 for line in lines), lines
        number = next(line for line in lines if line.endswith("  cut.json"))
        assert lines[lines.index(number) + 1].startswith("       cannot be opened: ")
        await send(pilot, app, f"/load {number.split('.')[0].strip()}")
        assert "cut off" in last_notice(app, "error")


async def test_continue_after_a_failed_reply_does_not_say_it_finished(tmp_path):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        reply = app.chat.conversation.entries[-1].reply
        reply.finish_reason, reply.error = "error", "The inference process stopped."
        before = len(reply.tokens)
        await send(pilot, app, "/continue")
        assert not any("finished on its own" in str(n.render()) for n in notices(app))
        assert reply.finish_reason != "error" and len(reply.tokens) > before
        reply.finish_reason, reply.error = "error", "x"
        reply.tokens.clear()
        reply.text = ""
        await send(pilot, app, "/continue")
        assert "/retry" in last_notice(app, "error")


async def test_the_export_counts_tokens_as_the_chat_does(tmp_path):
    from chatui.export import reply_stats as export_stats
    from chatui.widgets.reply import reply_stats as chat_stats
    from inference.types import Usage

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "count these words please")
        reply = app.chat.conversation.entries[-1].reply
        u = reply.usage
        # as the local engine reports it: the end-of-turn token counted as generated
        reply.usage = Usage(u.prompt_tokens, len(reply.tokens) + 1, u.cached_tokens,
                            u.ttft_s, u.decode_tokens_per_s)
        chat_count = chat_stats(reply, stable_timings=True).split(" tokens")[0]
        export_count = export_stats(reply).split(" token")[0]
        assert chat_count.split()[-1] == export_count == str(len(reply.tokens))


async def test_the_palette_offers_every_command():
    from chatui.commands import COMMANDS

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        titles = [c.title for c in app.get_system_commands(app.chat)]
        for spec in COMMANDS:
            assert any(t.startswith(f"/{spec.name}") for t in titles), spec.name


def test_a_tiny_probability_never_reads_zero():
    """A sampled token of probability 1.7e-5 read "0.0%" in the reply's statistics line and
    "0.00%" in the inspector (seen at temperature 0.7 in tmux)."""
    import math

    from chatui.conversation import Reply
    from chatui.widgets.reply import reply_stats
    from chatui.widgets.text import show_prob
    from inference.settings import SamplingParams
    from inference.types import Token

    assert [show_prob(p) for p in (0.5, 4e-4, 1.7e-5, 2.1e-7, 0.0)] == \
        ["50.0%", "0.04%", "0.0017%", "2.1e-07", "0%"]
    assert show_prob(0.25, 2) == "25.00%"
    reply = Reply(SamplingParams(), " a school", [Token(0, 1, " a", -0.1, None),
                                                  Token(1, 2, " school", math.log(1.7e-5), None)])
    assert "least likely ' school' 0.0017%" in reply_stats(reply, stable_timings=True)


def test_a_reply_stopped_while_its_prompt_was_read_says_so():
    """Esc during a long prefill: the stats line said "0 tokens · 0.0 tok/s · TTFT 0.00s"."""
    from chatui.conversation import Reply
    from chatui.widgets.reply import reply_stats
    from inference.settings import SamplingParams
    from inference.types import Usage

    reply = Reply(SamplingParams(), "", [], "cancelled", Usage(6037, 0, 0, 0.0, 0.0))
    assert reply_stats(reply) == "0 tokens · stopped before its first token"


def test_a_reply_of_one_token_has_no_speed():
    """A fan-out's branch that is its end-of-turn token (one token decoded, no rate after the
    first) said "0.0 tok/s" in its statistics, in the export and in the status line."""
    from chatui.conversation import Reply
    from chatui.export import reply_stats as export_stats
    from chatui.state import speed_label
    from chatui.widgets.reply import reply_stats
    from inference.settings import SamplingParams
    from inference.types import Token, Usage

    one = Reply(SamplingParams(), "Hi", [Token(0, 1, "Hi", -0.5, 0.1)], "stop",
                Usage(12, 1, 0, 0.08, 0.0))
    assert reply_stats(one) == "1 token · mean logprob -0.50 · ppl 1.65 · " \
        "least likely 'Hi' 60.7% · TTFT 0.08s"
    assert "tok/s" not in export_stats(one)
    assert speed_label([one], stable=False) is None  # (the status line keeps what it had)
    two = Reply(SamplingParams(), "Hi there", [Token(0, 1, "Hi", -0.5, 0.1),
                                               Token(1, 2, " there", -0.5, 0.1)], "stop",
                Usage(12, 2, 0, 0.08, 50.0))
    assert "50.0 tok/s · TTFT 0.08s" in reply_stats(two)
    assert speed_label([one, two], stable=False) == "50.0 tok/s (1 of 2 columns)"


async def test_title_names_the_conversation_where_it_is_listed_searched_and_exported(tmp_path):
    """`/title TEXT` renames the conversation: its file (autosaved at once), `/history`'s
    listing, the search and a Markdown export show the new name; `/title` alone says it; a
    title past the limit is refused in one sentence and the old one stays."""
    from chatui.chat_commands import TITLE_MAX
    from chatui.transcript.search import search_transcripts

    data = tmp_path / "data"
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/title")
        assert "No title yet" in last_notice(app)
        await send(pilot, app, "first words of it")
        await send(pilot, app, "/title   Quarterly   plans\n")
        assert last_notice(app) == "Title set: Quarterly plans"
        assert app.autosaver.flush(timeout=10)
        [saved] = transcript.list_transcripts(data)
        assert saved.title == "Quarterly plans"
        assert transcript.load_transcript(saved.path).title == "Quarterly plans"
        await send(pilot, app, "/history")
        assert "Quarterly plans" in last_notice(app)
        assert [h.title for h in search_transcripts("quarterly", data, 5)] == ["Quarterly plans"]
        await send(pilot, app, f"/title {'x' * (TITLE_MAX + 1)}")
        assert f"at most {TITLE_MAX} characters" in last_notice(app, "error")
        await send(pilot, app, "/title")
        assert last_notice(app) == "Title: Quarterly plans"
        await send(pilot, app, f"/export md {tmp_path / 'out.md'}")
        assert (tmp_path / "out.md").read_text().startswith("# Quarterly plans\n")


async def test_a_continuation_that_fails_leaves_the_reply_as_it_had_ended():
    """Found using chatui in tmux: ``/continue`` on a reply cut off at the end of a small
    model's context failed, and the reply was marked failed ("✗", its statistics' speed gone)
    and saved so, although nothing of it had changed. It stays as it had ended, and a notice
    says why it could not go on."""
    def reply(request, row):
        if request.prefix is not None:
            raise ValueError("There is no room left to go on: the reply and the message it "
                             "answers take 256 tokens, and the model's context holds 256.")
        return "one two three four five six"

    app = make_app(reply)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/set max_tokens 3")
        await send(pilot, app, "count")
        reply = app.chat.conversation.entries[1].reply
        before = (reply.finish_reason, reply.usage, reply.text, len(reply.tokens))
        assert before[0] == "length" and before[1] is not None
        await send(pilot, app, "/continue")
        assert (reply.finish_reason, reply.usage, reply.text, len(reply.tokens)) == before
        assert reply.error == ""
        assert last_notice(app, "error").startswith(
            "The reply is kept as it was. There is no room left to go on: the reply and the "
            "message it answers take 256 tokens, and the model's context holds 256.")
        view = app.chat.query_one("ReplyView")
        assert "cut off at the token limit" in str(view.query_one(".reply-finish").render())
        assert app.autosaver.flush(timeout=10)
        [saved] = transcript.list_transcripts(app.config.transcripts_dir())
    assert transcript.load_transcript(saved.path).entries[1].reply.finish_reason == "length"


async def test_a_reply_cut_off_by_the_context_says_so_not_the_token_limit():
    """Found using chatui in tmux on a model of 256 tokens with ``/set max_tokens 1000``: a
    reply that ran to the end of the context said "cut off at the token limit — /continue to
    go on", and /continue then had no room. The label names the context (kept in the file's
    usage, so a loaded reply says it too); a reply cut at max_tokens still offers /continue."""
    app = make_app(lambda r, row: " ".join(["word"] * 200), context_limit=60)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/set max_tokens 1000")
        await send(pilot, app, "tell")
        reply = app.chat.conversation.entries[1].reply
        assert reply.finish_reason == "length" and reply.usage.filled_context
        assert reply.usage.prompt_tokens + reply.usage.completion_tokens == 60
        finish = app.chat.query_one("ReplyView .reply-finish")
        assert str(finish.render()) == "✂ cut off at the end of the model's context (60 tokens)"
        await send(pilot, app, "/set max_tokens 3")
        await send(pilot, app, "/retry")
        finish = app.chat.query("ReplyView .reply-finish").last()
        assert str(finish.render()) == "✂ cut off at the token limit — /continue to go on"
        assert app.autosaver.flush(timeout=10)
        [saved] = transcript.list_transcripts(app.config.transcripts_dir())
    conv = transcript.load_transcript(saved.path)
    usages = [r.usage for e in conv.all_entries() for r in e.replies]
    assert sorted(u.filled_context for u in usages) == [False, True]
    assert {u.context_limit for u in usages} == {60}
