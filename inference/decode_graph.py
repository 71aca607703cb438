"""The fast runner's one-token decode step with little overhead: ``torch.compile`` fuses the
small operations of ``FastLlama.step`` (norms, RoPE, SwiGLU, int8 dequantisation) and, on CUDA,
the compiled step is captured once in a CUDA graph and replayed, so a token costs one graph
launch instead of hundreds of kernel launches from Python (gpt-fast's recipe, with the graph
captured by hand as vLLM does: the step's inputs are a few static buffers).

A graph is tied to the cache tensors it was captured with. Graphs are kept per batch size and
cache capacity, and a cache of a kept graph's shape that is not its own (every comparison,
fan-out and reply after a reset makes a new one) is moved into the graph's tensors instead of
capturing the step again: a capture (two warm-up steps and the recording) took 40-50 ms on an
H100 with the default model's shape, moving a cache is a device copy of its bytes. Measured
there (``benchmarks/bench_batch.py --device cuda``, a random-weight model of the default
model's shape, 64 new tokens): a 4-row batched request took 0.14 s against a 0.10 s decode,
four single rows 0.39 s, so the capture of each batched request was what kept 4 rows at 2.7x.
Compilation itself happens at load (the cache's capacity and the batch size are dynamic
dimensions, a batch of one is compiled apart: torch specializes size 1) and inductor keeps
its output on disk (``paths.inductor_dir``).
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Callable, Protocol

import torch

from .kv_cache import CACHE_BLOCK, StaticKVCache

COMPILE_MODES = ("auto", "on", "off")
ROPE_BLOCK = 4096
"""The step's RoPE tables cover positions in multiples of this."""
KEPT_GRAPH_BYTES = 256 << 20
"""Cache tensors that graphs other than the newest may keep (or as many as the newest's)."""


class SteppedModel(Protocol):
    """What the step needs of the model (``fast_llama.FastLlama``), named here so this module
    does not import the model's."""

    device: torch.device

    def step(self, ks: list[torch.Tensor], vs: list[torch.Tensor], ids: torch.Tensor,
             pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...

    def rope_tables(self, n: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def new_cache(self, batch: int = 1) -> StaticKVCache: ...


def use_compile(mode: str, device: torch.device) -> bool:
    """Whether the decode step is compiled: "auto" compiles on CUDA (where it pays: CUDA
    graphs), "on" everywhere inductor runs, "off" never."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"unknown compile mode {mode!r}; choose auto, on or off")
    if mode == "off":
        return False
    if mode == "auto":
        return device.type == "cuda"
    return True


def _plain(ids: torch.Tensor) -> torch.Tensor:
    """A copy of the step's token ids with plain strides: the compiled step is guarded on its
    inputs' strides, and a column of a sampled batch (strides (25, 1) for one row) recompiled
    it inside the first reply. A replayed graph copies the ids into its buffer instead."""
    return ids.clone(memory_format=torch.contiguous_format)


class _Graph:
    """One captured replay of the step for one set of cache tensors and batch size. ``ids``
    becomes its input buffer (the caller passes a copy of its own)."""

    owner: weakref.ref[StaticKVCache] | None = None
    """The cache that holds the graph's tensors now (it may have been dropped since)."""

    def __init__(self, fn: Callable[..., torch.Tensor], ks: list[torch.Tensor],
                 vs: list[torch.Tensor], ids: torch.Tensor, pos: int, cos: torch.Tensor,
                 sin: torch.Tensor) -> None:
        self.ks, self.vs, self.cos, self.sin = list(ks), list(vs), cos, sin
        self.ids = ids
        self.pos = torch.full((1,), pos, dtype=torch.long, device=ids.device)
        # Warm-up on a side stream (compiles on first use, allocates workspaces). It runs the
        # real step at the real position, so what it writes into the cache is what the replay
        # writes again.
        side = torch.cuda.Stream(device=ids.device)
        side.wait_stream(torch.cuda.current_stream(ids.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                fn(self.ks, self.vs, self.ids, self.pos, cos, sin)
        torch.cuda.current_stream(ids.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(self.ks, self.vs, self.ids, self.pos, cos, sin)

    def fits(self, ks: list[torch.Tensor], vs: list[torch.Tensor], cos: torch.Tensor) -> bool:
        return (cos is self.cos and len(ks) == len(self.ks)
                and all(a is b for a, b in zip(ks, self.ks))
                and all(a is b for a, b in zip(vs, self.vs)))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.ks, *self.vs))

    def __call__(self, ids: torch.Tensor, pos: int) -> torch.Tensor:
        self.ids.copy_(ids)
        self.pos.fill_(pos)
        self.graph.replay()
        return self.out


class DecodeStep:
    """``FastLlama.step`` over a ``StaticKVCache``: compiled, and replayed as a CUDA graph on
    CUDA. ``__call__(cache, ids)`` has the meaning of ``FastLlama.forward`` for one token per
    row with no padding; the logits it returns stay valid until the next call.

    Args:
        fast: the model.
        compile: run the step through ``torch.compile`` (else eager, still captured on CUDA).
        graphs: capture CUDA graphs (CUDA only).
    """

    def __init__(self, fast: SteppedModel, *, compile: bool = True, graphs: bool | None = None,
                 cache_dir: Path | None = None) -> None:
        self.fast = fast
        self.device = fast.device
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.compiled = compile
        self._graphs: OrderedDict[tuple[int, int], _Graph] = OrderedDict()
        """Kept graphs by (batch size, cache capacity), least recently used first."""
        self._graph_cls: Callable[..., _Graph] = _Graph
        self.captures = 0
        """Steps captured so far (each a few tens of milliseconds on a GPU)."""
        self._cos = self._sin = torch.empty(0)
        fn: Callable[..., torch.Tensor] = fast.step
        if compile:
            if cache_dir is not None:
                os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir))
            from torch import _dynamo

            # a few batch sizes and cache capacities are expected; never fall back silently
            cfg = _dynamo.config
            limit = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
            setattr(cfg, limit, max(getattr(cfg, limit), 32))
            # on a CPU the C++ wrapper also removes the Python launch of each kernel
            options = {"cpp_wrapper": True} if self.device.type == "cpu" else None
            fn = torch.compile(fn, fullgraph=True, options=options)
        self._fn = fn

    def _tables(self, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._cos.shape[0] < capacity or self._cos.device != self.device:
            n = -(-capacity // ROPE_BLOCK) * ROPE_BLOCK
            self._cos, self._sin = self.fast.rope_tables(n)
            self._graphs.clear()  # captured with the old tables
        return self._cos, self._sin

    def _mark(self, cache: StaticKVCache, ids: torch.Tensor, cos: torch.Tensor) -> None:
        """The batch size and the cache capacity may change without a recompile."""
        if not self.compiled:
            return
        from torch._dynamo import maybe_mark_dynamic

        for t in (*cache.k, *cache.v):
            maybe_mark_dynamic(t, 0)
            maybe_mark_dynamic(t, 2)
        maybe_mark_dynamic(ids, 0)
        maybe_mark_dynamic(cos, 0)
        maybe_mark_dynamic(self._sin, 0)

    @torch.inference_mode()
    def __call__(self, cache: StaticKVCache, ids: torch.Tensor) -> torch.Tensor:
        B = ids.shape[0]
        pos = cache.length
        cache.reserve(pos + 1, B)
        cos, sin = self._tables(cache.capacity)
        if not self.graphs:
            ids = _plain(ids)
            self._mark(cache, ids, cos)
            p = torch.full((1,), pos, dtype=torch.long, device=self.device)
            out = self._fn(cache.k, cache.v, ids, p, cos, sin)
            cache.length = pos + 1
            return out
        key = (B, cache.capacity)
        g = self._graphs.get(key)
        if g is not None and not g.fits(cache.k, cache.v, cos):
            self._move_in(g, cache)
        if g is None:
            buf = _plain(ids)
            self._mark(cache, buf, cos)
            g = self._graph_cls(self._fn, cache.k, cache.v, buf, pos, cos, sin)
            self.captures += 1
            g.owner = weakref.ref(cache)
            self._graphs[key] = g
            self._evict(key)
        self._graphs.move_to_end(key)
        out = g(ids, pos)
        cache.length = pos + 1
        return out

    def _move_in(self, g: _Graph, cache: StaticKVCache) -> None:
        """Make ``cache`` use the graph's tensors (same shapes: the key says so), its keys and
        values copied in. A cache still holding them (the conversation's, say, when a
        comparison comes) gets the newcomer's tensors with its own contents: nothing a live
        cache holds is lost, and no two caches share a tensor."""
        mine = [*g.ks, *g.vs]
        theirs = [*cache.k, *cache.v]
        owner = g.owner() if g.owner is not None else None
        if owner is not None and owner.k[0] is g.ks[0]:
            for a, b in zip(mine, theirs):
                held = a.clone()
                a.copy_(b)
                b.copy_(held)
            owner.k, owner.v = list(cache.k), list(cache.v)
        else:
            for a, b in zip(mine, theirs):
                a.copy_(b)
        cache.k, cache.v = list(g.ks), list(g.vs)
        g.owner = weakref.ref(cache)

    def _evict(self, newest: tuple[int, int]) -> None:
        """The other graphs keep at most ``KEPT_GRAPH_BYTES`` of cache tensors, or as many as
        the newest: a comparison after a long chat with a large model (or the reverse) does
        not keep both caches' memory."""
        budget = max(self._graphs[newest].nbytes, KEPT_GRAPH_BYTES)
        while sum(g.nbytes for k, g in self._graphs.items() if k != newest) > budget:
            old = next(k for k in self._graphs if k != newest)
            del self._graphs[old]

    def warm_up(self) -> None:
        """Compile (and capture) on a scratch cache of one row across a capacity block, so the
        first reply does not wait, not even where it outgrows the first block (one compile:
        the capacity is dynamic). The graphs stay: the first cache of their shape moves into
        them.

        Several rows compile apart from one (torch specializes a size of 1; on a CPU, 2-4
        rows and 5 or more also apart, by inductor's kernel choice): the first comparison or
        fan-out of a session compiles before it starts (4-6 s on an H100 with the inductor
        cache on disk filled, measured in ``chatui bench --compare`` before the warm-up runs
        of each size). Compiling them at load instead made a cold load 87 s instead of about
        50 on an H100, and every load pays for it, most never comparing."""
        cache = self.fast.new_cache(1)
        cache.length = CACHE_BLOCK - 2
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        for _ in range(3):
            self(cache, ids)

    def describe(self) -> str:
        parts = ["compiled" if self.compiled else "eager"]
        if self.graphs:
            parts.append("CUDA graph")
        return " + ".join(parts)
