"""What the step benchmarks (``bench_step_split.py``, ``bench_layer_phases.py``,
``bench_kernels_ab.py``, ``bench_hugepages.py``, ``bench_weight_fetch.py``) share: their common
flags, the engine they time (the default model, int8, as ``chatui`` runs it), a comparison's
decode steps timed whole (alone, or several variants in alternating rounds) and its decode
state to time the layers at."""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from inference import bench
from inference.checkpoint import load_checkpoint
from inference.engine import LocalBackend
from inference.types import GenerationRequest, Message


def step_parser(description: str) -> argparse.ArgumentParser:
    """``--rounds``, ``--rows`` (comma-separated row counts) and ``--threads``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--rows", default="1,4,8")
    parser.add_argument("--threads", type=int, default=2)
    return parser


def default_engine(threads: int) -> LocalBackend:
    """The default model with int8 weights on ``threads`` threads."""
    torch.set_num_threads(threads)
    backend = LocalBackend.from_checkpoint(load_checkpoint(None, lazy=True), quantize="int8",
                                           precision="auto")
    backend.runner.settle()  # the weights in huge pages, as a chat runs on them
    return backend


def comparison_step_ms(backend: LocalBackend, messages: tuple[Message, ...], rows: int,
                       new_tokens: int) -> float:
    """Ms a decode step of ``rows`` of a comparison (``bench.compare_settings``, top-5
    logprobs; EOS ignored where the caller cleared ``eos_ids``): the prompt prefilled and a
    2-token request of as many rows first, then ``new_tokens`` timed whole."""
    backend.reset()
    list(backend.generate(GenerationRequest(messages, bench.compare_settings(rows, 2), 5),
                          threading.Event()))
    start = time.perf_counter()
    list(backend.generate(GenerationRequest(
        messages, bench.compare_settings(rows, new_tokens), 5), threading.Event()))
    return (time.perf_counter() - start) * 1e3 / new_tokens


def alternating_rounds(backend: LocalBackend, messages: tuple[Message, ...], rows: list[int],
                       variants: list[Any], use: Callable[[Any], None],
                       name: Callable[[Any], str], rounds: int,
                       new_tokens: int) -> dict[tuple[Any, int], list[float]]:
    """``comparison_step_ms`` of every variant (``use(variant)`` switches to it) at each row
    count, the variants taken in turn and their order reversed every other round (the
    machine's speed moves within minutes: only figures measured alternately compare); one line
    printed a round. Returns the ms of each (variant, rows), one a round."""
    spent: dict[tuple[Any, int], list[float]] = {}
    for rnd in range(rounds):
        line = []
        for n in rows:
            for variant in variants if rnd % 2 == 0 else variants[::-1]:
                use(variant)
                ms = comparison_step_ms(backend, messages, n, new_tokens)
                spent.setdefault((variant, n), []).append(ms)
                line.append(f"{n} rows {name(variant)} {ms:.2f}")
        print(f"round {rnd + 1}: " + ", ".join(line), flush=True)
    return spent


@dataclass(frozen=True)
class StepState:
    """One decode step's inputs at a comparison's state (``comparison_state``)."""

    cache: Any  # the runner's StaticKVCache
    write: int  # the cache slot the step writes
    positions: torch.Tensor  # [rows] int64
    tables: list[tuple[torch.Tensor, torch.Tensor]]  # (cos, sin) of each RoPE kind
    x: torch.Tensor  # [rows, hidden] fp32: the step's input, kept unchanged

    def decode_layers(self, kernel: Any, fast: Any, layers: Any) -> None:
        """Every decoder layer of the step through ``kernel`` (a ``q8kernel.Q8Kernel``), on a
        copy of ``x``; the cache slot ``write`` is written, as a step writes it."""
        kernel.decode_layers(self.x.clone(), layers, self.cache.k, self.cache.v,
                             n_heads=fast.n_heads, inter=fast.inter, write=self.write,
                             positions=self.positions, cos=[c for c, _ in self.tables],
                             sin=[s for _, s in self.tables], mask=None, eps=fast.eps,
                             shared=self.cache.shared)


def comparison_state(fast: Any, rows: int) -> StepState:
    """A comparison's state for ``fast`` (a ``FastLlama``): a 138-token prompt prefilled once
    and repeated to ``rows`` rows, then 64 tokens of each row's own (random ids, seed 0)."""
    torch.manual_seed(0)
    cache = fast.new_cache(1)
    fast.forward(cache, torch.randint(0, 1000, (1, 138)))
    if rows > 1:
        cache = cache.repeated(rows, 512)
    for _ in range(64):
        fast.forward(cache, torch.randint(0, 1000, (rows, 1)))
    at = cache.length
    tables = [rope.cos_sin(at + 1, rope.use_long(at)) for rope in fast.ropes.values()]
    x = fast._embed(torch.randint(0, 1000, (rows, 1)))[:, 0].contiguous().float()
    return StepState(cache, at, torch.full((rows,), at, dtype=torch.long), tables, x)
