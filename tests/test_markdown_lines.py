"""MarkdownLines: a finished reply's Markdown drawn from its text through the line API.

It must look like Textual's Markdown (what a reply shows while it streams) and keep a constant
number of objects alive per reply, whatever the reply's length."""

from __future__ import annotations

import gc

from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.selection import Selection
from textual.geometry import Offset
from textual.widgets import Markdown

from chatui.widgets.markdown_lines import STORE_CACHE, STRIP_CACHE, LineStore, MarkdownLines, layout_markdown
from chatui.widgets.streaming_markdown import StreamingMarkdown

SAMPLE = """## Notes on the protocol (3)

The **protocol** is a small system, with its `protocol_state` and the `step_3()` call that advances it, so that you can follow along *without* running anything yourself, and ~~never~~ more.

- The first part reads the input and checks it with `validate()`.
- The second part keeps a **running total**.
  - nested, with a long line that has to wrap around at least once at this width
- Errors become one clear sentence.

```python
def step_3(state, value):
    total = state.total + value
    return State(total=total, recent=recent)
```

> A design that is easy to test is usually easy to change.
>
> - a list in a quote

1. Write the smallest test that fails.
2. Make it pass.
3. Measure.
4. Repeat.
5. Five.
6. Six.
7. Seven.
8. Eight.
9. Nine.
10. Ten.

# A centred title

### A small header

---

| name | value |
|------|-------|
| a    | 1     |

The end.
"""

WIDTH = 60


class Both(App[None]):
    """Today's Markdown (as a reply styles it) above a MarkdownLines of the same text."""

    CSS = """
    Markdown { padding: 0 1; margin: 0; background: transparent; }
    MarkdownLines { padding: 0 1; }
    """

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield Markdown(self.text, id="old")
        yield MarkdownLines(self.text, id="new")


def _rgb(color) -> tuple[int, int, int]:
    return color.get_truecolor() if color is not None else (-99, -99, -99)


def _visible(ch: str, style) -> tuple:
    """What a cell looks like (a space shows only its background and lines)."""
    if style is None:
        return ()
    lines = (bool(style.underline), bool(style.strike))
    if ch == " ":
        return (_rgb(style.bgcolor), lines)
    return (_rgb(style.color), _rgb(style.bgcolor), bool(style.bold), bool(style.italic),
            lines)


def _close(a: tuple, b: tuple) -> bool:
    """The same look, colours within a few steps (translucent colours blend a little
    differently over a widget's background than in Textual's CSS)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, tuple) and x and isinstance(x[0], int):
            if any(abs(p - q) > 8 for p, q in zip(x, y)):
                return False
        elif x != y:
            return False
    return True


def _cells(strip) -> list[tuple[str, tuple]]:
    return [(ch, _visible(ch, seg.style)) for seg in strip for ch in seg.text]


async def test_draws_what_textuals_markdown_draws():
    """(Where a line of code is wider than its fence the two differ by design: Textual's fence
    scrolls it sideways with no scroll bar, ours wraps it: the test above.)"""
    app = Both(SAMPLE)
    async with app.run_test(size=(WIDTH, 200)) as pilot:
        await pilot.pause(0.2)
        old, new = app.query_one("#old"), app.query_one("#new")
        strips = app.screen._compositor.render_strips()
        before = strips[old.region.y:old.region.bottom]
        after = strips[new.region.y:new.region.bottom]
        assert [s.text.rstrip() for s in after] == [s.text.rstrip() for s in before]
        # and the styles, cell by cell
        differing = [(y, a, b) for y, (sa, sb) in enumerate(zip(before, after))
                     for a, b in zip(_cells(sa), _cells(sb))
                     if a[0] != b[0] or not _close(a[1], b[1])]
        assert differing == []


def test_layout_wraps_to_the_width():
    lines = [line.plain.rstrip() for line in layout_markdown(SAMPLE, 30)]
    assert all(len(line) <= 30 for line in lines)
    assert "  def step_3(state, value):" in lines
    assert any(line.startswith("  - nested") or line.startswith("  ▪ nested") for line in lines)
    assert any(line.startswith("  1. Write") for line in lines)
    assert any(line.startswith(" 10. Ten.") for line in lines)


def test_a_line_of_code_wider_than_its_fence_goes_on_under_a_mark():
    """Cropped, the end of a long line of code was on screen nowhere (a comparison's columns
    cut most lines of a function; seen in tmux): it wraps, cell by cell, under a ``↪``."""
    code = "print(reverse_string_with_docstring('Hello, World'))  # Output: 'dlroW ,olleH'"
    lines = [line.plain for line in layout_markdown(f"```python\n{code}\nx = 1\n```", 30)
             if line.plain]  # (the fence's margins above and below are empty lines)
    assert all(len(line) == 30 for line in lines)
    body = lines[1:-1]  # between the fence's blank top and bottom padding
    assert body[0].startswith("  print(") and all(line.startswith("↪ ") for line in body[1:-1])
    assert "".join(line[2:-2] for line in body[:-1]).rstrip() == code  # nothing lost
    assert body[-1].rstrip() == "  x = 1"
    # a wide character is never split between two lines
    wide = [line.plain for line in layout_markdown("```\n" + "界" * 20 + "\n```", 15)
            if line.plain]
    assert [line.count("界") for line in wide[1:-1]] == [5, 5, 5, 5]
    # a window dragged tiny crops instead (nothing to wrap into)
    assert len([line for line in layout_markdown(f"```\n{code}\n```", 10) if line.plain]) == 3


def test_a_single_newline_breaks_the_line():
    """A model's poem (one line each, no Markdown) keeps its lines; a blank line still ends a
    paragraph, and a line longer than the width still wraps."""
    poem = ("In twilight's cloak, where shadows play,\nThe sea's beat its fins, a roaring beast.\n"
            "A lighthouse's prow, a ghostly sight,\nA mate, a hero, on his way to shore.\n\nEnd.")
    lines = [line.plain.rstrip() for line in layout_markdown(poem, 50)]
    assert lines[:4] == ["In twilight's cloak, where shadows play,",
                         "The sea's beat its fins, a roaring beast.",
                         "A lighthouse's prow, a ghostly sight,",
                         "A mate, a hero, on his way to shore."]
    assert lines[4:6] == ["", "End."]
    assert [line.plain.rstrip() for line in layout_markdown("a b c d e f", 5)][:2] == ["a b c", "d e f"]


def test_line_store_round_trips_runs():
    from rich.style import Style

    bold, red = Style(bold=True), Style(color="red")
    lines = [[("ab", bold), ("cd", None)], [], [("e", red), ("", bold), ("fg", bold)]]
    store = LineStore(10, lines)
    assert len(store) == 3
    assert [store.line_text(y) for y in range(3)] == ["abcd", "", "efg"]
    assert [(s.text, s.style) for s in store.segments(0)] == [("ab", bold), ("cd", None)]
    assert store.segments(1) == []
    assert [(s.text, s.style) for s in store.segments(2)] == [("e", red), ("fg", bold)]
    assert len(store.styles) == 3  # shared by every line


class Many(App[None]):
    # A stable gutter: the width must not depend on whether the scrollbar has appeared yet (a
    # loaded run measured a text before its scrollbar came and the next one after: 78 != 76).
    CSS = ("VerticalScroll { height: 1fr; scrollbar-gutter: stable; } "
           "MarkdownLines { padding: 0 1; }")

    def compose(self) -> ComposeResult:
        yield VerticalScroll()


async def _tracked_per_widget(text: str) -> float:
    """Objects the collector tracks per MarkdownLines, between 10 and 40 mounted (most of
    them off screen, after each was drawn once)."""
    app = Many()
    counts = {}
    async with app.run_test(size=(80, 24)) as pilot:
        scroll = app.query_one(VerticalScroll)
        for n in range(1, 41):
            await scroll.mount(MarkdownLines(f"{text}\n\nreply {n}"))  # (no shared layout)
            scroll.scroll_end(animate=False, immediate=True)
            await pilot.pause()
            if n in (10, 40):
                await pilot.pause(0.05)
                gc.collect()
                counts[n] = len(gc.get_objects())
        assert len(MarkdownLines._strips) <= STRIP_CACHE
    return (counts[40] - counts[10]) / 30


def _tracked_per_widget_alone(repeat: int) -> float:
    """:func:`_tracked_per_widget` in a fresh interpreter: in a shared test process the
    objects other tests left behind die at random moments and swamp the count (-155 per
    widget was seen in a full run)."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import asyncio, sys\n"
            f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            "import test_markdown_lines as t\n"
            f"print(asyncio.run(t._tracked_per_widget(t.SAMPLE * {repeat})))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return float(r.stdout.split()[-1])


def test_keeps_a_few_objects_per_widget_whatever_its_length():
    short = _tracked_per_widget_alone(1)
    long = _tracked_per_widget_alone(10)
    assert short < 400, short
    assert long < short + 50, (short, long)  # not a line's worth more for 10 times the text


async def test_a_text_mounted_again_is_not_laid_out_again(monkeypatch):
    """A reply whose widget the conversation's window mounts anew (scrolled back to) reuses
    its layout; another width or theme lays it out again; the shared layouts are bounded."""
    from chatui.widgets import markdown_lines

    calls = []
    real = markdown_lines.layout_markdown

    def counting(source, width, highlight=None, **options):
        calls.append((source, width))
        return real(source, width, highlight, **options)

    monkeypatch.setattr(markdown_lines, "layout_markdown", counting)
    app = Many()
    text = SAMPLE + "\n\nmounted again"
    async with app.run_test(size=(80, 24)) as pilot:
        scroll = app.query_one(VerticalScroll)
        first = MarkdownLines(text)
        await scroll.mount(first)
        await pilot.pause()
        drawn = [first.render_line(y).text for y in range(first.size.height)]
        width = first.size.width
        laid_out = len(calls)
        assert (text, width) in calls
        await first.remove()
        second = MarkdownLines(text)
        await scroll.mount(second)
        await pilot.pause()
        assert second.size.width == width
        assert len(calls) == laid_out  # the same lines, not laid out again
        assert [second.render_line(y).text for y in range(second.size.height)] == drawn
        scroll.styles.width = 60
        await pilot.pause()
        assert calls[-1] == (text, second.size.width) != (text, width)
        laid_out = len(calls)
        app.theme = "textual-light"
        await pilot.pause()
        assert len(calls) == laid_out + 1 and calls[-1] == (text, second.size.width)
        for n in range(STORE_CACHE + 10):
            second.update(f"text {n}")
            second.lines(58)
        assert len(MarkdownLines._stores) <= STORE_CACHE


async def test_a_wrapped_line_of_code_is_copied_whole():
    """A line of code wider than its fence is drawn in pieces under a ``↪``; a mouse
    selection copies it as it was written (no mark, no line break, its spaces kept)."""
    code = "total = compute_the_sum(first_value, second_value) + another_value_here  + 1"
    text = f"Code:\n\n```python\n{code}\nx = 1\n```\n\n- in a list:\n\n  ```\n  {code}\n  ```\n"
    app = Both(text)
    async with app.run_test(size=(40, 60)) as pilot:
        await pilot.pause(0.1)
        new = app.query_one("#new", MarkdownLines)
        assert any("↪" in new.lines(new.size.width).line_text(y)
                   for y in range(len(new.lines(new.size.width))))
        copied = new.get_selection(Selection(Offset(0, 0), Offset(200, 100)))[0]
        lines = [line.strip() for line in copied.splitlines()]
        assert lines.count(code) == 2 and "x = 1" in lines and "↪" not in copied, copied
        # a selection that starts on a continuation copies what it covers, as drawn
        store = new.lines(new.size.width)
        y = next(y for y in range(len(store)) if "↪" in store.line_text(y))
        part = new.get_selection(Selection(Offset(0, y), Offset(200, y)))[0]
        assert part.startswith("↪ ")


class Wrapped(App[None]):
    """A finished reply's and a streaming reply's Markdown of one text, 30 cells wide."""

    CSS = "MarkdownLines { width: 30; height: auto; }"

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield MarkdownLines(self.text, id="done")
        streaming = StreamingMarkdown(id="streaming")
        for n in range(0, len(self.text), 7):
            streaming.append(self.text[n:n + 7])
        yield streaming


async def test_a_wrapped_paragraph_is_copied_as_the_one_line_it_is():
    """The mouse copies a paragraph wrapped at the width as one line (the wraps are the
    window's, not the text's), a list item's and a quote's without the indent and border of
    their continuations, a word wider than the width with no space put into it; a newline of
    the text, a new item and a new paragraph still break the copy."""
    paragraph = "The quick brown fox jumps over the lazy dog and then naps in the warm sun."
    url = "https://example.com/" + "a" * 40
    text = (f"# A heading long enough to wrap here\n\n{paragraph}\n\nsee {url} now\n\n"
            f"- an item that is long enough to wrap at least once\n- second\n\n"
            f"> a quote that is long enough to wrap at least once\n\nline one\nline two\n")
    app = Wrapped(text)
    async with app.run_test(size=(40, 80)) as pilot:
        await pilot.pause(0.1)
        for name in ("done", "streaming"):
            widget = app.query_one(f"#{name}", MarkdownLines)
            store = widget.lines(widget.size.width)
            assert max(len(store.line_text(y).rstrip()) for y in range(len(store))) <= 30
            copied = widget.get_selection(Selection(Offset(0, 0), Offset(200, 100)))[0]
            lines = [line for line in copied.splitlines() if line.strip()]
            assert [line.strip() for line in lines] == [
                "A heading long enough to wrap here", paragraph, f"see {url} now",
                "• an item that is long enough to wrap at least once", "• second",
                "▌ a quote that is long enough to wrap at least once", "line one",
                "line two"], (name, copied)
            # a selection from the middle of a wrapped line takes the rest of the paragraph
            y = next(y for y in range(len(store)) if store.line_text(y).startswith("The"))
            part = widget.get_selection(Selection(Offset(4, y), Offset(200, y + 1)))[0]
            assert paragraph[4:].startswith(part) and len(part) > 30, part


async def test_selection_copies_the_drawn_text_and_update_redraws():
    app = Both("Some **bold** text.\n\n- an item\n")
    async with app.run_test(size=(WIDTH, 40)) as pilot:
        await pilot.pause(0.1)
        new = app.query_one("#new", MarkdownLines)
        selected = new.get_selection(Selection(Offset(0, 0), Offset(4, 2)))
        assert selected is not None
        assert selected[0] == "Some bold text.\n\n• an"
        height = new.size.height
        new.update("# one\n\n# two\n\n# three\n")
        await pilot.pause(0.1)
        assert new.source.startswith("# one")
        assert new.size.height != height
        assert "three" in new.lines(new.size.width).text



async def test_a_mouse_drag_selects_what_is_under_it():
    """The drawn lines carry the offsets Textual reads where a drag starts and ends: without
    them a drag over part of a finished reply selected all of it."""
    app = Both("Some **bold** text here.\n\n- an item\n- another item\n")
    async with app.run_test(size=(WIDTH, 40)) as pilot:
        await pilot.pause(0.1)
        new = app.query_one("#new", MarkdownLines)
        await pilot.mouse_down(new, offset=(2, 0))  # (the padding is the first cell)
        await pilot.hover(new, offset=(6, 2))
        await pilot.mouse_up(new, offset=(6, 2))
        await pilot.pause(0.05)
        assert app.screen.get_selected_text() == "ome bold text here.\n\n• an i"  # (inclusive)


def _top_level_starts(source: str) -> list[int]:
    """Where each top-level block of ``source`` begins (character offsets)."""
    from chatui.widgets.markdown_lines import _PARSER

    lines = source.splitlines(keepends=True)
    starts = sorted({token.map[0] for token in _PARSER.parse(source)
                     if token.level == 0 and token.map is not None})
    return [sum(len(line) for line in lines[:n]) for n in starts]


def test_blocks_laid_out_in_two_parts_are_the_whole_layout():
    """A streaming reply's settled blocks are laid out a few at a time and put after the
    lines before (``StreamingMarkdown``): cut between any two top-level blocks, the two parts
    are the whole text's lines."""
    from chatui.widgets.markdown_lines import BLOCK_BOTTOM

    def key(lines):
        return [(line.plain, list(line.spans)) for line in lines]

    text = SAMPLE + "\n\nAfter the table.\n\n# Title after a paragraph\n\n- a\n- b\n\n```\nx\n```\n"
    cuts = _top_level_starts(text)[1:]
    assert len(cuts) >= 12
    for width in (30, 72):
        whole = key(layout_markdown(text, width))
        for cut in cuts:
            first = layout_markdown(text[:cut], width, last_margin=False)
            rest = layout_markdown(text[cut:], width, previous=BLOCK_BOTTOM)
            assert key(first + rest) == whole, (width, text[cut:cut + 30])


def test_line_store_extended_equals_one_store():
    from rich.style import Style

    bold, red = Style(bold=True), Style(color="red")
    lines = [[("ab", bold), ("cd", None)], [], [("e", red), ("fg", bold)], [("h", red)]]
    one = LineStore(10, lines)
    for cut in range(len(lines) + 1):
        grown = LineStore(10, lines[:cut])
        grown.extend(lines[cut:])
        assert len(grown) == len(one)
        for y in range(len(one)):
            assert grown.line_text(y) == one.line_text(y)
            assert [(s.text, s.style) for s in grown.segments(y)] == \
                [(s.text, s.style) for s in one.segments(y)]
