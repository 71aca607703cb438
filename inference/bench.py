"""``chatui bench``: decode and prefill speed, time to first token, achieved weight bandwidth
and peak memory of the local engine, optionally against transformers' ``generate`` in the
same run on the same model and prompt.
"""

from __future__ import annotations

import resource
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .checkpoint import lazy_model
from .settings import SamplingParams
from .types import (AssistantPrefix, Failed, GenerationRequest, Message, RowDone, Started,
                    TokenBatch)

FILLER = ("The quick brown fox jumps over the lazy dog while the curious cat watches from the "
          "old stone wall, and the river keeps running towards the distant sea. ")


class BenchError(Exception):
    """A benchmark that cannot run as asked (a prompt over the context, a run the engine
    refused); ``str(exc)`` is one sentence for the user (also ``.user_message``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.user_message = message


def check_fits(backend: Any, prompt_tokens: int, new_tokens: int) -> None:
    """Refuse a prompt and reply longer than the model's context before anything runs.

    Raises:
        BenchError: naming both lengths and the context limit.
    """
    limit = getattr(getattr(backend, "info", None), "context_limit", None)
    if isinstance(limit, int) and prompt_tokens + new_tokens > limit:
        raise BenchError(
            f"--prompt-tokens {prompt_tokens} plus --new-tokens {new_tokens} is more than the "
            f"model's context of {limit} tokens; use a shorter prompt or fewer new tokens.")


def settle(backend: Any) -> None:
    """The runner's weights as they will stay (``FastRunner.settle``: those a start reads into
    huge pages taken in), so that a benchmark times the steady state."""
    settle_runner = getattr(getattr(backend, "runner", None), "settle", None)
    if settle_runner is not None:
        settle_runner()


def _events(backend: Any, request: GenerationRequest) -> list[Any]:
    """Every event of one request; a run the engine refused (a Failed event) raises."""
    events = list(backend.generate(request, threading.Event()))
    failed = next((e for e in events if isinstance(e, Failed)), None)
    if failed is not None:
        raise BenchError(f"The benchmark run failed: {failed.message.rstrip('.')}.")
    return events


@dataclass(frozen=True)
class BenchResult:
    """One benchmark run; every figure is measured, none estimated."""

    model: str
    device: str
    dtype: str
    quantization: str
    threads: int
    batch: int
    prompt_tokens: int
    new_tokens: int
    top_logprobs: int
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    """Per row; the aggregate is this times ``batch``."""
    aggregate_tokens_per_s: float
    weight_bytes: int
    bandwidth_gb_s: float
    """weight_bytes x decode steps per second / 1e9."""
    peak_memory_mb: float
    hf_decode_tokens_per_s: float | None = None
    hf_total_s: float | None = None
    speedup_vs_hf: float | None = None
    runner: str = ""
    """Which runner and precision the backend picked."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def weight_bytes(model: Any) -> int:
    """Bytes of parameters and buffers (shared tensors counted once)."""
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def make_prompt(tokenizer: Any, n_tokens: int) -> tuple[Message, ...]:
    """A user message whose chat encoding takes about ``n_tokens`` tokens."""
    ids = tokenizer.encode(FILLER * (n_tokens // 20 + 2), add_special_tokens=False)
    text = tokenizer.decode(ids[: max(n_tokens - 20, 1)])
    return (Message("user", text),)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run(backend: Any, messages: tuple[Message, ...], new_tokens: int, batch: int,
         top_logprobs: int) -> tuple[Started, list[RowDone], float]:
    settings = (SamplingParams(temperature=0, max_new_tokens=new_tokens),) * batch
    backend.reset()
    t0 = time.perf_counter()
    events = _events(backend, GenerationRequest(messages, settings, top_logprobs))
    total = time.perf_counter() - t0
    started = next((e for e in events if isinstance(e, Started)), None)
    rows = [e for e in events if isinstance(e, RowDone)]
    if started is None or not rows:  # never let StopIteration escape into a caller's future
        raise BenchError("The benchmark run ended without a reply; see the log for details.")
    return started, rows, total


def run_bench(backend: Any, *, prompt_tokens: int = 128, new_tokens: int = 128, batch: int = 1,
              top_logprobs: int = 5, vs_hf: bool = False, repeats: int = 1) -> BenchResult:
    """Measure the engine (EOS ignored so every run decodes exactly ``new_tokens``).

    Raises:
        BenchError: the prompt and reply do not fit the context, or a run failed.
    """
    settle(backend)
    check_fits(backend, prompt_tokens, new_tokens)
    model = backend.runner.model
    device = backend.device
    messages = make_prompt(backend.tokenizer, prompt_tokens)
    eos, backend.eos_ids = backend.eos_ids, frozenset()
    try:
        _run(backend, messages, 4, batch, top_logprobs)  # warm-up
        best: tuple[Started, list[RowDone], float] | None = None
        for _ in range(max(1, repeats)):
            r = _run(backend, messages, new_tokens, batch, top_logprobs)
            if best is None or r[1][0].usage.decode_tokens_per_s > best[1][0].usage.decode_tokens_per_s:
                best = r
    finally:
        backend.eos_ids = eos
    assert best is not None
    started, rows, _ = best
    usage = rows[0].usage
    tps = min(r.usage.decode_tokens_per_s for r in rows)
    per_step = getattr(backend.runner, "weight_bytes", None)  # the fast runner's own weights
    wbytes = per_step() if per_step else weight_bytes(model)
    hf_tps = hf_total = None
    if vs_hf:  # transformers runs the model's own weights: load those the fast runner left
        # in the file (a lazily loaded checkpoint's)
        lazy_model.materialize(model)
        hf_tps, hf_total = hf_generate_speed(model, backend.tokenizer, messages, new_tokens)
    return BenchResult(
        model=backend.info.name, device=str(device), dtype=backend.info.dtype,
        quantization=backend.info.quantization, threads=torch.get_num_threads(), batch=batch,
        prompt_tokens=started.prompt_tokens, new_tokens=usage.completion_tokens,
        top_logprobs=top_logprobs, ttft_s=usage.ttft_s,
        prefill_tokens_per_s=started.prompt_tokens / usage.ttft_s if usage.ttft_s else 0.0,
        decode_tokens_per_s=tps, aggregate_tokens_per_s=tps * batch, weight_bytes=wbytes,
        bandwidth_gb_s=wbytes * tps / 1e9, peak_memory_mb=peak_memory_mb(device),
        hf_decode_tokens_per_s=hf_tps, hf_total_s=hf_total,
        speedup_vs_hf=(tps / hf_tps) if hf_tps else None, runner=_describe(backend))


@torch.inference_mode()
def hf_generate_speed(model: Any, tokenizer: Any, messages: tuple[Message, ...],
                      new_tokens: int) -> tuple[float, float]:
    """transformers' greedy ``generate`` on the same prompt: (decode tokens/s, total seconds).

    Decode speed excludes the prefill: (n - 1) / (time for n tokens - time for 1 token).
    """
    ids = tokenizer.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                        add_generation_prompt=True, return_dict=False)
    x = torch.tensor([ids], device=next(model.parameters()).device)
    kw = dict(do_sample=False, pad_token_id=tokenizer.pad_token_id or 0)
    model.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
    t0 = time.perf_counter()
    model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
    t1 = time.perf_counter() - t0
    t0 = time.perf_counter()
    model.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
    tn = time.perf_counter() - t0
    return (new_tokens - 1) / max(tn - t1, 1e-9), tn


# ---- compare mode: N settings in one batch against N sequential runs ----


@dataclass(frozen=True)
class CompareBenchRow:
    """N settings answered once as one batch and once one after the other."""

    n: int
    batched_s: float
    """Wall time of the batched request (one prefill, N rows decoded together)."""
    sequential_s: float
    """Wall time of N single-row requests in a row (the prompt's cache reused after the first)."""
    batched_tokens_per_s: float
    """Aggregate: all rows' tokens / wall time (prefill included)."""
    sequential_tokens_per_s: float
    batched_decode_tokens_per_s: float
    """Aggregate decode only: all rows' tokens after the first / decode time."""
    sequential_decode_tokens_per_s: float
    speedup: float
    """batched_tokens_per_s / sequential_tokens_per_s."""


@dataclass(frozen=True)
class CompareBenchResult:
    """``chatui bench --compare`` (and ``--fan-out``, ``mode`` "fan-out"): one row per N."""

    model: str
    device: str
    dtype: str
    quantization: str
    threads: int
    prompt_tokens: int
    new_tokens: int
    top_logprobs: int
    rows: tuple[CompareBenchRow, ...]
    mode: str = "compare"
    """"compare" (N sampled settings) or "fan-out" (the N most likely tokens at one token of a
    greedy reply, each continued greedily: ``chatui generate --fork-at``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_settings(n: int, new_tokens: int) -> tuple[SamplingParams, ...]:
    """N different sampled settings with their own seeds (what a comparison looks like)."""
    temps = (0.7, 1.0, 0.4, 1.2, 0.9, 0.6)
    return tuple(SamplingParams(temperature=temps[i % len(temps)], top_p=0.95, seed=i + 1,
                                max_new_tokens=new_tokens) for i in range(n))


def _timed(backend: Any, request: GenerationRequest) -> tuple[float, int, float]:
    """(wall seconds, tokens generated, decode seconds of the slowest row) for one request."""
    t0 = time.perf_counter()
    events = _events(backend, request)
    wall = time.perf_counter() - t0
    done = [e for e in events if isinstance(e, RowDone)]
    if len(done) != len(request.settings) or any(d.finish_reason != "length" for d in done):
        raise BenchError("A benchmark run ended early (finish reasons "
                         f"{', '.join(d.finish_reason for d in done) or 'none'}).")
    tokens = sum(d.usage.completion_tokens for d in done)
    decode = max((d.usage.completion_tokens - 1) / d.usage.decode_tokens_per_s
                 for d in done if d.usage.decode_tokens_per_s > 0)
    return wall, tokens, decode


def _captures(backend: Any) -> bool:
    """Whether the backend records its step as CUDA graphs: then each batch size and cache
    capacity is captured once a session (40-50 ms), and the benchmarks run each size once,
    untimed, before timing the steady state a person sees from their second comparison on."""
    step = getattr(getattr(backend, "runner", None), "decode", None)
    return bool(getattr(step, "graphs", False))


def _rows_vs_singles(backend: Any, batched: GenerationRequest,
                     singles: list[GenerationRequest], repeats: int) -> CompareBenchRow:
    """One request of N rows against its N rows as N requests in a row; with ``repeats``, the
    best batched run and the best of each single run are kept (on a shared machine a spike of
    load hits one run, not the whole series)."""
    n = len(singles)
    best_b = None
    best_runs: list[tuple[float, int, float] | None] = [None] * n
    for _ in range(max(1, repeats)):
        backend.reset()  # each side prefills the prompt once
        b = _timed(backend, batched)
        best_b = b if best_b is None or b[0] < best_b[0] else best_b
        backend.reset()
        for i, one in enumerate(singles):
            r = _timed(backend, one)
            if best_runs[i] is None or r[0] < best_runs[i][0]:  # type: ignore[index]
                best_runs[i] = r
    runs = [r for r in best_runs if r is not None]
    best_s = (sum(r[0] for r in runs), sum(r[1] for r in runs), sum(r[2] for r in runs))
    assert best_b is not None
    b_tps, s_tps = best_b[1] / best_b[0], best_s[1] / best_s[0]
    return CompareBenchRow(
        n=n, batched_s=best_b[0], sequential_s=best_s[0], batched_tokens_per_s=b_tps,
        sequential_tokens_per_s=s_tps,
        batched_decode_tokens_per_s=(best_b[1] - n) / best_b[2],
        sequential_decode_tokens_per_s=(best_s[1] - n) / best_s[2],
        speedup=b_tps / s_tps)


def run_compare_bench(backend: Any, *, ns: tuple[int, ...] = (1, 2, 4, 8),
                      prompt_tokens: int = 128, new_tokens: int = 128, top_logprobs: int = 5,
                      repeats: int = 1) -> CompareBenchResult:
    """For each N: N settings as one batched request against the same N as N requests in a
    row (EOS ignored so every row decodes exactly ``new_tokens``). With ``repeats``, the best
    batched run and the best of each single run are kept.

    Measured (docs/batched-decode.md, ``benchmarks/bench_batch.py --cpu-clock``: one thread
    timed by its CPU time on a shared 2-core machine, medians of 3 rounds, default model int8,
    64 new tokens): 4 rows 1.81x and 8 rows 2.26x the single stream (1.45x and 1.51x before
    issue 18's work); 2.17-2.24x and 2.64-2.79x with issue 18's second pass (load 2.4-2.8, two
    runs).

    Raises:
        BenchError: the prompt and reply do not fit the context, or a run failed.
    """
    settle(backend)
    check_fits(backend, prompt_tokens, new_tokens)
    messages = make_prompt(backend.tokenizer, prompt_tokens)
    eos, backend.eos_ids = backend.eos_ids, frozenset()
    rows = []
    try:
        backend.reset()
        _timed(backend, GenerationRequest(messages, compare_settings(max(ns), 4),
                                          top_logprobs))  # warm-up
        if _captures(backend):
            for n in ns:
                _timed(backend, GenerationRequest(messages, compare_settings(n, new_tokens),
                                                  top_logprobs))
        for n in ns:
            settings = compare_settings(n, new_tokens)
            rows.append(_rows_vs_singles(
                backend, GenerationRequest(messages, settings, top_logprobs),
                [GenerationRequest(messages, (one,), top_logprobs) for one in settings],
                repeats))
    finally:
        backend.eos_ids = eos
    return CompareBenchResult(
        model=backend.info.name, device=str(backend.device), dtype=backend.info.dtype,
        quantization=backend.info.quantization, threads=torch.get_num_threads(),
        prompt_tokens=backend.count_tokens(messages), new_tokens=new_tokens,
        top_logprobs=top_logprobs, rows=tuple(rows))


FORK_AT = 8
"""The token of the greedy reply the fan-out benchmark branches at."""


def fan_out_requests(backend: Any, messages: tuple[Message, ...], k: int, new_tokens: int,
                     top_logprobs: int) -> tuple[GenerationRequest, list[GenerationRequest]]:
    """What ``chatui generate --fork-at FORK_AT --fork-k K`` decodes after its reply: the K most
    likely tokens at token ``FORK_AT`` of a greedy reply, each continued greedily for
    ``new_tokens`` tokens from the reply's prefix, as one request of K rows (one prefill, the
    cache expanded to K rows), and the same K branches as K one-row requests.

    Raises:
        BenchError: the reply ended before the fork point (EOS is ignored by the caller).
    """
    greedy = SamplingParams(temperature=0, max_new_tokens=FORK_AT + 1)
    reply = [t for e in _events(backend, GenerationRequest(messages, (greedy,), max(k, 1)))
             if isinstance(e, TokenBatch) for t in e.tokens]
    if len(reply) <= FORK_AT or len(reply[FORK_AT].top) < k:
        raise BenchError(f"The reply has no {k} alternatives at token {FORK_AT} to branch at.")
    prefix = AssistantPrefix("".join(t.text for t in reply[:FORK_AT]),
                             tuple(t.id for t in reply[:FORK_AT]))
    alternatives = tuple(a.id for a in reply[FORK_AT].top[:k])
    branch = SamplingParams(temperature=0, max_new_tokens=new_tokens)
    batched = GenerationRequest(messages, (branch,) * k, top_logprobs, prefix=prefix,
                                first_tokens=alternatives)
    singles = [GenerationRequest(messages, (branch,), top_logprobs, prefix=prefix,
                                 first_tokens=(a,)) for a in alternatives]
    return batched, singles


def run_fan_out_bench(backend: Any, *, ns: tuple[int, ...] = (1, 2, 4, 8),
                      prompt_tokens: int = 128, new_tokens: int = 128, top_logprobs: int = 5,
                      repeats: int = 1) -> CompareBenchResult:
    """``chatui bench --fan-out``: for each K, the K branches of ``fan_out_requests`` as one
    batched request against the same K branches as K requests in a row (EOS ignored).
    Measured as ``run_compare_bench``: 4 branches 1.93x, 8 branches 2.42x.

    Raises:
        BenchError: the prompt and reply do not fit the context, or a run failed.
    """
    settle(backend)
    check_fits(backend, prompt_tokens, FORK_AT + new_tokens)
    messages = make_prompt(backend.tokenizer, prompt_tokens)
    eos, backend.eos_ids = backend.eos_ids, frozenset()
    rows = []
    try:
        backend.reset()
        warm, _ = fan_out_requests(backend, messages, max(ns), 4, top_logprobs)
        _timed(backend, warm)
        if _captures(backend):
            for n in ns:
                backend.reset()
                _timed(backend, fan_out_requests(backend, messages, n, new_tokens,
                                                 top_logprobs)[0])
        for n in ns:
            backend.reset()
            batched, singles = fan_out_requests(backend, messages, n, new_tokens, top_logprobs)
            rows.append(_rows_vs_singles(backend, batched, singles, repeats))
    finally:
        backend.eos_ids = eos
    return CompareBenchResult(
        model=backend.info.name, device=str(backend.device), dtype=backend.info.dtype,
        quantization=backend.info.quantization, threads=torch.get_num_threads(),
        prompt_tokens=backend.count_tokens(messages), new_tokens=new_tokens,
        top_logprobs=top_logprobs, rows=tuple(rows), mode="fan-out")


def _describe(backend: Any) -> str:
    from .runner import describe

    try:
        return describe(backend.runner)
    except Exception:  # noqa: BLE001 - a stand-in backend without a runner
        return ""
