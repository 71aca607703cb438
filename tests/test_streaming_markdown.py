"""A streaming reply's Markdown (``StreamingMarkdown``): one widget of lines whose settled
blocks are laid out once and whose last block is laid out again on each append. While it
streams it shows exactly what the finished reply shows (``MarkdownLines`` of the same text),
the terminal shows what a fresh render gives, and the screen is laid out only when the reply
takes a new step of height, not for each new block."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen

from chatui.textual_compat.testing import VirtualTerminal, render_screen
from chatui.widgets.markdown_lines import MarkdownLines
from chatui.widgets.streaming_markdown import StreamingMarkdown

from test_markdown_lines import SAMPLE

SIZE = (64, 160)

TEXT = SAMPLE + "\n\n" + "\n\n".join(
    f"Paragraph {n} says something, **in bold** and `code`, long enough to wrap once here."
    for n in range(6)) + "\n\n## Then a header\n\n- a list\n- after it\n\n```\ncode at the end\n"
"""Every kind of block, then paragraphs, a header, a list and a fence left open."""


class Side(App[None]):
    """The streaming widget above, a finished reply's widget of the same text below."""

    CSS = "VerticalScroll { height: 1fr; } MarkdownLines { padding: 0 1; }"

    def compose(self) -> ComposeResult:
        yield VerticalScroll()


def _cells(app: App[None], widget) -> list[list[tuple[str, object]]]:
    region = widget.region
    rows = render_screen(app)[region.y:region.y + widget.size.height]
    return [[(segment.text, segment.style) for segment in strip.crop(region.x, region.right)]
            for strip in rows]


def _text(cells: list[list[tuple[str, object]]]) -> list[str]:
    return ["".join(text for text, _ in row).rstrip() for row in cells]


@pytest.mark.parametrize("piece", [17, 60])
async def test_a_streaming_reply_shows_what_the_finished_one_shows(piece):
    app = Side()
    terminal = VirtualTerminal(app, SIZE)
    async with app.run_test(size=SIZE) as pilot:
        scroll = app.query_one(VerticalScroll)
        streaming = StreamingMarkdown()
        await scroll.mount(streaming)
        streaming.set_step(4)
        for start in range(0, len(TEXT), piece):
            streaming.append(TEXT[start:start + piece])
            await pilot.pause()
            finished = MarkdownLines(streaming.source)
            await scroll.mount(finished)
            await pilot.pause()
            shown, reference = _cells(app, streaming), _cells(app, finished)
            assert streaming.size.height % 4 == 0
            # the same lines, cell by cell, and then the blank room of the step
            assert shown[:len(reference)] == reference, TEXT[:start + piece][-50:]
            assert not any(_text(shown[len(reference):]))
            assert terminal.rows == VirtualTerminal.of(render_screen(app, fresh=True), SIZE)
            await finished.remove()
        assert streaming.source == TEXT


async def test_new_blocks_within_a_step_are_no_layout(monkeypatch):
    """Paragraphs streaming in: the screen is laid out for the steps, not for each block."""
    layouts = []
    real = Screen._refresh_layout

    def counting(self, *args, **kwargs):
        layouts.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Screen, "_refresh_layout", counting)
    app = Side()
    paragraphs = [f"Short paragraph {n}.\n\n" for n in range(40)]
    async with app.run_test(size=SIZE) as pilot:
        streaming = StreamingMarkdown()
        await app.query_one(VerticalScroll).mount(streaming)
        streaming.set_step(12)
        await pilot.pause()
        layouts.clear()
        heights = set()
        for paragraph in paragraphs:
            for start in range(0, len(paragraph), 6):
                streaming.append(paragraph[start:start + 6])
                await pilot.pause()
                heights.add(streaming.size.height)
        assert len(streaming.lines(streaming.size.width)) >= 79  # 40 paragraphs and gaps
        assert len(heights) >= 6
        assert len(layouts) <= len(heights) + 2, (len(layouts), sorted(heights))


async def test_update_shows_a_new_text_and_width_changes_lay_out_again():
    app = Side()
    async with app.run_test(size=SIZE) as pilot:
        streaming = StreamingMarkdown()
        await app.query_one(VerticalScroll).mount(streaming)
        streaming.append(TEXT)
        await pilot.pause()
        streaming.update("Just this.")
        await pilot.pause()
        assert [row for row in _text(_cells(app, streaming)) if row] == [" Just this."]
        streaming.update(TEXT)
        await pilot.pause()
        await pilot.resize_terminal(40, 400)
        await pilot.pause()
        finished = MarkdownLines(TEXT)
        await app.query_one(VerticalScroll).mount(finished)
        await pilot.pause()
        assert _cells(app, streaming) == _cells(app, finished)
