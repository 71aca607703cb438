"""The fixed-shape decode step (``FastLlama.step`` through ``DecodeStep``) against the eager
forward, and the engine's pipelined decode loop against the plain one. CUDA graph capture
itself needs a GPU; everything around it (the step the graph replays, compiled or not, the
cache it writes, the pipelined loop) runs here on the CPU."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.decode_graph import DecodeStep, use_compile
from inference.engine import LocalBackend
from inference.fast_llama import FastRunner
from inference.settings import SamplingParams
from inference.types import GenerationRequest, Message, RowDone, TokenBatch

MSGS = (Message("system", "You are terse."), Message("user", "List three colours."))


def step_against_forward(fast, step, batch: int, steps: int, atol: float) -> None:
    torch.manual_seed(1)
    prompt = torch.randint(3, 1000, (1, 250))  # the step crosses a capacity block (256)
    a, b = fast.new_cache(), fast.new_cache()
    fast.forward(a, prompt)
    fast.forward(b, prompt)
    if batch > 1:
        a.batch_repeat_interleave(batch)
        b.batch_repeat_interleave(batch)
    ids = torch.randint(3, 1000, (batch, 1))
    for _ in range(steps):
        want = fast.forward(a, ids)
        got = step(b, ids)
        assert got.shape == want.shape and got.dtype == torch.float32
        assert torch.allclose(got, want, atol=atol), (got - want).abs().max()
        assert b.length == a.length
        ids = want.argmax(-1, keepdim=True)
    n = a.length
    for la, lb in zip(a.k + a.v, b.k + b.v):  # the step wrote the same keys and values
        assert torch.allclose(la[:, :, :n], lb[:, :, :n], atol=atol)


@pytest.mark.parametrize("batch", [1, 3])
def test_eager_step_equals_forward(tiny_ckpt, batch):
    fast = FastRunner(tiny_ckpt.model).fast
    step_against_forward(fast, DecodeStep(fast, compile=False, graphs=False), batch, 10, 1e-5)


def test_compiled_step_equals_forward_fp32_and_int8(tiny_ckpt):
    """torch.compile of the step (inductor on the CPU here; the same graph CUDA captures)."""
    fast = FastRunner(tiny_ckpt.model).fast
    step = DecodeStep(fast, compile=True, graphs=False)
    step_against_forward(fast, step, 1, 8, 1e-4)
    step_against_forward(fast, step, 2, 4, 1e-4)  # another batch size, same compiled step
    q = FastRunner(tiny_ckpt.model, quantize="int8").fast
    step_against_forward(q, DecodeStep(q, compile=True, graphs=False), 1, 6, 6e-2)  # bf16 ulps


def test_compile_modes():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not use_compile("auto", cpu) and use_compile("auto", cuda)
    assert use_compile("on", cpu) and not use_compile("off", cuda)
    with pytest.raises(ValueError, match="compile"):
        use_compile("fast", cpu)


def test_runner_uses_the_step_only_for_unpadded_single_tokens(tiny_ckpt, monkeypatch):
    r = FastRunner(tiny_ckpt.model)
    r.decode = DecodeStep(r.fast, compile=False, graphs=False)
    calls = []
    real = r.decode.__call__
    monkeypatch.setattr(r, "decode", lambda c, i: calls.append(i.shape) or real(c, i))
    cache = r.new_cache()
    r.forward(cache, torch.tensor([[5, 6, 7]]))  # prefill: eager
    r.forward(cache, torch.tensor([[8]]))  # decode: the step
    mask = torch.ones(1, 5, dtype=torch.long)
    r.forward(cache, torch.tensor([[9]]), attention_mask=mask,
              position_ids=torch.tensor([[4]]))  # padded batches: eager
    assert calls == [(1, 1)]


def events(backend, *settings, messages=MSGS, cancel_after=None):
    req = GenerationRequest(messages, settings, top_logprobs=3)
    cancel = threading.Event()
    out = []
    for e in backend.generate(req, cancel):
        out.append(e)
        if cancel_after is not None and sum(isinstance(x, TokenBatch) for x in out) >= cancel_after:
            cancel.set()
    return out


def summary(evs):
    toks = [(e.row, t.id, round(t.logprob, 4), t.text) for e in evs if isinstance(e, TokenBatch)
            for t in e.tokens]
    done = sorted((e.row, e.finish_reason, e.text, e.usage.completion_tokens)
                  for e in evs if isinstance(e, RowDone))
    return toks, done


@pytest.mark.parametrize("settings", [
    (SamplingParams(temperature=0, max_new_tokens=20),),
    # rows that end at different steps leave the batch while the next step is queued
    (SamplingParams(temperature=0, max_new_tokens=5),
     SamplingParams(temperature=0.9, seed=3, max_new_tokens=14, repetition_penalty=1.2),
     SamplingParams(temperature=1.0, seed=4, top_p=0.9, max_new_tokens=9)),
])
def test_pipelined_loop_gives_the_same_events(tiny_ckpt, settings):
    plain, piped = (LocalBackend.from_checkpoint(tiny_ckpt) for _ in range(2))
    plain.pipeline, piped.pipeline = False, True
    assert summary(events(piped, *settings)) == summary(events(plain, *settings))


def test_pipelined_cache_reuse_across_turns_and_cancel(tiny_ckpt):
    plain, piped = (LocalBackend.from_checkpoint(tiny_ckpt) for _ in range(2))
    plain.pipeline, piped.pipeline = False, True
    g = SamplingParams(temperature=0, max_new_tokens=12)
    msgs = MSGS
    for turn in range(3):
        a, b = events(plain, g, messages=msgs), events(piped, g, messages=msgs)
        assert summary(a) == summary(b)
        # the queued step leaves the cache one token ahead: what it holds is what it says
        assert piped._cache.get_seq_length() == len(piped.cached_ids)
        text = next(e.text for e in b if isinstance(e, RowDone))
        msgs = msgs + (Message("assistant", text), Message("user", f"And {turn}?"))
    a = events(plain, g, messages=msgs, cancel_after=3)
    b = events(piped, g, messages=msgs, cancel_after=3)
    assert summary(a) == summary(b)
    assert next(e for e in b if isinstance(e, RowDone)).finish_reason == "cancelled"
    # after a cancel the next turn still reuses a consistent prefix
    assert summary(events(plain, g, messages=msgs)) == summary(events(piped, g, messages=msgs))


def test_pipelined_loop_on_a_left_padded_batch(tiny_ckpt):
    """Different conversations (attention mask and positions advance with each step)."""
    plain, piped = (LocalBackend.from_checkpoint(tiny_ckpt) for _ in range(2))
    plain.pipeline, piped.pipeline = False, True
    reqs = [GenerationRequest((Message("user", text),), (SamplingParams(temperature=0,
                                                                        max_new_tokens=n),), 2)
            for text, n in (("Hi", 7), ("Tell me a long story about the sea and ships.", 11),
                            ("Why?", 4))]
    a = list(plain.generate_batch(reqs, threading.Event()))
    b = list(piped.generate_batch(reqs, threading.Event()))
    assert summary(a) == summary(b) and len(summary(a)[1]) == 3
