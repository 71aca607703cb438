"""The token view (issue 14's findings and issue 21's toggling cost), under the pilot."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inference.scripted import ScriptedBackend
from inference.settings import SamplingParams

from textual.css.stylesheet import Stylesheet

from chatui.widgets.compare import CompareView
from chatui.widgets.token_view import UnitBuilder
from test_app import SIZE, loaded, make_app, replies, send, send_nowait, settle, tap

LONG = " ".join(f"w{i}" for i in range(1500))
"""A reply much taller than the screen in the token view."""


def _visible_in_log(app, tv, unit: int) -> bool:
    """Whether unit ``unit``'s first line is inside the conversation's viewport."""
    log = app.chat.log_view
    lines = tv._lines_of(unit)
    assert lines, "the unit has no line"
    top = tv.region.y + tv.styles.gutter.top + lines.start
    window = log.scrollable_content_region
    return window.y <= top < window.bottom


async def test_jumping_in_the_token_view_scrolls_to_the_token():
    """Home, End and ``n`` move the cursor to a token that is off screen: it scrolls into
    view (issue 14)."""
    app = make_app(lambda r, row: LONG, settings=SamplingParams(max_new_tokens=3000))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go")
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        tv = replies(app)[0].token_view
        assert app.focused is tv and tv.cursor == len(tv.units) - 1
        assert _visible_in_log(app, tv, tv.cursor)
        await pilot.press("home")
        await pilot.pause(0.2)
        assert tv.cursor == 0 and _visible_in_log(app, tv, 0)
        await pilot.press("end")
        await pilot.pause(0.2)
        assert _visible_in_log(app, tv, tv.cursor)
        await pilot.press("home")
        await pilot.pause(0.2)
        await pilot.press("n")  # the least likely token (the scripted engine: late in it)
        await pilot.pause(0.2)
        assert _visible_in_log(app, tv, tv.cursor)


class _LowBackend(ScriptedBackend):
    """The scripted engine, with one token made the least likely and empty (the middle part
    of a glyph) or whitespace."""

    def __init__(self, text: str, low: str) -> None:
        super().__init__(lambda r, row: "some words here")
        self.low = low

    def generate(self, request, cancel):
        for ev in super().generate(request, cancel):
            if hasattr(ev, "tokens"):
                ev = dataclasses.replace(ev, tokens=tuple(
                    dataclasses.replace(t, text=self.low, logprob=-9.0) if t.index == 1 else t
                    for t in ev.tokens))
            yield ev


async def test_the_least_likely_token_is_shown_visibly():
    """An empty or whitespace least likely token shows as something, never as ``''``."""
    for low, shown in (("", "∅"), (" ", "·")):
        app = make_app(backend=_LowBackend("", low))
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "go")
            stats = str(replies(app)[0].query_one(".reply-stats").render())
            assert "least likely" in stats and "''" not in stats and "' '" not in stats
            assert shown in stats


async def first_token_selected(pilot, app):
    """A first reply, the token view on and its first token selected: (the side panel, the
    id of the reply view it shows)."""
    await send(pilot, app, "first")
    await pilot.press("ctrl+t")
    await pilot.pause(0.1)
    await pilot.press("home")  # a token of the first reply, selected
    await pilot.pause(0.1)
    return app.chat.inspector, app.chat.inspector.view_id


async def test_the_side_panel_follows_a_new_reply_as_it_streams():
    """With the token view on, the side panel shows a new reply's newest token while it
    streams and its last one when it ends (it kept a token selected before, of another
    reply); a token selected while it streams stops the following."""
    words = " ".join(f"w{i}" for i in range(30))
    app = make_app(lambda r, row: words, delay_s=0.02)
    async with app.run_test(size=SIZE) as pilot:
        inspector, first_view = await first_token_selected(pilot, app)
        assert first_view and inspector.position == 0
        await pilot.press("escape")  # back to the box; the token view stays on
        await send_nowait(app, "second")
        seen = set()
        for _ in range(300):
            await pilot.pause(0.02)
            if inspector.view_id != first_view:
                seen.add(inspector.position)
            if not app.chat.generating and seen:
                break
        await settle(pilot, app)
        second = replies(app)[-1]
        assert inspector.view_id == second.id
        assert len(seen) >= 3  # it moved along while the reply streamed
        units = second.token_view.units
        assert inspector.position == units[-1].start  # its last token, once it ended
        assert "w29" in str(inspector.query_one(".detail").render()).split("alternatives")[0]
        # a token selected while a reply streams: the panel stays on it
        await send_nowait(app, "third")
        for _ in range(200):
            await pilot.pause(0.02)
            if inspector.view_id not in ("", first_view, second.id):
                break
        assert app.chat.generating
        replies(app)[-1].token_view.focus()
        await pilot.press("home")  # the streaming reply's first token, chosen
        await pilot.pause(0.05)
        chosen = (inspector.view_id, inspector.position)
        await settle(pilot, app)
        assert chosen[1] == 0 and (inspector.view_id, inspector.position) == chosen


async def test_the_side_panel_follows_a_new_comparisons_chosen_column():
    """A comparison streamed while the panel kept a token selected before (a scored
    message's, seen in tmux with three columns): it follows the chosen column's newest token,
    as it follows a single reply."""
    words = " ".join(f"w{i}" for i in range(30))
    app = make_app(lambda r, row: f"row{row} " + words, delay_s=0.01)
    async with app.run_test(size=SIZE) as pilot:
        inspector, first_view = await first_token_selected(pilot, app)
        await pilot.press("escape")
        await send(pilot, app, "/compare temp 0 | temp 1")
        await send(pilot, app, "second")
        group = app.chat.query_one(CompareView)
        chosen = group.columns[group.chosen].view
        assert inspector.view_id == chosen.id != first_view
        assert inspector.position == chosen.token_view.units[-1].start  # its last token
        assert "w29" in str(inspector.query_one(".detail").render()).split("alternatives")[0]


def test_a_token_with_a_quote_in_it_is_quoted_unambiguously():
    """As Python's repr: a token holding a single quote goes in double quotes (``('`` read
    ``'(''`` in a stats line; seen in tmux)."""
    from chatui.widgets.text import show_token

    assert show_token("('") == '"(\'"'
    assert show_token(" it's") == '" it\'s"'
    assert show_token('"') == "'\"'"
    assert show_token("'\"") == "''\"'"  # both: the single quotes stay
    assert show_token(" a\n") == "' a↵'"


async def test_continuing_from_an_alternative_moves_the_side_panel():
    """After continuing from an alternative, the inspector shows the chosen token, not the
    one it replaced (issue 14)."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home", "right", "right")
        await pilot.pause(0.1)
        detail = str(app.chat.inspector.query_one(".detail").render())
        assert "alt1" not in detail.split("alternatives")[0]
        await pilot.press("2")
        await settle(pilot, app)
        reply = replies(app)[0].reply
        assert reply.tokens[2].text == "alt1"
        detail = str(app.chat.inspector.query_one(".detail").render())
        assert "'alt1'" in detail.split("alternatives")[0]


async def test_toggling_the_token_view_while_streaming_is_cheap():
    """30 Ctrl+T presses while a reply streams after 12 finished ones: the units made are
    those of the replies drawn, not every reply's units at every press (issue 14/21)."""
    text = " ".join(f"w{i}" for i in range(300))
    app = make_app(lambda r, row: text, delay_s=0.02,
                   settings=SamplingParams(max_new_tokens=400))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        app.holder["backend"].delay_s = 0.0
        for i in range(12):
            await send(pilot, app, f"q{i}")
        app.holder["backend"].delay_s = 0.02
        await send_nowait(app, "go")
        await tap(app, "a", 0.3)
        before = UnitBuilder.built
        applied = 0
        apply = Stylesheet.apply

        def counting(self, node, *args, **kwargs):
            nonlocal applied
            applied += 1
            return apply(self, node, *args, **kwargs)

        Stylesheet.apply = counting  # type: ignore[method-assign]
        try:
            for _ in range(30):
                await tap(app, "ctrl+t", 0.05)
            await settle(pilot, app)
        finally:
            Stylesheet.apply = apply  # type: ignore[method-assign]
        built = UnitBuilder.built - before
        # every reply's units at every press would be 30 / 2 * 13 * 300 = 58,500
        assert built <= 15 * 300 * 4, built
        # a press restyles each reply's few widgets (a reply drawn as Markdown widgets was
        # ~50 widgets: 30 * 13 * 50 = 19,500), not the whole screen
        assert applied <= 30 * 13 * 15, applied


@pytest.mark.parametrize("position", [3, 9])
async def test_continuing_from_an_alternative_keeps_max_tokens_for_the_whole_reply(position):
    """max_tokens bounds the reply, not the continuation: with max_tokens 10, continuing from
    an alternative at token 3 yields 10 tokens (not 4 + 10), and at the last token the reply
    is already full (issue 14: 513 tokens for max_tokens 512)."""
    text = " ".join(f"w{i}" for i in range(40))
    app = make_app(lambda r, row: text, settings=SamplingParams(max_new_tokens=10))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        reply = replies(app)[0].reply
        assert len(reply.tokens) == 10 and reply.finish_reason == "length"
        await app.chat.continue_from_alternative(replies(app)[0].id, position, 2)
        await settle(pilot, app)
        reply = replies(app)[0].reply
        assert len(reply.tokens) == 10, [t.text for t in reply.tokens]
        assert reply.finish_reason == "length"
        assert reply.settings.max_new_tokens == 10


async def test_a_stats_line_wraps_between_its_parts_never_inside_a_token():
    """The least likely token is quoted with its leading space (``' acrylic'``): Textual
    wrapped the statistics line at that space, so a line ended in ``least likely '`` and the
    next began ``acrylic' 0.068%`` (seen in tmux). At every width the line now breaks only
    after a separator, and the view's height is the lines it draws."""
    from rich.cells import cell_len

    from chatui.widgets.parts_line import pack

    for cols in range(44, 100, 3):
        app = make_app(backend=_LowBackend("", " acrylic"))
        async with app.run_test(size=(cols, 30)) as pilot:
            await send(pilot, app, "go")
            await pilot.pause(0.05)
            stats = replies(app)[0].query_one(".reply-stats")
            width = stats.content_region.width
            lines = [line.text.rstrip() for line in stats.render_lines(
                stats.region.reset_offset.shrink(stats.styles.gutter))]
            lines = [line for line in lines if line]
            assert any("least likely ' acrylic' 0.012%" in line for line in lines), \
                (cols, lines)
            assert all(cell_len(line) <= width and not line.endswith("'") for line in lines)
            assert stats.size.height == len(pack(stats.pieces, width).split("\n")) \
                == len(lines), (cols, lines)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.text(alphabet=" ab'%日.", min_size=1, max_size=14)
                          .filter(lambda t: t.strip() == t),
                          st.sampled_from([" · ", ", ", " "])), min_size=1, max_size=8),
       st.integers(4, 60))
def test_packed_parts_keep_each_part_whole_and_fit_where_they_can(pieces, width):
    """Random parts at random widths: no line is wider than the width unless one part alone
    is; a part is never split over two lines; nothing is lost or reordered."""
    from rich.cells import cell_len

    from chatui.widgets.parts_line import pack

    pieces[-1] = (pieces[-1][0], "")
    lines = pack(pieces, width).split("\n")
    texts = [t for t, _ in pieces]
    at = 0
    for line in lines:
        inside: list[str] = []
        rest = line
        while at < len(texts) and rest.startswith(texts[at]):
            inside.append(texts[at])
            rest = rest[len(texts[at]):]
            sep = pieces[at][1]
            at += 1
            if rest.startswith(sep):
                rest = rest[len(sep):]
            elif rest.startswith(sep.rstrip()):
                rest = rest[len(sep.rstrip()):]
            else:
                rest = rest.lstrip()
        assert rest == "" and inside, (pieces, width, lines)
        assert cell_len(line) <= width or len(inside) == 1, (pieces, width, lines)
    assert at == len(texts)


async def test_the_side_panel_is_compact_between_the_narrow_and_wide_layouts():
    """At 80 columns the 46-cell panel left the conversation 33 cells (26 at 72; seen in
    tmux): between ``NARROW_BELOW`` and ``WIDE_FROM`` it is 38 cells, its lines shortened so
    none wraps, and the wide lines come back when the terminal widens (or the panel goes below
    the conversation, where it has the whole width)."""
    from chatui.widgets.inspector import NARROW_BELOW, WIDE_FROM

    app = make_app(lambda r, row: "The quick brown fox jumps over the lazy dog.")
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, app, "go")
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home")
        await pilot.pause(0.1)
        chat, inspector = app.chat, app.chat.inspector
        detail = inspector.query_one(".detail")

        def lines() -> list[str]:
            return str(detail.render()).splitlines()

        for width, compact in ((80, True), (NARROW_BELOW, True), (WIDE_FROM - 1, True),
                               (WIDE_FROM, False), (NARROW_BELOW - 1, False), (80, True)):
            await pilot.resize_terminal(width, 24)
            for _ in range(5):
                await pilot.pause(0.02)
            shown = lines()
            assert ("(digit: continue)" in "\n".join(shown)) is compact, (width, shown)
            assert any(line.startswith("prob ") for line in shown) is compact, width
            room = inspector.scrollable_content_region.width
            assert max(map(len, shown)) <= room, (width, room, shown)  # no line wraps
            assert detail.outer_size.height == len(shown), width
            if NARROW_BELOW <= width < WIDE_FROM:
                assert inspector.outer_size.width == 38
                assert chat.log_view.outer_size.width >= width - 38 - 1


class _ServerLike(ScriptedBackend):
    """The scripted engine as an OpenAI-compatible server reports: no token ids and no entropy
    (``ModelInfo``), and, with ``logprobs`` False, no logprobs at all."""

    def __init__(self, logprobs: bool) -> None:
        super().__init__(lambda r, row: "some words here")
        self.info = dataclasses.replace(self.info, has_token_ids=False, has_entropy=False)
        self.logprobs = logprobs

    def generate(self, request, cancel):
        for ev in super().generate(request, cancel):
            if hasattr(ev, "tokens"):
                ev = dataclasses.replace(ev, tokens=tuple(
                    dataclasses.replace(t, id=None, entropy=None,
                                        **({} if self.logprobs else {"logprob": None,
                                                                     "top": ()}))
                    for t in ev.tokens))
            yield ev


@pytest.mark.parametrize("logprobs", [True, False])
async def test_what_a_server_does_not_report_is_marked_not_left_out(logprobs):
    """Over a server (no token ids, no entropy; README, "OpenAI-compatible servers") the side
    panel says those are not reported, and a reply with no logprobs at all says so and draws
    its tokens with no heat colour (they took the colour of a sure token)."""
    app = make_app(backend=_ServerLike(logprobs))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go")
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        panel = str(app.chat.inspector.query_one(".detail").render())
        assert "entropy" in panel and "id" in panel and "not reported" in panel
        assert ("not sent" in panel) is not logprobs
        tv = replies(app)[0].token_view
        heat = {s.rich_style.color for s in tv._heat_styles()}
        strip = tv._render_strip(0, tv.size.width, tv.visual_style)
        colours = {seg.style.color for seg in strip if seg.text.strip() and seg.style}
        assert bool(colours & heat) is logprobs


def test_a_scored_texts_first_token_says_why_it_has_no_probability():
    """A scored text's first token (a tokenizer with no BOS: nothing comes before it) has no
    logprob; the side panel says why, wide and compact, where it said nothing."""
    from inference.types import Token

    from chatui.widgets.inspector import describe_tokens

    first = Token(0, 42, "Paris", None, None)
    assert "none: nothing comes before it" in str(describe_tokens([first], 0, 7, False))
    compact = str(describe_tokens([first], 0, 7, False, compact=True))
    assert "none (first token)" in compact
    assert max(len(line) for line in compact.splitlines()) <= 35
