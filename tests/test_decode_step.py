"""The fixed-shape decode step (``FastLlama.step`` through ``DecodeStep``) against the eager
forward, and the engine's pipelined decode loop against the plain one. CUDA graph capture
itself needs a GPU; everything around it (the step the graph replays, compiled or not, the
cache it writes, the pipelined loop) runs here on the CPU."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.decode_graph import DecodeStep, _Graph, use_compile
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


class ReplayedGraph(_Graph):
    """A CUDA graph's contract on the CPU: at capture it is bound to the cache tensors it was
    given, and every replay runs the step on those tensors whatever cache the caller holds."""

    def __init__(self, fn, ks, vs, ids, pos, cos, sin) -> None:
        self.fn, self.ks, self.vs, self.cos, self.sin = fn, list(ks), list(vs), cos, sin
        self.ids = ids.clone()

    def __call__(self, ids, pos):
        self.ids.copy_(ids)
        return self.fn(self.ks, self.vs, self.ids, torch.full((1,), pos), self.cos, self.sin)


def graph_step(fast) -> DecodeStep:
    step = DecodeStep(fast, compile=False, graphs=True)
    step._graph_cls = ReplayedGraph
    return step


class Pair:
    """One conversation's cache through the graph step and its reference through the eager
    forward; ``decode`` checks every step's logits against the reference's."""

    def __init__(self, fast, seed: int, length: int, rows: int = 1, atol: float = 1e-5) -> None:
        torch.manual_seed(seed)
        prompt = torch.randint(3, 1000, (1, length), device=fast.device)
        self.fast, self.ref, self.got = fast, fast.new_cache(), fast.new_cache()
        self.atol = atol
        fast.forward(self.ref, prompt)
        fast.forward(self.got, prompt)
        if rows > 1:
            self.ref.batch_repeat_interleave(rows)
            self.got.batch_repeat_interleave(rows)
        self.ids = torch.randint(3, 1000, (rows, 1), device=fast.device)

    def decode(self, step: DecodeStep, n: int) -> None:
        for _ in range(n):
            want = self.fast.forward(self.ref, self.ids)
            got = step(self.got, self.ids)
            assert torch.allclose(got, want, atol=self.atol), (got - want).abs().max()
            self.ids = want.argmax(-1, keepdim=True)


def test_a_graph_takes_new_caches_of_its_shape_without_capturing_again(tiny_ckpt):
    """Every comparison, fan-out and reset makes a new cache; a kept graph of its shape takes
    it in (copied into the graph's tensors) instead of capturing the step again, and the
    conversation whose cache held those tensors keeps its keys and values: each cache,
    interleaved with the others, decodes what the eager forward does on a cache of its own."""
    fast = FastRunner(tiny_ckpt.model).fast
    step = graph_step(fast)
    chat = Pair(fast, 1, 40)
    chat.decode(step, 3)
    assert step.captures == 1
    other = Pair(fast, 2, 60)  # a reply after a reset: a new one-row cache, same capacity
    other.decode(step, 2)
    chat.decode(step, 2)  # the chat's cache came back through the other's tensors
    other.decode(step, 2)
    compare = Pair(fast, 3, 50, rows=3)
    compare.decode(step, 3)
    again = Pair(fast, 4, 30, rows=3)  # the next comparison: moved in too
    again.decode(step, 2)
    compare.decode(step, 2)
    chat.decode(step, 2)
    assert step.captures == 2  # one graph a shape: (1 row, 256 positions) and (3 rows, 256)


def test_graphs_beyond_the_memory_budget_are_let_go(tiny_ckpt, monkeypatch):
    """Graphs other than the newest keep at most KEPT_GRAPH_BYTES of cache tensors (or the
    newest's bytes); a shape let go is captured again when it returns, and decodes right."""
    import inference.decode_graph as dg

    fast = FastRunner(tiny_ckpt.model).fast
    step = graph_step(fast)
    monkeypatch.setattr(dg, "KEPT_GRAPH_BYTES", 0)
    one = Pair(fast, 1, 20)
    one.decode(step, 2)
    two = Pair(fast, 2, 20, rows=2)
    two.decode(step, 2)  # (2, 256) is twice (1, 256): that one may stay
    four = Pair(fast, 3, 20, rows=4)
    four.decode(step, 2)  # (4, 256): 4 units, the other two 3: both stay
    eight = Pair(fast, 4, 20, rows=8)
    eight.decode(step, 2)  # 8 units against 7: still all kept
    assert len(step._graphs) == 4 and step.captures == 4
    big = Pair(fast, 5, 300)  # (1, 512): 2 units, the others 15, least recently used first
    big.decode(step, 2)
    assert list(step._graphs) == [(1, 512)]
    one.decode(step, 2)  # its shape is captured again, on its own cache's tensors
    assert list(step._graphs) == [(1, 256)] and step.captures == 6
    big.decode(step, 2)


def test_warm_up_leaves_graphs_the_first_reply_moves_into(tiny_ckpt):
    """The load's warm-up compiles and captures on a scratch cache, across a capacity block;
    the first reply, short or long, captures nothing."""
    fast = FastRunner(tiny_ckpt.model).fast
    step = graph_step(fast)
    step.warm_up()
    n = step.captures
    assert set(step._graphs) == {(1, 256), (1, 512)}
    Pair(fast, 1, 30).decode(step, 3)
    Pair(fast, 2, 300).decode(step, 3)
    assert step.captures == n


def test_the_engine_with_graphs_gives_what_the_step_without_them_gives(tiny_ckpt):
    """The engine as it runs on a GPU (the step bound to captured caches, pipelined) over a
    chat, comparisons whose rows end at different steps (the batch shrinks: new caches), and
    the chat again (its cache reused across turns while other caches took its graph): every
    event is the plain step's, and each shape is captured once."""
    plain, graphed = (LocalBackend.from_checkpoint(tiny_ckpt) for _ in range(2))
    plain.runner.decode = DecodeStep(plain.runner.fast, compile=False, graphs=False)
    graphed.runner.decode = step = graph_step(graphed.runner.fast)
    plain.pipeline = graphed.pipeline = True
    g = SamplingParams(temperature=0, max_new_tokens=12)
    rows = (SamplingParams(temperature=0, max_new_tokens=5),
            SamplingParams(temperature=0.9, seed=3, max_new_tokens=14, repetition_penalty=1.2),
            SamplingParams(temperature=1.0, seed=4, top_p=0.9, max_new_tokens=9))
    msgs = MSGS
    for turn in range(3):
        a, b = events(plain, g, messages=msgs), events(graphed, g, messages=msgs)
        assert summary(a) == summary(b)
        assert summary(events(plain, *rows, messages=msgs)) == summary(
            events(graphed, *rows, messages=msgs))
        text = next(e.text for e in b if isinstance(e, RowDone))
        msgs = msgs + (Message("assistant", text), Message("user", f"And {turn}?"))
    assert step.captures == 3  # one row, three rows, two rows (the first comparison row ends)


def test_a_compiled_step_is_not_compiled_again_inside_a_reply(tiny_ckpt, monkeypatch):
    """``--compile on``: the step compiled at load serves the first reply, one that outgrows
    the first cache block too. It used to compile again inside it (25 s a time for the
    default model on a CPU, 4-6 s on an H100): the engine's cache was made outside inference
    mode and grown inside it, the sampled token came as a column with strides of its batch,
    and the thread tuner changed the thread count the compiled code is guarded on."""
    from torch._dynamo.utils import counters

    for var in ("CHATUI_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    backend = LocalBackend.from_checkpoint(tiny_ckpt, compile="on")
    assert backend.runner.decode is not None and backend.threads is None
    compiled = counters["stats"]["unique_graphs"]
    backend.eos_ids = frozenset()
    long = (Message("user", "and " * 240),)
    evs = events(backend, SamplingParams(temperature=0.7, seed=1, max_new_tokens=30),
                 messages=long)
    assert backend._cache.capacity > 256 and len(summary(evs)[0]) == 30
    assert counters["stats"]["unique_graphs"] == compiled
