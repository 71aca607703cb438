"""Compare mode (issue 5): presets, divergence, and pilot tests of /compare, stop, pick,
presets, narrow terminals and transcripts on the scripted engine; plus columns checked against
single runs of the real engine (tiny model) through the worker and the app."""

from __future__ import annotations

import json

import pytest

from chatui import presets
from chatui.conversation import Reply
from chatui.screens.compare import CompareScreen
from chatui.state import settings_label
from chatui.conversation import first_divergence
from chatui.widgets.compare import MIN_COLUMN, CompareView, column_labels
from chatui.widgets.reply import ReplyView
from inference.scripted import echo_reply
from inference.settings import SamplingParams, SettingsError, parse_assignments
from inference.types import GenerationRequest, Message, Token, TokenBatch
from test_app import loaded, make_app, notices, send, settle, tap

SIZE = (140, 44)
TWO = "/compare temperature=0 | temperature=1.2 seed=3"
FOUR = "/compare temperature=0 | temperature=0.7 top_p=0.9 | temperature=1.2 min_p=0.05 seed=7 | top_k=1"


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "config"


def compare_views(app) -> list[CompareView]:
    return list(app.chat.query(CompareView))


def last_error(app) -> str:
    return str(notices(app, "error")[-1].render())


# ---- pure logic ----


def test_parse_columns_on_top_of_base_settings():
    base = SamplingParams(temperature=0.5, max_new_tokens=100)
    rows = presets.parse_columns(presets.split_columns("temperature=0 | top_p=0.9,seed=7 | "),
                                 base)
    assert rows[0] == base.with_values(temperature=0)
    assert rows[1] == base.with_values(top_p=0.9, seed=7)
    assert rows[2] == base  # an empty column: the settings in force
    assert presets.parse_column("current", base) == base


@pytest.mark.parametrize("text, needle", [
    ("temperature=0", "2 to 6 columns"),
    (" | ".join(["temperature=0"] * 7), "2 to 6 columns"),
    ("temperature=0 | top_p=2", "column 2 ('top_p=2'): top_p must be in (0, 1]"),
    ("temperature=0 | warmth=1", "column 2 ('warmth=1'): unknown setting"),
])
def test_parse_columns_refuses_with_a_sentence(text, needle):
    with pytest.raises(SettingsError, match=None) as info:
        presets.parse_columns(presets.split_columns(text), SamplingParams())
    assert needle in str(info.value)


def test_presets_save_load_delete(tmp_path):
    cfg = tmp_path / "cfg"
    assert presets.load_presets(cfg) == {}
    presets.save_preset(cfg, "fast-vs-creative", ["temperature=0", "temperature=1.2 top_p=0.95"])
    presets.save_preset(cfg, "pair", ["current", "seed=1"])
    assert presets.load_presets(cfg) == {
        "fast-vs-creative": ("temperature=0", "temperature=1.2 top_p=0.95"),
        "pair": ("current", "seed=1")}
    assert (cfg / presets.PRESETS_FILE).exists()
    assert presets.delete_preset(cfg, "pair") and not presets.delete_preset(cfg, "pair")
    assert list(presets.load_presets(cfg)) == ["fast-vs-creative"]
    with pytest.raises(presets.PresetError, match="cannot be a preset name"):
        presets.save_preset(cfg, "has space", ["temperature=0", "temperature=1"])
    with pytest.raises(SettingsError, match="column 2"):
        presets.save_preset(cfg, "bad", ["temperature=0", "temperature=-1"])


def test_damaged_presets_file_is_ignored(tmp_path):
    (tmp_path / presets.PRESETS_FILE).write_text("{not json")
    assert presets.load_presets(tmp_path) == {}
    (tmp_path / presets.PRESETS_FILE).write_text(json.dumps(
        {"presets": {"ok": ["a=1", "b=2"], "one": ["a=1"], "bad name": ["a", "b"]}}))
    assert presets.load_presets(tmp_path) == {"ok": ("a=1", "b=2")}


def _reply(ids, finished=True):
    return Reply(SamplingParams(), tokens=[Token(i, t, str(t), -1.0, 1.0) for i, t in
                                           enumerate(ids)],
                 finish_reason="stop" if finished else None)


def test_first_divergence():
    assert first_divergence([_reply([1, 2, 3]), _reply([1, 2, 4])]) == (2, 2)
    assert first_divergence([_reply([1, 2, 3]), _reply([1, 2, 3])]) == (None, 3)
    # still streaming and agreeing so far: no divergence yet
    assert first_divergence([_reply([1, 2], False), _reply([1, 2, 3], False)]) == (None, 2)
    # one ended where another went on
    assert first_divergence([_reply([1, 2]), _reply([1, 2, 3], False)]) == (2, 2)
    assert first_divergence([_reply([5]), _reply([6]), _reply([5])]) == (0, 0)


def test_column_labels_show_what_differs():
    a = SamplingParams(temperature=0, max_new_tokens=64)
    b = SamplingParams(temperature=1.2, seed=3, max_new_tokens=64)
    labels, shared = column_labels([a, b])
    assert labels == ["temp 0", "temp 1.2, seed 3"]
    # in the status bar's words, and what does nothing (top_p 1, rep 1...) is left out
    assert shared == "max 64"
    assert column_labels([a, a])[0] == ["same settings", "same settings"]
    # a setting that differs is named in every column, even where it does nothing
    c = SamplingParams(top_p=0.9, repetition_penalty=1.1)
    labels, shared = column_labels([c, SamplingParams()])
    assert labels == ["top_p 0.9, rep 1.1", "top_p 1, rep 1"]
    assert shared == "temp 0.7, max 512"
    assert settings_label(c) == "temp 0.7 · max 512 · top_p 0.9 · rep 1.1"
    # every label can be typed back to /set
    assert parse_assignments(settings_label(c)) == c
    assert parse_assignments(labels[0] + ", " + shared) == c


# ---- pilot tests (scripted engine) ----


async def test_compare_two_settings_streams_two_columns():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, TWO)
        assert "Comparing 2 settings on the next prompt" in str(notices(app)[-1].render())
        assert "compare: 2 columns" in app.chat.status.settings
        await send(pilot, app, "hello")
        backend = app.holder["backend"]
        request = backend.requests[-1]
        assert len(request.settings) == 2  # one request: one prefill, one batch
        assert request.settings[0].temperature == 0 and request.settings[0].greedy
        assert request.settings[1].temperature == 1.2 and request.settings[1].seed == 3
        entry = app.chat.conversation.entries[-1]
        assert entry.is_comparison and entry.chosen == 0
        [view] = compare_views(app)
        for i, col in enumerate(view.columns):
            reply = entry.replies[i]
            assert reply.finish_reason == "stop"
            assert reply.text == echo_reply(request, i)
            assert col.view.markdown.source == reply.text  # every token reached the column
            assert "tokens" in str(col.view.query_one(".reply-stats").render())
        header0, header1 = (str(c.query_one(".column-meta").render()) +
                            str(c.query_one(".column-divergence").render())
                            for c in view.columns)
        assert "deterministic" in header0 and "deterministic" not in header1
        # the replies differ first at the `print(row + ...)` line
        pos = next(i for i, (a, b) in enumerate(zip(entry.replies[0].tokens,
                                                      entry.replies[1].tokens))
                   if a.text != b.text)
        assert view.divergence == pos
        assert f"diverges at token {pos + 1}" in header0 and f"diverges at token {pos + 1}" in header1
        assert "compare" not in app.chat.status.settings  # armed for one reply only
        await send(pilot, app, "and then?")
        assert len(backend.requests[-1].settings) == 1


async def test_compare_four_settings_and_pick_continues_with_that_column():
    app = make_app()
    async with app.run_test(size=(180, 44)) as pilot:
        await send(pilot, app, FOUR)
        await send(pilot, app, "four ways")
        backend = app.holder["backend"]
        assert len(backend.requests[-1].settings) == 4
        [view] = compare_views(app)
        assert len(view.columns) == 4
        reasons = [r.finish_reason for r in view.entry.replies]
        assert reasons == ["stop"] * 4, (reasons, app.chat.generating)
        metas = [str(c.query_one(".column-meta").render()) for c in view.columns]
        assert ["deterministic" in m for m in metas] == [True, False, False, True]
        await send(pilot, app, "/pick 3")
        entry = view.entry
        assert entry.chosen == 2 and entry.content == entry.replies[2].text
        assert view.columns[2].has_class("-chosen") and not view.columns[0].has_class("-chosen")
        await send(pilot, app, "go on")
        sent = backend.requests[-1].messages
        assert sent[-2] == Message("assistant", entry.replies[2].text)
        assert len(backend.requests[-1].settings) == 1


async def test_the_token_view_opens_on_the_column_picked():
    """Ctrl+T after a comparison puts the token cursor in the column the conversation goes on
    with (it opened in the first column whichever was picked; seen in tmux)."""
    app = make_app()
    async with app.run_test(size=(180, 44)) as pilot:
        await send(pilot, app, FOUR)
        await send(pilot, app, "four ways")
        [view] = compare_views(app)
        for pick in (3, 2):
            await send(pilot, app, f"/pick {pick}")
            app.chat.toggle_token_mode()
            await pilot.pause()
            focused = app.focused
            assert focused is view.columns[pick - 1].view.token_view, (pick, focused)
            app.chat.toggle_token_mode()
            await pilot.pause()


async def test_pick_by_key_and_by_click_and_refusals():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/pick 1")
        assert not app.chat.can_pick
        assert "not a comparison" in last_error(app)
        await send(pilot, app, TWO)
        await send(pilot, app, "hi")
        [view] = compare_views(app)
        await pilot.press("f6")  # the next column
        assert view.entry.chosen == 1 and view.chosen == 1
        await pilot.press("f6")  # and round again
        assert view.entry.chosen == 0
        await pilot.press("f6")
        await pilot.click(view.columns[0].query_one(".column-header"))
        await pilot.pause()
        assert view.entry.chosen == 0
        await send(pilot, app, "/pick 7")
        assert "from 1 to 2" in last_error(app)


async def test_escape_stops_every_column_and_keeps_partial_text():
    long = "".join(f"word{i} " for i in range(400))
    app = make_app(lambda r, row: f"row {row}: {long}", delay_s=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, TWO)
        await send(pilot, app, "go", wait=False)
        for _ in range(200):
            entry = app.chat.conversation.entries[-1]
            if entry.role == "assistant" and all(len(r.tokens) > 3 for r in entry.replies):
                break
            await pilot.pause(0.01)
        await tap(app, "escape")
        await settle(pilot, app)
        entry = app.chat.conversation.entries[-1]
        assert [r.finish_reason for r in entry.replies] == ["cancelled", "cancelled"]
        assert all(0 < len(r.tokens) < 400 for r in entry.replies)
        assert all(r.text.startswith(f"row {i}: word0") for i, r in enumerate(entry.replies))
        assert not app.chat.generating
        for _ in range(100):  # (a loaded machine can redraw the columns after settle's pause)
            metas = [str(c.query_one(".column-meta").render())
                     for c in compare_views(app)[0].columns]
            if all("stopped" in m for m in metas):
                break
            await pilot.pause(0.02)
        assert all("stopped" in m for m in metas), metas
        # the columns' markers say how one goes on: /continue takes the column picked
        markers = [str(c.view.query_one(".reply-finish").render())
                   for c in compare_views(app)[0].columns]
        assert all("stopped" in m and "/pick it, then /continue" in m for m in markers), markers


async def test_a_column_that_finishes_early_ends_while_others_stream():
    def script(request, row):
        return "short." if row == 0 else "".join(f"w{i} " for i in range(60))

    app = make_app(script, delay_s=0.03)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, TWO)
        await send(pilot, app, "go", wait=False)
        for _ in range(500):
            views = compare_views(app)
            if views and views[0].entry.replies[0].finish_reason is not None:
                break
            await pilot.pause(0.01)
        await pilot.pause(0.05)
        [view] = compare_views(app)
        a, b = view.entry.replies
        assert a.finish_reason == "stop" and b.finish_reason is None  # still streaming
        assert "✓ stop" in str(view.columns[0].query_one(".column-meta").render())
        assert view.divergence == 0
        await settle(pilot, app)
        assert b.finish_reason == "stop" and len(a.tokens) == 1 and len(b.tokens) > 50


async def test_retry_compares_on_the_last_prompt_and_reruns_a_comparison():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        assert not compare_views(app)
        await send(pilot, app, TWO)
        await pilot.press("ctrl+r")  # the armed comparison answers the last prompt again
        await settle(pilot, app)
        conv = app.chat.conversation
        assert [e.role for e in conv.entries] == ["user", "assistant"]
        assert conv.entries[1].is_comparison and len(compare_views(app)) == 1
        await send(pilot, app, "/retry")  # a comparison is retried as a comparison
        assert conv.entries[1].is_comparison and len(compare_views(app)) == 1
        assert len(app.holder["backend"].requests[-1].settings) == 2
        await send(pilot, app, "/continue")  # its columns finished on their own
        assert "Column 1 finished on its own" in last_error(app)


async def test_continue_goes_on_with_the_picked_column_as_an_alternative_to_the_comparison():
    """/continue on a comparison cut off at the token limit: the column picked goes on as a
    new alternative to the comparison (‹ ›), with that column's own settings and the max_tokens
    in force, from the column's text; the comparison stays as it was beside it (it used to be
    refused: "a comparison cannot be continued", even with its column picked)."""
    app = make_app(lambda r, row: f"column{row} one two three four five six")
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/set max_tokens 3")
        await send(pilot, app, TWO)
        await send(pilot, app, "hello")
        await settle(pilot, app)
        conv = app.chat.conversation
        group = conv.entries[-1]
        assert group.is_comparison and {r.finish_reason for r in group.replies} == {"length"}
        [view] = compare_views(app)
        shown = " ".join(str(v.render()) for v in view.query("Static"))
        assert "/pick it, then /continue" in shown and "cannot be continued" not in shown
        column = group.replies[1]
        before = [t.text for t in column.tokens]
        await send(pilot, app, "/pick 2")
        await send(pilot, app, "/set max_tokens 100")
        await send(pilot, app, "/continue")
        await settle(pilot, app)
        request = app.holder["backend"].requests[-1]
        [settings] = request.settings
        assert (settings.temperature, settings.seed, settings.max_new_tokens) == (1.2, 3, 100)
        assert request.prefix is not None and request.prefix.text == "".join(before)
        entry = conv.entries[-1]
        assert entry is not group and not entry.is_comparison
        assert conv.siblings(entry) == [group, entry]
        assert [t.text for t in entry.reply.tokens][: len(before)] == before
        assert len(entry.reply.tokens) > len(before) and entry.reply.finish_reason == "stop"
        assert [t.text for t in column.tokens] == before and column.finish_reason == "length"
        assert not compare_views(app) and "2/2" in " ".join(
            str(w.render()) for w in app.chat.query("Static"))
        await send(pilot, app, "/continue")
        assert "finished on its own" in last_error(app)
        await pilot.press("alt+left")  # the comparison, as it was
        await settle(pilot, app)
        assert conv.entries[-1] is group and len(compare_views(app)) == 1


async def test_compare_answers_a_pending_prompt_at_once():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.chat.conversation.add_user("pending question")
        await send(pilot, app, TWO)
        entry = app.chat.conversation.entries[-1]
        assert entry.is_comparison and all(r.finish_reason == "stop" for r in entry.replies)
        assert entry.replies[0].text.startswith("You said: pending question")


async def test_compare_errors_and_off():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/compare temperature=0 | top_p=7")
        assert "column 2" in last_error(app) and "top_p" in last_error(app)
        await send(pilot, app, "/compare nosuchpreset")
        assert "no compare preset 'nosuchpreset'" in last_error(app)
        await send(pilot, app, TWO)
        await send(pilot, app, "/compare off")
        assert "cancelled" in str(notices(app)[-1].render())
        await send(pilot, app, "plain")
        assert len(app.holder["backend"].requests[-1].settings) == 1
        # the columns as the app writes settings ("expected NAME=VALUE, got 'temp'")
        await send(pilot, app, "/compare temp 0 | temp 1.0 top_p 0.9")
        await send(pilot, app, "again")
        settings = app.holder["backend"].requests[-1].settings
        assert [(s.temperature, s.top_p) for s in settings] == [(0.0, 1.0), (1.0, 0.9)]


async def test_compare_screen_saves_presets_and_arms(config_dir):
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/compare")  # no argument: the compare screen
        screen = app.screen
        assert isinstance(screen, CompareScreen)
        screen.column_input(0).value = "temperature=0"
        screen.column_input(1).value = "temperature=1.1 top_p=0.9"
        screen.column_input(2).value = "top_k=1"
        screen.column_input(3).value = "temperature=9000"
        screen.name_input.value = "fast-vs-creative"
        await pilot.click("#save")
        assert "temperature must be between 0 and 100" in str(screen.error.render())
        screen.column_input(3).value = ""
        await pilot.pause(0.3)  # a Button ignores a second press within its active effect
        await pilot.click("#save")
        assert presets.load_presets(config_dir) == {
            "fast-vs-creative": ("temperature=0", "temperature=1.1 top_p=0.9", "top_k=1")}
        await pilot.press("escape")  # close without arming
        assert not isinstance(app.screen, CompareScreen) and not app.chat.compare_armed
        await send(pilot, app, "/compare fast-vs-creative")
        assert app.chat.compare_armed == ("temperature=0", "temperature=1.1 top_p=0.9",
                                          "top_k=1")
        assert "fast-vs-creative" in app.chat.status.settings
        await send(pilot, app, "three")
        assert len(compare_views(app)[0].columns) == 3
        # the screen again: a saved preset loads into the rows, Compare arms
        await send(pilot, app, "/compare")
        screen = app.screen
        screen.load_preset("fast-vs-creative")
        screen.column_input(2).value = ""
        await pilot.click("#arm")
        assert app.chat.compare_armed == ("temperature=0", "temperature=1.1 top_p=0.9")


async def test_palette_offers_compare():
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        titles = [c.title for c in app.get_system_commands(app.chat)]
        assert "/compare" in titles


async def test_narrow_terminal_stacks_and_medium_one_puts_the_columns_in_rows():
    app = make_app()
    async with app.run_test(size=(50, 60)) as pilot:
        await send(pilot, app, FOUR)
        await send(pilot, app, "narrow")
        [view] = compare_views(app)
        assert view.has_class("-stacked")
        xs = {c.region.x for c in view.columns}
        assert len(xs) == 1  # one above the other
    app = make_app()
    async with app.run_test(size=(100, 44)) as pilot:
        await send(pilot, app, FOUR)
        await send(pilot, app, "medium")
        [view] = compare_views(app)
        assert not view.has_class("-stacked") and view.has_class("-rows")
        assert all(c.size.width >= MIN_COLUMN - 1 for c in view.columns)
        scroller = view.query_one("HorizontalScroll")
        # two rows of two (the fourth column was off the screen's edge, behind a horizontal
        # scroll whose bar was at the bottom of the comparison)
        assert scroller.max_scroll_x == 0
        first = view.columns[0].region
        assert [(c.region.x > first.x, c.region.y > first.y) for c in view.columns] == [(False, False), (True, False), (False, True),
                                           (True, True)]
        await pilot.press("ctrl+t")  # token view and inspector: the columns stay in the view
        await pilot.pause(0.3)
        assert all(c.outer_size.width <= view.size.width for c in view.columns)
        assert len({c.outer_size.width for c in view.columns}) == 1


async def test_comparison_round_trips_through_a_transcript(tmp_path):
    from chatui import transcript

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, TWO)
        await send(pilot, app, "keep this")
        await send(pilot, app, "/pick 2")
        path = tmp_path / "cmp.json"
        await send(pilot, app, f"/save {path}")
        before = [r.text for r in app.chat.conversation.entries[-1].replies]
        await send(pilot, app, "/clear")
        assert not compare_views(app)
        await send(pilot, app, f"/load {path}")
        [view] = compare_views(app)
        assert [r.text for r in view.entry.replies] == before
        assert view.entry.chosen == 1 and view.columns[1].has_class("-chosen")
        for col in view.columns:
            await pilot.pause(0.1)
            assert col.view.markdown.source == col.reply.text
        assert view.divergence is not None
        assert [len(r.tokens) for r in view.entry.replies] == [
            len(r.tokens) for r in transcript.load_transcript(path).entries[-1].replies]
        # the token view works in the columns too
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        assert all(isinstance(v, ReplyView) and v.token_mode for v in
                   (c.view for c in view.columns))


# ---- the real engine (tiny model) through the worker and the app ----


async def test_columns_equal_single_runs_on_the_real_engine(tiny_ckpt):
    from chatui.app import ChatApp
    from chatui.config import AppConfig
    from inference.engine import LocalBackend

    app = ChatApp(lambda progress: LocalBackend.from_checkpoint(tiny_ckpt),
                  config=AppConfig(stable_timings=True,
                                   settings=SamplingParams(max_new_tokens=16)))
    columns = ("temperature=0", "temperature=1.0 seed=11", "temperature=1.5 top_k=1",
               "temperature=1.5 seed=5", "temperature=0.8 top_p=0.9 top_k=40 seed=3")
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/compare " + " | ".join(columns))
        await send(pilot, app, "Tell me a story")
        entry = app.chat.conversation.entries[-1]
        assert entry.is_comparison and len(entry.replies) == 5
        messages = (Message("user", "Tell me a story"),)

        async def single(settings):
            stream = app.worker.generate(GenerationRequest(messages, (settings,), 5))
            events = await stream.collect()
            return [t.id for ev in events if isinstance(ev, TokenBatch) for t in ev.tokens]

        ids = [[t.id for t in r.tokens] for r in entry.replies]
        for i, reply in enumerate(entry.replies):
            assert ids[i] == await single(reply.settings), f"column {i + 1}"
            assert len(ids[i]) > 0
        # the settings really apply per row: top-k=1 is greedy even at temperature 1.5,
        # temperature 1.5 alone is not
        assert ids[2] == ids[0]
        assert ids[3] != ids[0]
        hot = entry.replies[3].tokens
        assert any(t.top and t.id != t.top[0].id for t in hot)
        assert all(t.id == t.top[0].id for t in entry.replies[0].tokens if t.top)


def test_bench_compare_reports_each_n(tiny_backend):
    from inference.bench import run_compare_bench

    eos = tiny_backend.eos_ids
    result = run_compare_bench(tiny_backend, ns=(1, 2), prompt_tokens=16, new_tokens=4)
    assert [r.n for r in result.rows] == [1, 2]
    for r in result.rows:
        assert r.batched_tokens_per_s > 0 and r.sequential_tokens_per_s > 0
        assert r.speedup == pytest.approx(r.batched_tokens_per_s / r.sequential_tokens_per_s)
    assert tiny_backend.eos_ids == eos  # EOS handling restored
    assert set(result.to_dict()) >= {"model", "rows", "new_tokens"}


@pytest.mark.parametrize("quantize", ["int8", "none"])
def test_batched_rows_equal_single_rows_compare_and_fan_out(tiny_ckpt, quantize):
    """Issue 18: compare columns (seeded, top-p over a vocabulary past the 256 candidates) and
    fan-out branches decoded as one batch equal the same rows decoded one by one: tokens, and
    logprobs, entropy and alternatives to float rounding (int8 and fp32: the matmuls and the
    attention give each row bit for bit its single-row result; fp32 past 4 rows ran torch's GEMM
    instead of chatui's matrix-vector kernel, 2e-6 apart, and on an Intel Xeon one column's
    sampled token differed from the same column run alone)."""
    import threading

    from inference.bench import compare_settings, fan_out_requests, make_prompt
    from inference.engine import LocalBackend

    backend = LocalBackend.from_checkpoint(tiny_ckpt, quantize=quantize)
    backend.eos_ids = frozenset()
    messages = make_prompt(backend.tokenizer, 24)

    def rows(request):
        backend.reset()
        out: dict[int, list] = {}
        for e in backend.generate(request, threading.Event()):
            if isinstance(e, TokenBatch):
                out.setdefault(e.row, []).extend(e.tokens)
        return [out[r] for r in sorted(out)]

    settings = compare_settings(5, 10)
    fan, singles = fan_out_requests(backend, messages, 4, 10, 5)
    for batched, alone in (
            (GenerationRequest(messages, settings, 5),
             [GenerationRequest(messages, (s,), 5) for s in settings]),
            (fan, singles)):
        together = rows(batched)
        assert len(together) == len(alone)
        for got, one in zip(together, alone):
            want = rows(one)[0]
            assert [t.id for t in got] == [t.id for t in want]
            for x, y in zip(got, want):
                assert x.logprob == pytest.approx(y.logprob, abs=1e-5)
                assert x.entropy == pytest.approx(y.entropy, abs=1e-4)
                assert [a.id for a in x.top] == [a.id for a in y.top]


def test_bench_fan_out_reports_each_k(tiny_backend):
    from inference.bench import run_fan_out_bench

    result = run_fan_out_bench(tiny_backend, ns=(1, 2), prompt_tokens=16, new_tokens=4)
    assert result.mode == "fan-out" and [r.n for r in result.rows] == [1, 2]
    for r in result.rows:
        assert r.batched_tokens_per_s > 0 and r.sequential_tokens_per_s > 0
        assert r.speedup == pytest.approx(r.batched_tokens_per_s / r.sequential_tokens_per_s)


async def test_the_context_meter_follows_the_column_picked():
    """F6 (or /pick) on a comparison makes another column the conversation's reply: the
    context meter counts that one (it kept the count of the column shown first)."""
    def script(request, row):
        return " ".join(["word"] * (3 if row == 0 else 60))

    app = make_app(script)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, TWO)
        await send(pilot, app, "hi")
        conv = app.chat.conversation
        backend = app.holder["backend"]

        async def meter_counts_the_path() -> int:
            for _ in range(100):  # the meter's timer (0.3 s) follows the path
                if app.chat.status.context_used == backend.count_tokens(conv.messages()):
                    return app.chat.status.context_used
                await pilot.pause(0.02)
            raise AssertionError((app.chat.status.context_used,
                                  backend.count_tokens(conv.messages())))

        short = await meter_counts_the_path()
        await pilot.press("f6")  # the 60-word column
        assert conv.entries[-1].chosen == 1
        long = await meter_counts_the_path()
        assert long > short + 50
        await send(pilot, app, "/pick 1")
        assert await meter_counts_the_path() == short


@pytest.mark.parametrize("width, lines", [(30, ["⑂ diverges at token 12:", "' custom'"]),
                                          (40, ["⑂ diverges at token 12: ' custom'"])])
async def test_the_divergence_token_is_never_cut_in_two(width, lines):
    """Found using chatui in tmux at 100 columns (three columns of 31): the line wrapped at
    the token's own leading space, "⑂ diverges at token 2: '" above "custom'". Where the
    line does not fit, the token goes on a line of its own, whole."""
    from textual.app import App
    from textual.content import Content

    from chatui.textual_compat.testing import render_screen
    from chatui.widgets.compare import DivergenceLine

    class One(App):
        CSS = f"DivergenceLine {{ width: {width}; }}"

        def compose(self):
            yield DivergenceLine()

    app = One()
    async with app.run_test(size=(60, 6)) as pilot:
        app.query_one(DivergenceLine).parts = (Content("⑂ diverges at token 12: "),
                                               Content.styled("' custom'", "bold"))
        await pilot.pause()
        shown = [s.text.rstrip() for s in render_screen(app, fresh=True)]
        assert shown[:len(lines) + 1] == lines + [""], shown
