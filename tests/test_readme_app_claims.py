"""README claims about the app and the engine that no other test checked: each test fails if
its claim stops being true (the claim quoted in its docstring)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from chatui import transcript as tr
from chatui.transcript.journal import journal_path
from chatui.widgets.compare import CompareView
from chatui.widgets.scored import ScoredMessage
from inference.chat import encode_messages, fit_to_context
from inference.types import Message
from test_app import (SIZE, config_dir, loaded, make_app, notices, replies,  # noqa: F401
                      send, settle)
from test_checkpoint import make_checkpoint
from test_journal import journaled
from test_tree import _id_backend, _numbered


def last_notice(app, kind=None) -> str:
    return str(notices(app, kind)[-1].render())


@pytest.fixture(scope="module")
def sampling_ckpt(tmp_path_factory) -> Path:
    """A tiny random checkpoint whose generation_config.json sets sampling defaults."""
    from transformers import GenerationConfig

    d = make_checkpoint(tmp_path_factory.mktemp("gen") / "sampling-llama")
    GenerationConfig(do_sample=True, temperature=0.6, top_p=0.85, top_k=17, eos_token_id=0,
                     bos_token_id=1).save_pretrained(d)
    return d


# ---- the engine ----


def test_dropping_turns_to_fit_the_context_never_drops_the_system_prompt(sampling_ckpt):
    """README: "When the conversation does not fit the context ..., the oldest turns are left
    out, never the system prompt"."""
    from inference.checkpoint import load_checkpoint

    tok = load_checkpoint(str(sampling_ckpt)).tokenizer
    messages = [Message("system", "you are hello world")]
    for _ in range(6):
        messages += [Message("user", "how are you " * 8), Message("assistant", "hi there " * 8)]
    messages.append(Message("user", "hello"))
    whole = len(encode_messages(tok, messages))
    fitted = fit_to_context(tok, messages, whole // 2)
    assert fitted.dropped_messages > 0
    kept = [messages[0], *messages[1 + fitted.dropped_messages:]]
    assert fitted.ids == encode_messages(tok, kept)


def test_sampling_defaults_come_from_generation_config(sampling_ckpt):
    """README: "Defaults come from the checkpoint's `generation_config.json`" (its sampling
    defaults are honoured)."""
    from inference.checkpoint import load_checkpoint
    from inference.engine import LocalBackend

    backend = LocalBackend.from_checkpoint(load_checkpoint(str(sampling_ckpt)))
    s = backend.info.default_settings
    assert (s.temperature, s.top_p, s.top_k) == (0.6, 0.85, 17)


@pytest.fixture
def fresh_kernel_load(kernel):
    """``load_kernel`` asked again (it is cached), and again after the test. ``kernel``: the
    kernel loads here, so only the variable can turn it off."""
    from inference import q8kernel

    q8kernel.load_kernel.cache_clear()
    yield
    q8kernel.load_kernel.cache_clear()


def test_q8_kernel_off_falls_back_to_torch(fresh_kernel_load, monkeypatch):
    """README: "(or `CHATUI_Q8_KERNEL=off`), int8 falls back to torch's per-channel
    `_weight_int8pack_mm`"."""
    from inference import q8kernel
    from inference.hf_quant import quantize_linears
    from inference.quant import Int8Weight, q8_available

    monkeypatch.setenv("CHATUI_Q8_KERNEL", "off")
    assert q8kernel.load_kernel() is None
    assert not q8_available(torch.device("cpu"))
    _, weights = quantize_linears(torch.nn.Sequential(torch.nn.Linear(64, 32)))
    assert [type(w) for w in weights.values()] == [Int8Weight]


# ---- keys ----


async def test_ctrl_s_saves_the_conversation():
    """README: "Ctrl+S / F1 / Ctrl+P / Ctrl+Q | save / ..." (autosave off: only the key
    writes the file)."""
    app = make_app(autosave=False)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        folder = app.config.transcripts_dir() or tr.data_dir()
        assert not list(folder.glob("*.json"))
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        [path] = folder.glob("*.json")
        assert "Saved to" in last_notice(app)
        assert tr.load_transcript(path) == app.chat.conversation


async def test_r_in_the_token_view_switches_to_the_raw_view():
    """README: "`n` / `r` / 1-9 | jump to the least likely token / raw view (special tokens
    shown) / ..." in the token view."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        assert not app.chat.raw
        await pilot.press("r")
        await pilot.pause(0.1)
        assert app.chat.raw and app.chat.prompt.text == ""
        [view] = replies(app)
        assert view.raw and view.token_view.raw
        assert "Raw token view on" in last_notice(app)


# ---- commands ----


async def test_system_without_text_shows_the_system_prompt():
    """README: "`/system TEXT` (`/system` shows it, ...)"."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/system Answer like a pirate.")
        await send(pilot, app, "/system")
        assert last_notice(app) == "System prompt: Answer like a pirate."
        assert app.chat.conversation.system_prompt == "Answer like a pirate."


async def test_theme_without_a_name_lists_the_themes():
    """README: "`/theme NAME` (`chatui-dark`, `chatui-light`, or any of Textual's themes,
    which `/theme` lists ...)"."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send(pilot, app, "/theme")
        text = last_notice(app)
        assert not notices(app, "error")
        listed = text.partition("Available: ")[2].split(", ")
        assert {"chatui-dark", "chatui-light", "textual-dark", "nord"} <= set(listed)
        assert set(listed) == set(app.available_themes)


async def test_fanout_k_sets_how_many_branches_f_decodes():
    """README: "`f` in the token view | fan out: the K most likely tokens at the cursor
    (`/fanout K`, 2-8, default 3) decoded as K branches"."""
    backend = _id_backend(_numbered())
    app = make_app(backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await send(pilot, app, "hello")
        await send(pilot, app, "/fanout 4")
        assert "decodes the 4 most likely" in last_notice(app)
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home", "right", "right", "f")
        await settle(pilot, app)
        assert backend.requests[-1].first_tokens == (200, 201, 202, 203)
        group = app.chat.conversation.entries[-1]
        assert group.fan_out and len(group.replies) == 4
        [view] = app.chat.query(CompareView)
        assert len(view.views) == 4


async def test_score_results_are_not_written_to_the_transcript():
    """README: "`/score [N|system|TEXT]` ... kept in memory only, not in the transcript"."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "the quick brown fox")
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        conv = app.chat.conversation
        path = tr.autosave_path(conv, app.config.transcripts_dir())
        before = json.loads(path.read_bytes())["messages"]
        for n, command in enumerate(("/score", "/score quokka zebra"), 1):
            app.chat.prompt.focus()  # (a scored message takes the focus)
            await send(pilot, app, command)
            for _ in range(100):
                if len(app.chat.query(ScoredMessage)) == n:
                    break
                await pilot.pause(0.02)
        assert len(app.chat.query(ScoredMessage)) == 2
        app.chat.prompt.focus()
        await pilot.press("ctrl+s")
        await pilot.pause(0.1)
        text = path.read_text()
        if journal_path(path).exists():
            text += journal_path(path).read_text()
        assert json.loads(path.read_bytes())["messages"] == before
        assert "quokka" not in text and "perplexity" not in text
        assert len(tr.load_transcript(path).entries) == 2


async def test_history_delete_refuses_the_open_conversation():
    """README: "`/history delete N` moves one into the `deleted/` folder ... the open
    conversation cannot be deleted"."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "the open one")
        app.flush_autosaves()
        path = tr.autosave_path(app.chat.conversation, app.config.transcripts_dir())
        await send(pilot, app, "/history")
        assert "the open one" in last_notice(app)
        await send(pilot, app, "/history delete 1")
        assert "the conversation open now" in last_notice(app, "error")
        assert path.is_file() and not list(path.parent.glob("deleted/*"))


# ---- the journal ----


def test_a_version_1_journal_without_node_ids_still_applies(tmp_path):
    """README: journal "lines without node ids, written before transcript version 3, keep the
    first `n` messages, then these"; "Version 1 journals (no `select`) load as before"."""
    _, written = journaled(tmp_path, 3)
    path = tr.autosave_path(written[-1], tmp_path)
    jpath = journal_path(path)
    head, *lines = [json.loads(x) for x in jpath.read_bytes().splitlines()]
    assert head["version"] == 2 and len(lines) == 2  # exchanges 2 and 3 are journal lines
    head["version"] = 1
    for line in lines:
        for m in line["messages"]:
            for key in ("node", "sibling", "branches"):
                m.pop(key, None)
    edited = dict(lines[-1]["messages"][0], text="an edited question")
    lines.append({"at": 4, "messages": [edited]})  # keep 4 messages, then this one
    jpath.write_text("".join(json.dumps(x) + "\n" for x in [head, *lines]))
    got = tr.load_transcript(path)
    want = [e.text for e in written[-1].entries][:4] + ["an edited question"]
    assert [e.text for e in got.entries] == want


async def test_fanout_takes_no_more_branches_than_a_token_keeps():
    """`/fanout 8` with the default 5 alternatives a token is refused in one sentence that says
    how to keep more (it was taken, and every `f` then said the token had too few); with
    `--top-logprobs 8` it is taken."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/fanout 8")
        said = last_notice(app, "error")
        assert "from 2 to 5" in said and "--top-logprobs 8" in said
        assert app.chat.state.fan_k == 3
        await send(pilot, app, "/fanout 5")
        assert app.chat.state.fan_k == 5
    app = make_app(top_logprobs=8)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "/fanout 8")
        assert app.chat.state.fan_k == 8
