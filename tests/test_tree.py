"""Issue 18: the conversation is a tree. Unit tests of the tree (the path derived from the
choices), transcript format 3 (round trips of random trees, fuzzed tree documents, migration
of versions 1 and 2, journal lines that graft by node id), exports of every branch, and pilot
tests of sibling navigation (keys, clicks, /sibling, /delete) and the tree view.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chatui.transcript as tr
from chatui.conversation import Conversation, Entry
from chatui.export import export_markdown, leaf_paths
from chatui.transcript.reader import from_json_dict
from chatui.transcript.schema import to_json_dict
from chatui.transcript.writer import AutosaveWriter
from chatui.widgets.items import SiblingBar
from chatui.widgets.reply import ReplyView
from inference.settings import SamplingParams
from inference.types import Token

from test_app import config_dir, make_app, notices, send, settle, until_at_top  # noqa: F401
from test_transcript import V1_TRANSCRIPT, entries, roundtrip


def _answer(conv: Conversation, text: str) -> Entry:
    entry = conv.add_assistant([SamplingParams()])
    reply = entry.replies[0]
    reply.text = text
    reply.tokens = [Token(0, 1, text, -0.5, 0.5)]
    reply.finish_reason = "stop"
    return entry


def _retry(conv: Conversation, text: str) -> Entry:
    """What /retry does: the path ends before the last reply, a new one is its sibling."""
    conv.rewind(conv.entries[-1])
    return _answer(conv, text)


# ---- the tree -------------------------------------------------------------------------


def test_retry_and_edit_add_siblings_and_the_path_follows_the_choices() -> None:
    conv = Conversation()
    q = conv.add_user("Q1")
    a1 = _answer(conv, "A1")
    a2 = _retry(conv, "A2")
    assert conv.entries == (q, a2) and conv.siblings(a2) == [a1, a2]
    conv.add_user("Q2 after A2")
    conv.step_sibling(a2, -1)  # the earlier reply: what followed A2 stays on its branch
    assert [e.text for e in conv.entries] == ["Q1", "A1"]
    conv.step_sibling(a1, +1)
    assert [e.text for e in conv.entries] == ["Q1", "A2", "Q2 after A2"]
    conv.rewind(q)  # /edit of the first prompt
    assert conv.entries == ()
    conv.add_user("Q1 edited")
    assert [e.text for e in conv.tops] == ["Q1", "Q1 edited"]
    assert {e.text for e in conv.all_entries()} == {"Q1", "A1", "A2", "Q2 after A2",
                                                   "Q1 edited"}
    conv.select(a1)
    assert [e.text for e in conv.entries] == ["Q1", "A1"]


def test_delete_is_the_only_drop_and_saves_may_make_it(tmp_path: Path) -> None:
    conv = Conversation()
    conv.add_user("Q")
    _answer(conv, "A1")
    a2 = _retry(conv, "A2")
    home = tr.autosave(conv, tmp_path)
    conv.delete(a2)
    conv.select(conv.tops[0].children[0])
    assert tr.autosave(conv, tmp_path) == home and conv.parent == ""  # no branch file
    assert [e.text for e in tr.load_transcript(home).all_entries()] == ["Q", "A1"]
    other = tr.load_transcript(home)
    other.tops[0].children.clear()  # a drop nobody asked for: a branch, the file kept
    other.tops[0].active = -1
    assert tr.autosave(other, tmp_path) != home
    assert [e.text for e in tr.load_transcript(home).all_entries()] == ["Q", "A1"]


# ---- format 3 -------------------------------------------------------------------------


@st.composite
def trees(draw: st.DrawFn) -> Conversation:
    """Random trees, made by the operations the app uses."""
    conv = Conversation(id="tree", created=1.0)
    for _ in range(draw(st.integers(0, 10))):
        op = draw(st.sampled_from(["append", "append", "sibling", "rewind", "select"]))
        everything = conv.all_entries()
        if op == "append" or not everything:
            conv.append(draw(entries()))
        elif op == "sibling":
            conv.add_sibling(draw(st.sampled_from(everything)), draw(entries()))
        elif op == "rewind":
            conv.rewind(draw(st.sampled_from(everything)))
        else:
            conv.select(draw(st.sampled_from(everything)))
    return conv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_random_trees_round_trip(conv: Conversation) -> None:
    back = roundtrip(conv)
    assert back == conv
    assert [e.node for e in back.all_entries()] == [e.node for e in conv.all_entries()]
    assert [e.node for e in back.entries] == [e.node for e in conv.entries]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees(), st.integers(0, 50), st.sampled_from(["parent", "node", "sibling", "drop"]),
       st.sampled_from([None, "x", 3, "m0", -1, [], {}]))
def test_mutated_tree_documents_load_or_explain(conv: Conversation, pick: int, key: str,
                                                value: object) -> None:
    doc = to_json_dict(conv)
    nodes = doc["messages"] + doc.get("branches", [])
    if nodes:
        target = nodes[pick % len(nodes)]
        if key == "drop":
            target.pop("node", None)
        else:
            target[key] = value
    try:
        loaded = from_json_dict(json.loads(json.dumps(doc)), source="t.json")
    except tr.TranscriptError as e:
        assert str(e).startswith("Could not load t.json: ")
        return
    assert roundtrip(loaded) == loaded


V2_TRANSCRIPT = json.dumps({
    "format": "chatui-transcript", "version": 2, "id": "v2chat", "created": 1790000000.5,
    "title": "Two", "system_prompt": "",
    "messages": [
        {"role": "user", "text": "Hi", "time": 1790000001.0},
        {"role": "assistant", "text": "Hello", "time": 1790000002.0, "chosen": 0,
         "replies": [{"settings": {"temperature": 0.5}, "text": "Hello",
                      "finish_reason": "stop", "error": "", "usage": None,
                      "tokens": [{"index": 0, "id": 5, "text": "Hello", "logprob": -0.5,
                                  "entropy": 0.75}]}]}]})


def test_version_2_is_migrated_to_a_tree_of_one_branch(tmp_path: Path) -> None:
    path = tmp_path / "v2.json"
    path.write_text(V2_TRANSCRIPT)
    conv = tr.load_transcript(path)
    assert [e.node for e in conv.entries] == ["m0", "m1"]
    assert [e.text for e in conv.all_entries()] == ["Hi", "Hello"]
    _retry(conv, "Hello again")  # a branch: saved in the same file, nothing dropped
    tr.save_transcript(conv, path)
    doc = json.loads(path.read_text())
    assert doc["version"] == tr.FORMAT_VERSION == 3
    assert [m["node"] for m in doc["messages"]][:1] == ["m0"]
    assert [b["text"] for b in doc["branches"]] == ["Hello"]
    back = tr.load_transcript(path)
    assert back == conv and [e.text for e in back.entries] == ["Hi", "Hello again"]


def test_version_1_is_migrated_to_a_tree(tmp_path: Path) -> None:
    path = tmp_path / "v1.json"
    path.write_text(V1_TRANSCRIPT)
    conv = tr.load_transcript(path)
    assert [e.node for e in conv.entries] == ["m0", "m1"]
    assert conv.entries[1].replies[0].settings.seed == 42
    tr.save_transcript(conv, path)
    assert json.loads(path.read_text())["version"] == 3
    assert tr.load_transcript(path) == conv


def test_the_journal_keeps_every_branch(tmp_path: Path) -> None:
    """The autosaver's appends: a retry, a sibling chosen, a reply grown, a new message: the
    files always load as the live tree (no branch file: the tree holds it all)."""
    conv = Conversation()
    writer = AutosaveWriter()
    rng = random.Random(3)
    conv.add_user("Q0")
    _answer(conv, "A0")
    for step in range(30):
        op = rng.choice(["send", "retry", "prev", "grow", "edit"])
        if op == "send":
            conv.add_user(f"Q{step}")
            _answer(conv, f"A{step}")
        elif op == "retry" and conv.entries and conv.entries[-1].role == "assistant":
            _retry(conv, f"R{step}")
        elif op == "prev":
            e = next((e for e in reversed(conv.entries) if len(conv.siblings(e)) > 1), None)
            if e is not None:
                conv.step_sibling(e, rng.choice([-1, 1]))
        elif op == "grow" and conv.entries and conv.entries[-1].reply is not None:
            r = conv.entries[-1].reply
            r.tokens.append(Token(len(r.tokens), 2, "+", -0.1, 0.1))
            r.text += "+"
        elif op == "edit" and conv.last_user is not None:
            conv.rewind(conv.last_user)
            conv.add_user(f"E{step}")
        written = writer.write(conv.snapshot(), tmp_path, conv)
        assert written.id == conv.id, f"step {step} ({op}) made a branch file"
        assert len(list(tmp_path.glob("*.json"))) == 1
        assert tr.load_transcript(tr.autosave_path(conv, tmp_path)) == conv, (step, op)


# ---- exports --------------------------------------------------------------------------


def test_export_writes_the_path_and_all_writes_every_branch(tmp_path: Path) -> None:
    conv = Conversation()
    conv.add_user("Question")
    _answer(conv, "first answer")
    _retry(conv, "second answer")
    conv.add_user("Follow-up")
    _answer(conv, "third answer")
    md = export_markdown(conv)
    assert "second answer" in md and "first answer" not in md
    full = export_markdown(conv, all_branches=True)
    assert all(t in full for t in ("first answer", "second answer", "third answer"))
    assert "## Branch 1 (leaves the conversation after message 1)" in full
    assert len(leaf_paths(conv)) == 2
    path = tr.save_transcript(conv, tmp_path / "c.json") or tmp_path / "c.json"
    from typer.testing import CliRunner

    from chatui.cli import app as cli_app

    out = CliRunner().invoke(cli_app, ["export", str(path), "--all"])
    assert out.exit_code == 0 and "first answer" in out.stdout
    out = CliRunner().invoke(cli_app, ["export", str(path)])
    assert out.exit_code == 0 and "first answer" not in out.stdout


def test_export_all_names_a_fan_outs_alternatives_and_a_branchs_choice():
    """``/export md --all``: a fan-out is headed as one, at its token, each column its
    alternative token (it read "comparison of 3 replies", "default settings" a column), and a
    group off the chosen path does not say the conversation continues with it. Seen in tmux."""
    from chatui.conversation import Reply

    conv = Conversation()
    conv.add_user("Hi")
    first = _answer(conv, "Hello there")
    rows = []
    for word in (" there", " you", "\n"):
        r = Reply(SamplingParams())
        r.tokens = [Token(0, 1, "Hello", -0.1, 0.1), Token(1, 2 + len(rows), word, -1.0, 1.0)]
        r.text = "Hello" + word
        r.finish_reason = "stop"
        rows.append(r)
    fan = conv.add_sibling(first, Entry("assistant", replies=rows, fan_out=True))
    conv.select(first)
    full = export_markdown(conv, all_branches=True)
    assert "### Assistant: fan-out at token 2, 3 alternatives decoded together" in full
    assert "### Alternative 2: ' you'" in full and "comparison of" not in full
    assert "### Alternative 3: '↵'" in full  # a newline token does not break its heading
    assert "continues with this one" not in full and "### Alternative 1: ' there' (chosen)" in full
    conv.select(fan)
    assert "## Assistant: fan-out at token 2" in export_markdown(conv)
    assert "(chosen: the conversation continues with this one)" in export_markdown(conv)


# ---- in the app -----------------------------------------------------------------------


def _numbered():
    counter = iter(range(1000))

    def reply(request, row):
        return f"reply-{next(counter)} with a few words"
    return reply


def _bars(app) -> list[str]:
    return [str(b.render()) for b in app.chat.query(SiblingBar)]


async def test_sibling_navigation_keys_clicks_and_commands(config_dir) -> None:  # noqa: F811
    app = make_app(_numbered())
    async with app.run_test(size=(100, 36)) as pilot:
        await send(pilot, app, "hello")
        await send(pilot, app, "/retry")
        await send(pilot, app, "/retry")
        conv = app.chat.conversation
        assert conv.entries[-1].text.startswith("reply-2") and _bars(app) == ["‹ 3/3 ›"]
        await pilot.press("alt+left")
        await settle(pilot, app)
        assert conv.entries[-1].text.startswith("reply-1") and _bars(app) == ["‹ 2/3 ›"]
        await send(pilot, app, "/sibling prev")
        assert conv.entries[-1].text.startswith("reply-0") and _bars(app) == ["‹ 1/3 ›"]
        await send(pilot, app, "/sibling prev")  # clamped at the first
        assert _bars(app) == ["‹ 1/3 ›"]
        bar = app.chat.query_one(SiblingBar)
        await pilot.click(SiblingBar, offset=(len(str(bar.render())), 0))  # the ›
        await settle(pilot, app)
        assert conv.entries[-1].text.startswith("reply-1")
        await pilot.press("alt+right")
        await settle(pilot, app)
        await send(pilot, app, "a follow-up")  # on the third branch
        await pilot.press("alt+left")  # the conversation below follows the branch
        await settle(pilot, app)
        assert [e.text.split()[0] for e in conv.entries] == ["hello", "reply-1"]
        await send(pilot, app, "/delete")  # says what, deletes nothing
        assert len(conv.all_entries()) == 6, [e.text for e in conv.all_entries()]
        await send(pilot, app, "/delete yes")
        assert len(conv.all_entries()) == 5 and _bars(app) == ["‹ 2/2 ›"]
        app.flush_autosaves()
        disk = tr.load_transcript(tr.autosave_path(conv, app.config.transcripts_dir()))
        assert disk == conv


async def test_the_context_meter_counts_the_branch_shown(config_dir) -> None:  # noqa: F811
    """After Alt+Left, /tree, a search hit or /delete the meter counts the conversation now
    shown (after /delete it kept the count of the branch deleted)."""
    lengths = iter([40, 2, 3])

    def reply(request, row):
        return " ".join(["word"] * next(lengths))

    app = make_app(reply)
    async with app.run_test(size=(100, 36)) as pilot:
        await send(pilot, app, "hello")  # a long reply
        await send(pilot, app, "/retry")  # a short one
        await send(pilot, app, "and then")
        conv = app.chat.conversation
        backend = app.holder["backend"]
        short = app.chat.status.context_used
        assert short == backend.count_tokens(conv.messages())
        await pilot.press("alt+left")  # the long reply, with nothing after it
        await settle(pilot, app)
        await pilot.pause(0.1)
        assert [e.text.split()[0] for e in conv.entries] == ["hello", "word"]
        long = app.chat.status.context_used
        assert long == backend.count_tokens(conv.messages()) != short
        await send(pilot, app, "/delete yes")  # the long one goes: the short branch is shown
        await pilot.pause(0.1)
        assert len(conv.entries) == 4
        assert app.chat.status.context_used == backend.count_tokens(conv.messages()) == short


def test_tree_labels_show_siblings_from_where_they_part() -> None:
    """Branches forked late in a reply start with the same words: their labels start at the
    word before they part, so the tree view tells them apart; a lone branch starts at its
    first word."""
    from chatui.screens.tree import branch_from, branch_label, parting_words

    conv = Conversation()
    conv.add_user("tell me a story")
    _answer(conv, "Once upon a time there was a keeper named Olf who lived by the sea")
    _retry(conv, "Once upon a time there was a keeper named Ada who sailed")
    kids = list(conv.entries[0].children)
    assert parting_words(kids) == [9, 9]
    labels = [branch_label(branch_from(k), False, n) for k, n in zip(kids, parting_words(kids))]
    assert labels[0].startswith("○ assistant: …named Olf who lived by the…")
    assert labels[1].startswith("○ assistant: …named Ada who sailed ·")
    assert parting_words(kids[:1]) == [0]
    _retry(conv, "Once upon a time there was a keeper named Ada who sailed")  # the same again
    same = list(conv.entries[0].children)[1:]
    assert parting_words(same) == [12, 12]
    assert branch_label(branch_from(same[1]), True, 12).startswith("● assistant: Once upon")
    # beside Olf's, the two alike part from it at "named"
    assert parting_words(list(conv.entries[0].children)) == [9, 9, 9]
    # two branches alike for longer than all three are: each from where it leaves the nearest
    _retry(conv, "Once upon a time there was a keeper named Olf who sailed away")
    kids = list(conv.entries[0].children)
    n = parting_words(kids)
    assert n == [11, 9, 9, 11]
    assert branch_label(branch_from(kids[3]), False, n[3]).startswith(
        "○ assistant: …who sailed away ·")
    assert branch_label(branch_from(kids[0]), False, n[0]).startswith(
        "○ assistant: …who lived by the sea ·")
    assert branch_label(branch_from(conv.tops[0]), True).startswith(
        "● you: tell me a story · ")


async def test_tree_view_lists_branches_and_enter_opens_one(config_dir) -> None:  # noqa: F811
    from textual.widgets import Tree

    from chatui.screens.tree import TreeScreen

    app = make_app(_numbered())
    async with app.run_test(size=(100, 36)) as pilot:
        await send(pilot, app, "first question")
        await send(pilot, app, "/retry")
        await send(pilot, app, "second question")
        await pilot.press("f5")
        await pilot.pause()
        assert isinstance(app.screen, TreeScreen)
        tree = app.screen.query_one(Tree)
        labels = []
        stack = list(tree.root.children)
        while stack:
            node = stack.pop(0)
            labels.append(str(node.label))
            stack.extend(node.children)
        assert labels[0].startswith("● you: first question")
        assert any(lbl.startswith("○ assistant: reply-0") and "mean lp" in lbl
                   and " tok" in lbl for lbl in labels)
        assert any(lbl.startswith("● assistant: reply-1") and "3 messages" in lbl
                   for lbl in labels)
        tree.move_cursor(next(n for n in tree.root.children[0].children
                              if str(n.label).startswith("○")))
        await pilot.press("enter")
        await settle(pilot, app)
        assert not isinstance(app.screen, TreeScreen)
        assert [e.text.split()[0] for e in app.chat.conversation.entries] == [
            "first", "reply-0"]
        shown = [i.key for i in app.chat.window.items if i.tag in ("user", "reply")]
        assert shown == list(app.chat.conversation.entries)


async def test_continue_from_alternative_keeps_the_reply(config_dir) -> None:  # noqa: F811
    app = make_app(_numbered())
    async with app.run_test(size=(100, 36)) as pilot:
        await send(pilot, app, "hello")
        view = app.chat._reply_views()[-1]
        first = app.chat.conversation.entries[-1]
        await app.chat.continue_from_alternative(view.id, 1, 2)
        await settle(pilot, app)
        conv = app.chat.conversation
        new = conv.entries[-1]
        assert new is not first and conv.siblings(new) == [first, new]
        assert first.text.startswith("reply-0")  # kept whole
        assert new.reply.tokens[0] == first.reply.tokens[0]  # the shared prefix
        assert new.reply.tokens[1].text == first.reply.tokens[1].top[1].text
        assert _bars(app) == ["‹ 2/2 ›"]
        # the fork point: underlined in the token view, both branches' tokens in the panel
        view = app.chat._reply_views()[-1]
        assert view.forks == frozenset({1}) and view.token_view.forks == frozenset({1})
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home", "right")
        await pilot.pause(0.1)
        branches = str(app.chat.inspector.query_one(".branches").render())
        assert branches == (f"branches here: ‹2/2› {new.reply.tokens[1].text!r} · "
                            f"‹1/2› {first.reply.tokens[1].text!r}")
        await pilot.press("right")
        await pilot.pause(0.1)
        assert not app.chat.inspector.query_one(".branches").display



async def test_the_inspector_counts_a_continuation_whole_once_it_ends(config_dir) -> None:  # noqa: F811
    """A digit in the token view continues from that alternative; the inspector, on the fork
    token, gave the new reply's length as it was when selected ("token 3 of 3" under a reply
    that went on to 227 tokens); once the reply ends it counts all of it."""
    app = make_app(_numbered())
    async with app.run_test(size=(100, 36)) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home", "right", "2")
        await settle(pilot, app)
        await pilot.pause(0.2)
        view = app.chat._reply_views()[-1]
        assert app.chat.conversation.entries[-1].reply is view.reply
        units = len(view.token_view.units)
        detail = str(app.chat.inspector.query_one(".detail").render())
        assert app.chat.inspector.view_id == view.id and units > 2
        assert f"token 2 of {units} " in detail, detail


async def _fan_out_at_third_token(pilot, app) -> None:
    """Ctrl+T, the cursor on the last reply's third token, f: a fan-out of its alternatives."""
    await pilot.press("ctrl+t")
    await pilot.pause(0.1)
    await pilot.press("home", "right", "right", "f")
    await settle(pilot, app)


async def test_fan_out_in_the_token_view(config_dir) -> None:  # noqa: F811
    """``f`` in the token view: the top 3 alternatives at the cursor decoded in one request
    (one prefix, three forced first tokens), streaming as the columns of a new alternative;
    /pick chooses one and the others become its siblings; the original reply stays; the file
    holds everything."""
    from chatui.widgets.compare import CompareView

    backend = _id_backend(_numbered())
    app = make_app(backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, app, "hello")
        original = app.chat.conversation.entries[-1]
        await _fan_out_at_third_token(pilot, app)
        request = backend.requests[-1]
        assert request.first_tokens == (200, 201, 202)
        assert request.prefix.token_ids == (100, 101) and len(request.settings) == 3
        conv = app.chat.conversation
        group = conv.entries[-1]
        assert group is not original and conv.siblings(group) == [original, group]
        assert len(group.replies) == 3
        for r in group.replies:
            assert r.tokens[:2] == original.reply.tokens[:2] and r.finish_reason == "stop"
        [view] = app.chat.query(CompareView)
        assert len(view.views) == 3
        await pilot.press("escape")  # from the token view to the prompt
        await send(pilot, app, "/fanout 9")  # refused, one sentence
        await send(pilot, app, "/pick 2")
        await settle(pilot, app)
        picked = conv.entries[-1]  # the branch picked, its own entry; the others siblings
        assert picked.replies == [group.replies[1]] and len(conv.siblings(picked)) == 4
        assert conv.siblings(picked)[0] is original and _bars(app) == ["‹ 3/4 ›"]
        assert not app.chat.query(CompareView)
        app.flush_autosaves()
        disk = tr.load_transcript(tr.autosave_path(conv, app.config.transcripts_dir()))
        assert disk == conv


async def test_the_token_view_lets_go_of_a_reply_that_leaves_the_screen(config_dir) -> None:  # noqa: F811
    """F6 on a fan-out picks its next branch and splits it; the footer's F6 then goes (it
    stayed, doing nothing), and the inspector lets go of the token it showed when that
    token's reply leaves the screen (it showed "token 3 of 5" of a reply no longer there,
    after the pick and after Alt+Left)."""
    backend = _id_backend(_numbered())
    app = make_app(backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, app, "hello")
        await _fan_out_at_third_token(pilot, app)
        chat = app.chat

        def f6_shown() -> bool:  # in the footer, as the person sees it
            return any(k.action == "pick_next" for k in chat.query("FooterKey"))

        from chatui.widgets.compare import CompareView

        chat.query_one(CompareView).views[0].token_view.focus()  # a column's token shown
        for _ in range(100):
            await pilot.pause(0.02)
            if f6_shown() and chat.inspector.view_id:
                break
        assert f6_shown() and chat.inspector.view_id
        chat.prompt.focus()  # (the footer is refreshed as focus moves; here it stays put)
        await pilot.pause(0.1)
        await pilot.press("f6")
        await settle(pilot, app)
        await pilot.pause(0.1)
        assert len(chat.conversation.siblings(chat.conversation.entries[-1])) == 4
        assert not f6_shown()
        assert chat.inspector.view_id == "" and chat.inspector.position == -1
        chat.query(ReplyView).last().token_view.focus()  # a token of the reply shown now
        for _ in range(100):  # (the focus's TokenSelected reaches the inspector)
            await pilot.pause(0.02)
            if chat.inspector.view_id:
                break
        assert chat.inspector.view_id
        await pilot.press("alt+left")
        await settle(pilot, app)
        assert chat.inspector.view_id == ""


async def test_a_fan_out_cut_short_says_to_pick_then_continue(config_dir) -> None:  # noqa: F811
    """A fan-out's branch cut off at the token limit says what goes on with it (/pick it, then
    /continue), not a comparison's "cannot be continued: /retry it"; the header and the
    columns say alternatives, not "3 settings" of "same settings"; /continue before a pick
    says to pick first, and after /pick it continues the branch."""
    from chatui.widgets.compare import CompareView

    app = make_app(backend=_id_backend(_numbered()))
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, app, "hello")
        await send(pilot, app, "/set max_tokens 4")
        await _fan_out_at_third_token(pilot, app)
        conv = app.chat.conversation
        group = conv.entries[-1]
        assert group.fan_out and {r.finish_reason for r in group.replies} == {"length"}
        [view] = app.chat.query(CompareView)
        shown = " ".join(str(v.render()) for v in view.query("Static"))
        assert "/pick it, then /continue" in shown and "cannot be continued" not in shown
        assert "3 alternatives of a token decoded in one batch" in shown
        assert "alternative 2" in shown and "same settings" not in shown
        await pilot.press("escape")
        await send(pilot, app, "/continue")
        assert "Pick the branch" in str(notices(app, "error")[-1].render())
        assert conv.entries[-1] is group
        await send(pilot, app, "/pick 2")
        await settle(pilot, app)
        picked = conv.entries[-1]
        before = len(picked.reply.tokens)
        await send(pilot, app, "/set max_tokens 50")
        await send(pilot, app, "/continue")
        await settle(pilot, app)
        assert conv.entries[-1] is picked and len(picked.reply.tokens) > before


async def test_an_unpicked_fan_out_comes_back_unpicked(config_dir) -> None:  # noqa: F811
    """Issue 18: a fan-out left without /pick is saved as one (``"fan_out": true``), so the
    next session shows its columns awaiting /pick, and /pick then makes the branch picked the
    one to go on with and the others its siblings, as it would have before the reload (it
    used to come back as a comparison, whose /pick only chose a column)."""
    from chatui.widgets.compare import CompareView

    app = make_app(backend=_id_backend(_numbered()))
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, app, "hello")
        await _fan_out_at_third_token(pilot, app)
        conv = app.chat.conversation
        group = conv.entries[-1]
        assert group.fan_out and len(group.replies) == 3
        app.flush_autosaves()
        path = tr.autosave_path(conv, app.config.transcripts_dir())
        texts = [r.text for r in group.replies]
        original = conv.siblings(group)[0].reply.text
    assert json.loads(path.read_text())["messages"][-1]["fan_out"] is True
    app = make_app(backend=_id_backend(_numbered()), load_path=path)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot, app)
        conv = app.chat.conversation
        group = conv.entries[-1]
        assert group.fan_out and [r.text for r in group.replies] == texts
        [view] = app.chat.query(CompareView)
        assert len(view.views) == 3
        await send(pilot, app, "/pick 3")
        await settle(pilot, app)
        picked = conv.entries[-1]
        assert picked.reply.text == texts[2] and not picked.fan_out
        kids = conv.siblings(picked)
        assert [k.reply.text for k in kids] == [original, *texts]
        assert _bars(app) == ["‹ 4/4 ›"] and not app.chat.query(CompareView)
        app.flush_autosaves()
        disk = tr.load_transcript(tr.autosave_path(conv, app.config.transcripts_dir()))
        assert disk == conv and not any(e.fan_out for e in disk.all_entries())


def _id_backend(reply):
    """A scripted backend whose tokens and alternatives have ids (fan-out needs them)."""
    import dataclasses

    from inference.scripted import ScriptedBackend

    class IdBackend(ScriptedBackend):
        def generate(self, request, cancel):
            for ev in super().generate(request, cancel):
                if hasattr(ev, "tokens"):
                    ev = dataclasses.replace(ev, tokens=tuple(
                        dataclasses.replace(t, id=100 + t.index, top=tuple(
                            dataclasses.replace(a, id=200 + k) for k, a in enumerate(t.top)))
                        for t in ev.tokens))
                yield ev

    return IdBackend(reply)


def test_tree_label_counts_the_tokens_the_reply_line_counts() -> None:
    """The tree's "N tok" is the reply's own statistics line's count: the end-of-turn token
    is not one of them (the tree said 94 tok where the reply said 93 tokens), nor the
    Markdown export's."""
    from chatui.export import reply_stats as export_stats
    from chatui.screens.tree import branch_from, branch_label
    from chatui.widgets.reply import reply_stats

    conv = Conversation()
    conv.add_user("hi")
    entry = _answer(conv, "Hello there")
    reply = entry.replies[0]
    reply.tokens = [Token(0, 5, "Hello", -0.5, 0.5), Token(1, 6, " there", -0.2, 0.5),
                    Token(2, 2, "", -0.1, 0.1, special=True)]
    assert reply_stats(reply).startswith("2 tokens")
    assert " · 2 tok · " in branch_label(branch_from(entry), True)
    assert export_stats(reply).startswith("2 tokens")  # (the Markdown export said 3)


async def test_a_switch_of_branch_keeps_the_notices_after_the_messages(config_dir) -> None:  # noqa: F811
    """Showing another alternative (Alt+Left, /tree's Enter) puts its messages where the
    ones it replaces were: a notice that came after the reply ("Loaded ...", a setting
    changed) stays after it, instead of ending up between the question and the answer."""

    app = make_app(_numbered())
    async with app.run_test(size=(100, 36)) as pilot:
        await send(pilot, app, "hello")
        await send(pilot, app, "/retry")
        await send(pilot, app, "/set temperature 0.3")  # a notice after the reply
        tags = [i.tag for i in app.chat.window.items]
        assert tags.index("reply") < len(tags) - 1  # the notice after it
        await pilot.press("alt+left")
        await settle(pilot, app)
        assert app.chat.conversation.entries[-1].text.startswith("reply-0")
        after = [i.tag for i in app.chat.window.items]
        assert after == tags, (tags, after)


def test_a_tree_label_of_long_words_keeps_its_statistics_in_view() -> None:
    """First words with no spaces to stop them (emoji, a URL, code) are cut at WORDS_CELLS
    columns with an ellipsis, so the mean logprob and length after them stay on the line (the
    tree view's line cut them off at its edge)."""
    from rich.cells import cell_len

    from chatui.screens.tree import WORDS_CELLS, branch_from, branch_label

    conv = Conversation()
    conv.add_user("cats")
    entry = _answer(conv, "🐁" * 40 + " #CatchMeLiz@BiteYourHead " + "x" * 90)
    label = branch_label(branch_from(entry), True)
    words = label.split(": ", 1)[1].split(" · ")[0]
    assert words.endswith("…") and WORDS_CELLS - 2 <= cell_len(words) <= WORDS_CELLS
    assert " · 1 message" in label and cell_len(label) <= 88  # (the view is 96 wide)


async def test_the_tree_view_fits_each_line_to_its_width(config_dir) -> None:  # noqa: F811
    """Each line of the tree view is fitted to the room its depth leaves when drawn: in a
    narrow terminal a deep branch keeps its line (it was cut at the view's edge under ~60
    columns, its statistics out of sight) and says as much as fits; in a wide one the first
    words take the room (six words were shown in a line of 100 with 40 columns blank)."""
    from textual.widgets import Tree

    question = "tell me about the many uses of a humble paperclip in an office at level {}"

    async def lines_at(size: tuple[int, int]) -> tuple[list[str], int, int]:
        app = make_app(_numbered())
        async with app.run_test(size=size) as pilot:
            for level in range(4):  # a fork at each of four depths
                await send(pilot, app, question.format(level))
                await send(pilot, app, "/retry")
            await pilot.press("f5")
            await pilot.pause(0.2)
            tree = app.screen.query_one(Tree)
            room = tree.scrollable_content_region.width
            text = [tree.render_line(y).text.rstrip() for y in range(tree.last_line + 1)]
            return text, room, tree.virtual_size.width

    narrow, room, virtual = await lines_at((56, 40))
    from rich.cells import cell_len
    # a branch runs to the next fork: the question, then two replies at each of four depths
    assert len(narrow) == 9 and virtual <= room, (narrow, virtual, room)
    assert all(cell_len(line) <= room for line in narrow)
    assert narrow[0].startswith("▼ ● you: tell me about the") and "· 1 message" in narrow[0]
    assert all(" · mean lp " in line for line in narrow[1:5]), narrow  # two levels down
    assert "● assistant: reply-7 with a" in narrow[-1], narrow  # four levels down

    wide, room, virtual = await lines_at((150, 40))
    assert virtual <= room
    top = wide[0]
    assert "you: tell me about the many uses of a humble paperclip in an office at level 0" \
        " · 1 message" in top, top  # the whole question, not six words of it


async def test_a_comparison_column_forks_like_a_reply(config_dir) -> None:  # noqa: F811
    """Continuing from an alternative, or fanning out, at a token of a comparison's column
    (picked or not) branches from that column's own tokens: the branch is the comparison's
    sibling and the comparison stays whole (both were refused on a comparison, with advice to
    /pick a column, even once one was picked; seen in tmux)."""
    from chatui.widgets.compare import CompareView

    backend = _id_backend(_numbered())
    app = make_app(backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, app, "/compare temperature=0 | temperature=1.2 seed=3")
        await send(pilot, app, "hello")
        conv = app.chat.conversation
        group = conv.entries[-1]
        assert group.is_comparison and len(group.replies) == 2
        await send(pilot, app, "/pick 2")
        [view] = app.chat.query(CompareView)
        column = view.views[1]
        assert column.reply is group.replies[1]
        await app.chat.continue_from_alternative(column.id, 2, 2)
        await settle(pilot, app)
        request = backend.requests[-1]
        assert len(request.settings) == 1
        assert request.prefix.token_ids == (*(t.id for t in group.replies[1].tokens[:2]), 201)
        branch = conv.entries[-1]
        assert branch is not group and conv.siblings(branch) == [group, branch]
        assert branch.reply.tokens[:2] == group.replies[1].tokens[:2]
        assert len(group.replies) == 2 and group.chosen == 1  # the comparison as it was
        assert not notices(app) or "comparison" not in str(notices(app)[-1].render())
        # a fan-out at the first column, not the one picked, from its own tokens
        await pilot.press("alt+left")  # back to the comparison
        await settle(pilot, app)
        [view] = app.chat.query(CompareView)
        await app.chat.fan_out(view.views[0].id, 1, 2)
        await settle(pilot, app)
        request = backend.requests[-1]
        first = group.replies[0].tokens
        assert request.prefix.token_ids == (first[0].id,)
        assert request.first_tokens == tuple(a.id for a in first[1].top[:2])
        fan = conv.entries[-1]
        assert fan.fan_out and conv.siblings(fan) == [group, branch, fan]
        app.flush_autosaves()
        disk = tr.load_transcript(tr.autosave_path(conv, app.config.transcripts_dir()))
        assert disk == conv


async def test_a_fan_out_keeps_the_view_on_the_reply_it_branches(config_dir) -> None:  # noqa: F811
    """``f`` on a later reply: the reply leaves the screen for its fan-out, and the view stays
    there (focus moved to the reply above, whose last token the inspector then showed, and the
    conversation scrolled up to it; seen in tmux)."""
    from chatui.widgets.compare import CompareView

    backend = _id_backend(lambda request, row: "word " * 60)
    app = make_app(backend=backend)
    async with app.run_test(size=(120, 30)) as pilot:
        await send(pilot, app, "first")
        await send(pilot, app, "second")
        conv = app.chat.conversation
        first = conv.entries[1]
        await _fan_out_at_third_token(pilot, app)
        await pilot.pause(0.1)
        chat = app.chat
        [view] = chat.query(CompareView)
        shown = [v for v in chat.query(ReplyView) if v.reply is first.reply]
        assert chat.inspector.view_id not in {v.id for v in shown}
        log = chat.log_view
        assert view.region.y < log.region.bottom and log.scroll_y >= log.max_scroll_y - 1


async def test_a_branch_opened_from_the_tree_is_scrolled_to(config_dir, tmp_path):  # noqa: F811
    """The tree view's Enter (``open_node``) on a branch far up a long conversation shows its
    message at the top of the view; the view stayed at the conversation's end, thirty
    exchanges below (``ChatScreen.show_entry``, as for a search's hit)."""
    from chatui.conversation import Reply

    conv = Conversation(title="long")
    early = None
    for i in range(30):
        conv.add_user(f"question number {i}")
        entry = conv.add_assistant([SamplingParams()])
        entry.replies[0].text = "\n\n".join(f"paragraph {j} of reply {i}" for j in range(6))
        entry.replies[0].finish_reason = "stop"
        early = entry if i == 2 else early
    conv.add_sibling(early, Entry("assistant", replies=[
        Reply(SamplingParams(), text="another answer", finish_reason="stop")]))
    path = tmp_path / "long.json"  # it shows the other answer; the long path is a branch
    tr.save_transcript(conv, path)
    app = make_app()
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, f"/load {path}")
        chat = app.chat
        assert len(chat.conversation.entries) == 6
        target = next(e for e in chat.conversation.all_entries() if e.node == early.node)
        await chat.open_node(target.node)  # the long path, from the reply it parts at
        assert len(chat.conversation.entries) == 60 and chat.conversation.entries[5] is target
        assert await until_at_top(pilot, app, target), (
            chat.log_view.scroll_y, chat.log_view.max_scroll_y)
