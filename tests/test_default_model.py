"""End-to-end checks on the real default model (SmolLM2-135M-Instruct, converted from GGUF)."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.settings import SamplingParams
from inference.types import GenerationRequest, Message, RowDone, TokenBatch

pytestmark = pytest.mark.slow


def _run(backend, prompt, n):
    req = GenerationRequest((Message("user", prompt),),
                            (SamplingParams(temperature=0, max_new_tokens=n),))
    ev = list(backend.generate(req, threading.Event()))
    toks = [t for e in ev if isinstance(e, TokenBatch) for t in e.tokens]
    return toks, next(e for e in ev if isinstance(e, RowDone))


def test_greedy_matches_transformers_generate(default_ckpt, default_backend):
    prompt = "Give me two tips for writing clear code."
    toks, _ = _run(default_backend, prompt, 48)
    tok = default_ckpt.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}],
                                  add_generation_prompt=True, return_dict=False)
    out = default_ckpt.model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False,
                                      eos_token_id=list(default_ckpt.eos_token_ids),
                                      pad_token_id=tok.pad_token_id)
    assert [t.id for t in toks] == out[0, len(ids):].tolist()


def test_reply_is_sensible(default_backend):
    _, done = _run(default_backend, "What is the capital of France? Answer in one sentence.", 30)
    assert "Paris" in done.text and done.finish_reason == "stop"


@pytest.mark.parametrize("prompt", [
    "Reply with only these characters: 你好 😀",
    "Write the word cat in Chinese characters, then three animal emojis.",
])
def test_emoji_and_cjk_stream_without_replacement_characters(default_ckpt, default_backend, prompt):
    toks, done = _run(default_backend, prompt, 40)
    streamed = "".join(t.text for t in toks)
    assert streamed == done.text == default_ckpt.tokenizer.decode(
        [t.id for t in toks], skip_special_tokens=True)
    assert any(ord(ch) > 0x2E80 for ch in streamed)  # CJK or emoji really came out
    # Mid-stream no token ever shows a replacement character; only a glyph cut off by the
    # length limit at the very end may be incomplete.
    assert all("\ufffd" not in t.text for t in toks[:-1])
    multi = [t for t in toks if t.glyph_start is not None]
    assert multi and all(toks[m.glyph_start].text == "" for m in multi)
