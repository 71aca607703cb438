"""The render side stays bounded: token view wrapping and drawing, strips without self-cycles,
the garbage-collector policy, and wide characters (CJK, emoji) in the token view and Markdown."""

from __future__ import annotations

import gc
import random

import pytest
from rich.cells import cell_len
from textual.strip import Strip
from rich.segment import Segment

from chatui import gcpolicy
from chatui.textual_compat import strips as strip_cycles
from chatui.textual_compat.testing import VirtualTerminal, render_screen
from chatui.widgets.token_view import LineWrapper, TokenUnit, wrap_units
from inference.settings import SamplingParams
from inference.types import Token

from test_app import SIZE, make_app, replies, send, settle



@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))


PIECES = ["Hello", " world", ",", " 日本語", "の", "テキスト", " 😀", "👋🏽", "\n", "\n\n", " a",
          "verylongwordwithoutanyspaces" * 3, "\t", " ", "ok", " café", "  two"]


def _units(n: int, seed: int = 0) -> list[TokenUnit]:
    rng = random.Random(seed)
    return [TokenUnit(i, i, rng.choice(PIECES), -0.5) for i in range(n)]


@pytest.mark.parametrize("width", [1, 2, 7, 13, 40])
def test_wrap_keeps_lines_within_width_and_units_in_order(width):
    units = _units(400, seed=width)
    wrapper = wrap_units(units, width)
    seen = []
    for line in wrapper.lines:
        text = "".join(p.text for p in line.pieces)
        shown = text[:-1] if line.width == width + 1 and text.endswith(" ") else text
        assert cell_len(text) == line.width  # a space where it broke may hang past the edge
        assert cell_len(shown) <= width or (width < 2 and cell_len(shown) == 2)
        assert "\n" not in text
        seen += [p.unit for p in line.pieces]
    assert seen == sorted(seen)
    # every unit is on a line (a space where a line broke too), and nothing is dropped: the
    # lines joined give the text back (tabs expanded, as each piece of a unit shows them)
    assert set(seen) == set(range(len(units)))
    shown = "".join(p.text for line in wrapper.lines for p in line.pieces)
    assert shown == "".join(part.expandtabs(4) for u in units for part in u.text.split("\n"))


def test_wrap_at_a_space_never_starts_a_line_with_it():
    """A line filled to the last cell breaks before the next word's space, which hangs past
    the edge (cropped when drawn), so the next line starts with the word, not a space."""
    units = [TokenUnit(i, i, t, None) for i, t in enumerate(["abcde", " fgh", " ij"])]
    wrapper = wrap_units(units, 5)
    lines = ["".join(p.text for p in ln.pieces) for ln in wrapper.lines]
    assert lines == ["abcde ", "fgh ", "ij"]
    assert all(not text.startswith(" ") for text in lines)


def test_wrap_never_splits_a_wide_glyph():
    wrapper = wrap_units([TokenUnit(0, 0, "日本語テキスト😀" * 5, None)], 5)
    for line in wrapper.lines:
        for piece in line.pieces:
            assert all(cell_len(ch) == 2 for ch in piece.text)
        assert line.width <= 5


def test_wrap_incremental_equals_whole():
    units = _units(300, seed=3)
    whole = wrap_units(units, 23)
    grown = LineWrapper(23)
    for i, unit in enumerate(units):
        grown.add(i, unit.text)
    assert [ln.pieces for ln in grown.lines] == [ln.pieces for ln in whole.lines]


def test_strip_divide_and_crop_extend_leave_no_cycle():
    strip_cycles.apply()
    strip = Strip([Segment("hello "), Segment("world")])
    assert strip.divide([11]) == [strip]
    assert strip.crop_extend(0, 11, None) is strip
    assert strip.divide([5, 11])[0].text == "hello"
    assert strip.crop_extend(0, 14, None).cell_length == 14
    gc.collect()
    gc.disable()
    try:
        for n in range(100):
            s = Strip([Segment(f"line {n} "), Segment("text")])
            s.divide([s.cell_length])
            s.crop_extend(0, s.cell_length, None)
        del s, strip
        assert gc.collect() == 0  # all freed by reference counting, no cycle left over
    finally:
        gc.enable()


class _Cycle:
    """An object that references itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_gc_policy_freezes_nothing_and_release_collects():
    """Issue 21: nothing is frozen while replies stream (a cycle that dies while one streams is
    found by the next full pass, which waits until the last stream ends), and
    :func:`gcpolicy.release` collects cycles at once."""
    import weakref

    assert gc.isenabled()
    gc.unfreeze()
    frozen = gc.get_freeze_count()
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    thresholds = gc.get_threshold()
    gcpolicy.stream_started()
    gcpolicy.stream_started()  # compare columns nest
    assert gcpolicy.streaming() and gc.get_freeze_count() == frozen
    assert gc.get_threshold()[2] == gcpolicy.DEFERRED  # full passes wait
    del cycle  # garbage in a reference cycle while a reply streams
    gcpolicy.stream_ended()
    assert gcpolicy.streaming()
    gcpolicy.stream_ended()
    assert not gcpolicy.streaming() and gc.get_freeze_count() == frozen
    assert gc.get_threshold() == thresholds
    gc.collect()
    assert alive() is None  # nothing hid it from the collector
    again = _Cycle()
    alive = weakref.ref(again)
    del again
    gcpolicy.release()
    assert alive() is None and gc.get_freeze_count() == frozen


async def test_full_passes_wait_while_the_user_scrolls_and_the_due_one_runs_when_it_settles(
        monkeypatch):
    """Issue 21: PageUp through 200 replies met a full pass every ~8 pages, inside the page's
    frame (60-180 ms). While the user scrolls, full passes wait; once the scrolling has settled
    the one that came due runs (and finds what died meanwhile), and Python's thresholds are
    back. A reply that streams meanwhile keeps holding them until it ends."""
    import asyncio
    import weakref

    monkeypatch.setattr(gcpolicy, "SCROLL_SETTLE_S", 0.05)
    thresholds = gc.get_threshold()
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    gc.collect(1)  # old now: only a full pass frees it once it dies
    gcpolicy.scrolled()
    assert gcpolicy.scrolling() and gc.get_threshold()[2] == gcpolicy.DEFERRED
    del cycle
    for _ in range(thresholds[2]):  # young passes enough that Python would want a full one
        gc.collect(1)
    assert alive() is not None
    gcpolicy.scrolled()  # still scrolling: the settling waits from the last scroll
    await asyncio.sleep(0.02)
    assert gcpolicy.scrolling() and alive() is not None
    for _ in range(20):
        await asyncio.sleep(0.02)
        if not gcpolicy.scrolling():
            break
    assert not gcpolicy.scrolling() and gc.get_threshold() == thresholds
    assert alive() is None  # the due pass ran when the scrolling settled

    # a stream that starts while the user scrolls holds full passes past the settling
    gcpolicy.scrolled()
    gcpolicy.stream_started()
    assert not gcpolicy.scroll_settled()  # nothing collected while a reply streams
    assert gc.get_threshold()[2] == gcpolicy.DEFERRED
    gcpolicy.stream_ended()
    assert gc.get_threshold() == thresholds

    # a very long scroll: the due pass is let through
    monkeypatch.setattr(gcpolicy, "SCROLL_MAX_YOUNG", 0)
    gcpolicy.scrolled()
    assert not gcpolicy.scrolling() and gc.get_threshold() == thresholds


def _old_garbage_while_scrolling():
    """A cycle that became old and then died while the user scrolls, with enough young
    passes since that Python wants a full one; a weak reference to it."""
    import weakref

    due = gc.get_threshold()[2]  # (read before the scroll defers full passes)
    cycle = _Cycle()
    alive = weakref.ref(cycle)
    gc.collect(1)
    gcpolicy.scrolled()
    del cycle
    for _ in range(due):
        gc.collect(1)
    return alive


async def test_a_page_drawn_between_the_keys_of_a_held_key_runs_no_full_pass(monkeypatch):
    """Issue 21: a key held down repeats every 25-50 ms; the window drew each page and what is
    around it before the next key came, and the pass that was due (~100 ms after 200 replies)
    must not run there. The window's "drawn" settles the scrolling only once no scroll came for
    SCROLL_QUIET_S (then it runs at once, or on a timer)."""
    import asyncio

    monkeypatch.setattr(gcpolicy, "SCROLL_QUIET_S", 0.2)
    thresholds = gc.get_threshold()
    alive = _old_garbage_while_scrolling()
    for _ in range(5):  # keys every 30 ms, each page drawn before the next
        assert not gcpolicy.page_drawn()
        assert gcpolicy.scrolling() and alive() is not None
        await asyncio.sleep(0.03)
        gcpolicy.scrolled()
    assert not gcpolicy.page_drawn()  # the last page: drawn, the key let go
    for _ in range(30):
        await asyncio.sleep(0.02)
        if not gcpolicy.scrolling():
            break
    assert not gcpolicy.scrolling() and gc.get_threshold() == thresholds
    assert alive() is None  # the due pass ran once the scrolling was quiet

    # drawn after the quiet time: the pass runs at once
    alive = _old_garbage_while_scrolling()
    await asyncio.sleep(0.25)
    assert gcpolicy.page_drawn() and alive() is None and not gcpolicy.scrolling()


def test_scrolling_without_an_event_loop_holds_nothing():
    thresholds = gc.get_threshold()
    gcpolicy.scrolled()
    assert not gcpolicy.scrolling() and gc.get_threshold() == thresholds


async def test_the_streaming_loop_holds_the_gc_policy():
    """The screen's streaming loop (not a widget) holds the policy while a reply streams and
    lets go when it ends."""
    import asyncio

    from test_app import loaded, send_nowait, tap

    app = make_app(lambda r, row: "word " * 300, delay_s=0.01)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        assert not gcpolicy.streaming()
        await send_nowait(app, "go")
        for _ in range(2000):  # up to 10 s on a loaded machine
            if app.chat.generating and gcpolicy.streaming():
                break
            await asyncio.sleep(0.005)
        assert app.chat.generating and gcpolicy.streaming()
        await tap(app, "escape")
        await settle(pilot, app)
        assert not gcpolicy.streaming()


async def test_long_reply_redraw_renders_only_visible_lines():
    """A 6,000-token reply: appending more text re-renders a few lines, not the reply."""
    text = " ".join(f"w{i}" for i in range(6000))
    app = make_app(lambda r, row: text, token_view=True, context_limit=16384,
                   settings=SamplingParams(max_new_tokens=7000))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go")
        tv = replies(app)[0].token_view
        await pilot.pause(0.2)
        calls = []
        original = tv._render_strip

        def counting(y, width, base):
            calls.append(y)
            return original(y, width, base)

        tv._render_strip = counting  # type: ignore[method-assign]
        tv.tokens.append(Token(len(tv.tokens), None, " tail", -0.1, 0.1))
        tv.sync()
        tv.flush()
        await pilot.pause(0.2)
        assert len(tv.plain_lines()) > 500
        assert 0 < len(calls) <= SIZE[1]
        assert max(calls) >= len(tv.plain_lines()) - 3  # the tail was drawn


WIDE = ("CJK: 日本語のテキストと中文字符，한국어 텍스트. Emoji: 😀👋🏽🇯🇵👨‍👩‍👧 done.\n\n"
        "| 名前 | 値 |\n|---|---|\n| 東京 | 😀 |\n\n```\n# 注释 😀\nprint('日本')\n```\n")


def wide_reply(request, row):
    return WIDE


@pytest.mark.parametrize("token_view", [False, True])
async def test_wide_characters_keep_the_layout(token_view):
    app = make_app(wide_reply, token_view=token_view)
    async with app.run_test(size=(100, 40)) as pilot:
        await send(pilot, app, "wide")
        await pilot.pause(0.2)
        view = replies(app)[0]
        assert view.markdown.source == WIDE
        strips = render_screen(app)  # the whole screen, as drawn
        assert len(strips) == 40
        for strip in strips:
            assert strip.cell_length == 100  # no line pushed wider by a double-width glyph
        screen_text = "\n".join(strip.text for strip in strips)
        assert "日本語" in screen_text and "😀" in screen_text
        if token_view:
            tv = view.token_view
            assert all(cell_len(line) <= tv.size.width for line in tv.plain_lines())
            await settle(pilot, app)


@pytest.mark.parametrize("token_view", [False, True])
async def test_streaming_reply_grows_in_steps(token_view):
    """While a reply streams it grows several lines at a time, so the conversation scrolls
    once per step, not once per line; finished, it is exactly as tall as its text."""
    import asyncio

    from chatui.widgets.reply import ReplyView

    text = " ".join(f"word{i}" for i in range(700))  # about 50 lines at this width
    # 700 tokens at 10 ms: ~7 s of streaming, long enough to be watched on a loaded machine
    # (at 2 ms the reply could end between two polls of a starved event loop).
    app = make_app(lambda r, row: text, delay_s=0.01, token_view=token_view,
                   settings=SamplingParams(max_new_tokens=3000))
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "go", wait=False)
        for _ in range(3000):  # bounded: a reply that never appears fails below
            if replies(app):
                break
            await asyncio.sleep(0.01)
        assert replies(app), "no reply appeared"
        view = replies(app)[0]
        shown = view.token_view if token_view else view.query_one("StreamingMarkdown")
        log = app.chat.log_view
        steps, heights, scrolls = set(), set(), set()
        deadline = asyncio.get_running_loop().time() + 60
        while app.chat.generating:
            assert asyncio.get_running_loop().time() < deadline, "the reply never ended"
            steps.add(shown.step)
            if shown.size.height:
                heights.add(shown.size.height)
            scrolls.add(log.scroll_y)
            await asyncio.sleep(0.005)
        await settle(pilot, app)
        assert len(steps - {0}) == 1, f"one step size while streaming, saw {steps}"
        (step,) = steps - {0}
        assert 2 <= step <= 12
        assert heights and all(h % step == 0 for h in heights)
        lines = len(view.token_view.plain_lines())
        assert lines > 3 * step
        assert len(scrolls) <= lines // step + 2  # about one scroll per step
        assert shown.step == 0
        if token_view:
            assert shown.size.height == lines
        else:  # finished, drawn from its text (issue 21), as tall as the reply shown at once
            finished = view.markdown
            assert finished is not shown and finished.source == view.reply.text
            twin = ReplyView(view.reply)
            await log.mount(twin)
            await pilot.pause(0.1)
            assert finished.size.height == twin.markdown.size.height < max(heights)
        assert log.scroll_y == log.max_scroll_y  # still following the end


def _fresh_render(app) -> list[Strip]:
    """The screen rendered anew, every cached line thrown away."""
    from chatui.widgets.token_view import TokenView

    for widget in app.screen.walk_children(TokenView):
        widget._strips.clear()
    return render_screen(app, fresh=True)


@pytest.mark.parametrize("token_view", [False, True])
async def test_terminal_shows_what_a_fresh_render_shows(token_view):
    """After a reply streamed in steps, through partial updates that render only the rows
    they change, the terminal shows exactly what rendering the screen afresh gives."""
    text = "\n\n".join(" ".join(f"p{p}w{i}" for i in range(40 + 17 * p)) for p in range(8))
    app = make_app(lambda r, row: text, delay_s=0.001, token_view=token_view,
                   settings=SamplingParams(max_new_tokens=5000))
    terminal = VirtualTerminal(app, SIZE)
    async with app.run_test(size=SIZE) as pilot:
        # the prompt's cursor blinks again once the reply ends: a blink due between the last
        # write and the fresh render differed in the cursor's cell (once in a full run)
        app.chat.prompt.cursor_blink = False
        await send(pilot, app, "go")
        await pilot.pause(0.2)
        shown = [row[:] for row in terminal.rows]
        assert shown == VirtualTerminal.of(_fresh_render(app), SIZE)
        assert any("p7w" in "".join(ch for ch, _ in row) for row in shown)
        app.chat.log_view.scroll_to(y=5, animate=False)  # partial updates again, elsewhere
        await pilot.pause(0.2)
        assert terminal.rows == VirtualTerminal.of(_fresh_render(app), SIZE)
