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
    decoded = default_ckpt.tokenizer.decode([t.id for t in toks], skip_special_tokens=True)
    if done.finish_reason == "length":  # a glyph cut off at the end is not shown (its
        decoded = decoded.rstrip("\ufffd")  # tokens keep "": a /continue completes it)
    assert streamed == done.text == decoded
    assert any(ord(ch) > 0x2E80 for ch in streamed)  # CJK or emoji really came out
    assert all("\ufffd" not in t.text for t in toks)  # no token shows a half-made glyph
    multi = [t for t in toks if t.glyph_start is not None]
    assert multi and all(toks[m.glyph_start].text == "" for m in multi)


def test_a_reply_cut_inside_an_emoji_is_continued_into_the_whole_emoji(default_backend):
    """A reply cut off between the tokens of an emoji shows no replacement character (its
    tokens keep "" for text), and continuing it gives the token that completes the emoji the
    whole emoji, its glyph starting at the reply's first byte of it (a fresh detokenizer
    decoded the rest of the bytes alone: "👨��👨" after /continue in the app)."""
    from inference.types import AssistantPrefix

    cat = default_backend.tokenizer.encode("🐱", add_special_tokens=False)
    assert len(cat) == 3  # three byte tokens in this tokenizer

    def ask(prefix, first, n):
        req = GenerationRequest((Message("user", "Show me a cat emoji."),),
                                (SamplingParams(temperature=0, max_new_tokens=n),),
                                prefix=prefix, first_tokens=(first,))
        ev = list(default_backend.generate(req, threading.Event()))
        return ([t for e in ev if isinstance(e, TokenBatch) for t in e.tokens],
                next(e for e in ev if isinstance(e, RowDone)))

    toks, done = ask(None, cat[0], 1)  # cut off after the emoji's first byte
    assert done.finish_reason == "length" and [t.id for t in toks] == cat[:1]
    assert toks[0].text == "" and done.text == ""
    prefix = AssistantPrefix("", tuple(cat[:2]))  # continued with two of its bytes
    toks, done = ask(prefix, cat[2], 1)
    assert [t.text for t in toks] == ["🐱"] and toks[0].glyph_start == -2
    assert done.text == "🐱"
    toks, done = ask(AssistantPrefix("", tuple(cat[:1])), cat[1], 2)  # one, the rest sampled
    glyph = default_backend.tokenizer.decode(cat[:1] + [t.id for t in toks])
    assert len(glyph) == 1 and glyph != "\ufffd", glyph  # (an emoji of those three bytes)
    assert [t.text for t in toks] == ["", glyph] and toks[1].glyph_start == -1


def test_a_batch_row_is_its_prompt_alone_to_the_bit(default_ckpt, kernel):
    """``chatui batch`` answers each line as ``chatui generate`` answers it alone, token for
    token, with the same logprobs and alternatives to the bit, on the default model with the
    int8 kernel at temperature 0. The padded prompts were one forward (torch's masked
    attention) and the padding moved every key to another lane of the C attention's sums;
    int8 made that rounding other replies: three of these four lines answered otherwise."""
    from inference.engine import LocalBackend

    backend = LocalBackend.from_checkpoint(default_ckpt, quantize="int8", precision="auto")
    prompts = ["Name three colors.", "What is two plus two?", "Hello",
               "Write a haiku about the sea."]
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    reqs = [GenerationRequest((Message("user", p),), (greedy,), 5) for p in prompts]
    batch = list(backend.generate_batch(reqs, threading.Event()))
    for r, req in enumerate(reqs):
        backend.reset()  # (a fresh cache, as a `chatui generate` has)
        alone = list(backend.generate(req, threading.Event()))
        got = [t for e in batch if isinstance(e, TokenBatch) and e.row == r for t in e.tokens]
        want = [t for e in alone if isinstance(e, TokenBatch) for t in e.tokens]
        assert [(t.id, t.logprob, t.top) for t in got] == [
            (t.id, t.logprob, t.top) for t in want], prompts[r]
