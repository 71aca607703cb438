"""The fast runner's one-token decode step with little overhead: ``torch.compile`` fuses the
small operations of ``FastLlama.step`` (norms, RoPE, SwiGLU, int8 dequantisation) and, on CUDA,
the compiled step is captured once in a CUDA graph and replayed, so a token costs one graph
launch instead of hundreds of kernel launches from Python (gpt-fast's recipe, with the graph
captured by hand as vLLM does: the step's inputs are a few static buffers).

One graph is kept per batch size. A graph is tied to the cache tensors it was captured with:
when the cache grows or its rows change (a new tensor), the step is captured again, which
takes milliseconds; compilation itself happens once (the cache's capacity and the batch size
are dynamic dimensions) and inductor keeps its output on disk (``paths.inductor_dir``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Protocol

import torch

from .kv_cache import StaticKVCache

COMPILE_MODES = ("auto", "on", "off")
ROPE_BLOCK = 4096
"""The step's RoPE tables cover positions in multiples of this."""


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


class _Graph:
    """One captured replay of the step for one set of cache tensors and batch size."""

    def __init__(self, fn: Callable[..., torch.Tensor], ks: list[torch.Tensor],
                 vs: list[torch.Tensor], ids: torch.Tensor, pos: int, cos: torch.Tensor,
                 sin: torch.Tensor) -> None:
        self.ks, self.vs, self.cos, self.sin = list(ks), list(vs), cos, sin
        self.ids = ids.clone()
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
        self._graphs: dict[int, _Graph] = {}
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
            self._mark(cache, ids, cos)
            p = torch.full((1,), pos, dtype=torch.long, device=self.device)
            out = self._fn(cache.k, cache.v, ids, p, cos, sin)
            cache.length = pos + 1
            return out
        g = self._graphs.get(B)
        if g is None or not g.fits(cache.k, cache.v, cos):
            self._graphs.pop(B, None)  # free the old graph and its cache tensors first
            self._mark(cache, ids, cos)
            g = self._graphs[B] = _Graph(self._fn, cache.k, cache.v, ids, pos, cos, sin)
        out = g(ids, pos)
        cache.length = pos + 1
        return out

    def warm_up(self, batch: int = 1) -> None:
        """Compile (and capture) once on a scratch cache, so the first reply does not wait."""
        cache = self.fast.new_cache(batch)
        ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self(cache, ids)
        self(cache, ids)
        self._graphs.pop(batch, None)  # tied to the scratch cache

    def describe(self) -> str:
        parts = ["compiled" if self.compiled else "eager"]
        if self.graphs:
            parts.append("CUDA graph")
        return " + ".join(parts)
