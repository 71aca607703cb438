"""Pilot tests of the chat app on the real engine (a tiny random Llama with SmolLM2's tokenizer):
token ids and alternatives in the token view, Esc mid-reply, ``/continue`` and
continue-from-alternative with token-exact prefixes."""

from __future__ import annotations

import asyncio
import time

import pytest

from chatui.app import ChatApp
from chatui.config import AppConfig
from inference.settings import SamplingParams
from inference.types import TokenBatch

from test_app import SIZE, loaded, replies, send, send_nowait, settle, tap


class Paced:
    """The real backend, paced (so Esc lands mid-reply) and recording its requests."""

    def __init__(self, backend, delay_s: float) -> None:
        self.backend = backend
        self.delay_s = delay_s
        self.requests = []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate(self, request, cancel):
        self.requests.append(request)
        for ev in self.backend.generate(request, cancel):
            if isinstance(ev, TokenBatch) and self.delay_s:
                time.sleep(self.delay_s)
            yield ev


@pytest.fixture
def engine_app(tiny_ckpt, config_dir):
    from inference.engine import LocalBackend

    holder = {}

    def make(delay_s=0.0, **settings):
        def factory(progress):
            holder["backend"] = Paced(LocalBackend.from_checkpoint(tiny_ckpt), delay_s)
            return holder["backend"]

        app = ChatApp(factory, config=AppConfig(
            stable_timings=True,
            settings=SamplingParams(**{"temperature": 0.0, "max_new_tokens": 40, **settings})))
        app.holder = holder  # type: ignore[attr-defined]
        return app

    return make


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))


def _check_streamed(reply):
    """The streamed tokens concatenate to the reply's text (RowDone.text never trims them)."""
    assert "".join(t.text for t in reply.tokens if not t.special) == reply.text
    assert [t.index for t in reply.tokens] == list(range(len(reply.tokens)))


async def test_reply_streams_with_ids_and_alternatives_in_token_view(engine_app):
    app = engine_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "Hello there")
        reply = app.chat.conversation.entries[-1].reply
        assert reply.finish_reason in ("stop", "length") and reply.tokens
        _check_streamed(reply)
        view = replies(app)[0]
        assert view.markdown.source == reply.text
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        tv = view.token_view
        assert app.focused is tv and tv.units
        await pilot.press("home")
        await pilot.pause(0.1)
        token = reply.tokens[tv.units[0].start]
        assert token.id is not None and len(token.top) == 5
        detail = str(app.chat.inspector.query_one(".detail").render())
        assert f"id           {token.id}" in detail and "alternatives" in detail
        assert f"{token.prob:.2%}" in detail


async def test_esc_mid_reply_then_continue_is_token_exact(engine_app):
    app = engine_app(delay_s=0.02, max_new_tokens=60)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        await send_nowait(app, "Tell me a story")
        entry = None
        for _ in range(300):
            entries = app.chat.conversation.entries
            entry = entries[-1] if entries and entries[-1].role == "assistant" else None
            if entry is not None and len(entry.reply.tokens) >= 5:
                break
            await asyncio.sleep(0.01)
        await tap(app, "escape")
        await settle(pilot, app)
        reply = entry.reply
        assert reply.finish_reason == "cancelled" and 5 <= len(reply.tokens) < 60
        _check_streamed(reply)
        kept = list(reply.tokens)
        backend = app.holder["backend"]
        backend.delay_s = 0.0
        await send(pilot, app, "/continue")
        request = backend.requests[-1]
        assert request.prefix is not None
        assert request.prefix.token_ids == tuple(t.id for t in kept)
        assert request.prefix.text == "".join(t.text for t in kept if not t.special)
        assert reply.tokens[:len(kept)] == kept and len(reply.tokens) > len(kept)
        assert reply.finish_reason in ("stop", "length")
        _check_streamed(reply)  # the new text follows the old, nothing doubled or lost
        assert replies(app)[0].markdown.source == reply.text
        assert len(app.chat.conversation.entries) == 2


async def test_continue_from_alternative_is_token_exact(engine_app):
    app = engine_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "Hello there")
        reply = app.chat.conversation.entries[-1].reply
        assert len(reply.tokens) >= 4
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        tv = replies(app)[0].token_view
        await pilot.press("home", "right", "right")
        await pilot.pause(0.1)
        position = tv.units[tv.cursor].start
        before = list(reply.tokens[:position])
        alt = reply.tokens[position].top[1]
        await pilot.press("2")
        await settle(pilot, app)
        request = app.holder["backend"].requests[-1]
        assert request.prefix.token_ids == tuple(t.id for t in before) + (alt.id,)
        original, reply = reply, app.chat.conversation.entries[-1].reply  # a sibling (issue 18)
        assert original.tokens[position].id != alt.id
        assert reply.tokens[:position] == before
        assert reply.tokens[position].id == alt.id
        assert reply.finish_reason in ("stop", "length")
        _check_streamed(reply)
        assert replies(app)[0].markdown.source == reply.text


async def test_status_line_names_the_weights_quantization(tiny_ckpt, tmp_path, monkeypatch):
    from inference import q8kernel
    from inference.engine import LocalBackend

    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    app = ChatApp(lambda progress: LocalBackend.from_checkpoint(tiny_ckpt, quantize="auto",
                                                                precision="auto"),
                  config=AppConfig(stable_timings=True))
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        model = app.chat.status.model
        if q8kernel.load_kernel() is not None:
            assert model.endswith("· cpu · int8 weights, fp32 compute")
        else:
            assert model.endswith("· cpu · bf16")


async def test_fan_out_decodes_the_alternatives_as_branches(engine_app):
    """``f`` in the token view with the real engine: one request whose rows start with the
    top 3 alternatives at the cursor (forced first tokens, their real logprobs), after the
    reply's tokens before it; /pick keeps the others as siblings (issue 18)."""
    app = engine_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "Hello there")
        reply = app.chat.conversation.entries[-1].reply
        assert len(reply.tokens) >= 4
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home", "right", "right")
        await pilot.pause(0.1)
        tv = replies(app)[0].token_view
        position = tv.units[tv.cursor].start
        alts = reply.tokens[position].top[:3]
        await pilot.press("f")
        await settle(pilot, app)
        request = app.holder["backend"].requests[-1]
        assert request.first_tokens == tuple(a.id for a in alts)
        assert request.prefix.token_ids == tuple(t.id for t in reply.tokens[:position])
        group = app.chat.conversation.entries[-1]
        assert len(group.replies) == 3
        for row, alt in zip(group.replies, alts):
            assert row.tokens[:position] == reply.tokens[:position]
            assert row.tokens[position].id == alt.id
            assert abs(row.tokens[position].logprob - alt.logprob) < 1e-4
            assert row.finish_reason in ("stop", "length")
        await pilot.press("escape")
        await send(pilot, app, "/pick 3")
        await settle(pilot, app)
        conv = app.chat.conversation
        assert conv.entries[-1].reply is group.replies[2]
        assert len(conv.siblings(conv.entries[-1])) == 4


async def test_a_reply_of_another_vocabulary_continues_from_its_text(engine_app):
    """A conversation made with another model (ids of its vocabulary: here shifted by one,
    the last past this one's end) and ``/continue``d: the prefix carries its spellings, the
    engine continues from the text (no crash, no failure); ``f`` on it says in one sentence
    that its alternatives are not this model's."""
    import dataclasses

    from chatui.token_records import TokenRecords
    from test_app import notices

    app = engine_app(max_new_tokens=8)
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "Hello there")
        reply = app.chat.conversation.entries[-1].reply
        assert reply.finish_reason == "length"
        vocab = len(app.holder["backend"].tokenizer)

        def shift(i):
            return vocab + 5 if i == reply.tokens[-1].id else i + 1

        reply.tokens = TokenRecords(dataclasses.replace(
            t, id=shift(t.id), top=tuple(dataclasses.replace(a, id=shift(a.id)) for a in t.top))
            for t in reply.tokens)
        text = reply.text
        await send(pilot, app, "/continue")
        request = app.holder["backend"].requests[-1]
        assert request.prefix.token_ids == tuple(t.id for t in reply.tokens[:8])
        assert request.prefix.spellings
        assert reply.finish_reason == "length" and not reply.error
        assert len(reply.tokens) == 16 and reply.text.startswith(text)
        await pilot.press("ctrl+t")
        await pilot.pause(0.1)
        await pilot.press("home", "right")
        await pilot.press("f")
        await settle(pilot, app)
        told = str(notices(app, "error")[-1].render())
        assert told.startswith("The new branch failed before its first token and is not "
                               "kept: That reply was made by a model with another vocabulary")
        conv = app.chat.conversation  # the fan-out held nothing: it left the tree
        assert conv.entries[-1].reply is reply and conv.siblings(conv.entries[-1]) == [
            conv.entries[-1]]
        assert len(replies(app)) == 1
