"""Decode speed of every chatui precision against its peers, side by side in one process.

Round-robin over the systems (so a busy shared CPU hurts them alike), best of ``--rounds``:
transformers ``generate`` fp32; chatui on the transformers runner; chatui's fast runner in
fp32 (chatui's fp32 kernel where it builds), in bf16 (torch's bf16 matmuls), with int8 (the CPU default: chatui's group-wise kernel
where it builds) and int4 weights (eager, and with the decode step compiled by ``torch.compile``
with inductor's C++ wrapper), each with
top-5 logprobs and without; llama.cpp on the Q4_1 GGUF with and without logprobs (when
llama-cpp-python is installed). Then quality (top-1 agreement with fp32 and perplexity on
``inference.quality.SAMPLE_TEXT``), 1,000-token prefill against transformers' forward, and the
time to first token of a follow-up turn as the conversation grows.

    .venv/bin/python benchmarks/bench_decode.py [--new-tokens 128] [--prompt-tokens 128]
        [--rounds 3] [--threads N] [--no-llamacpp] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inference.bench import hf_generate_speed, make_prompt, run_bench  # noqa: E402
from inference.checkpoint import load_checkpoint  # noqa: E402
from inference.engine import LocalBackend  # noqa: E402
from inference.settings import SamplingParams  # noqa: E402
from inference.types import GenerationRequest, Message, RowDone, Started  # noqa: E402

CONFIGS = {
    "chatui transformers runner fp32": dict(runner="hf"),
    "chatui fast fp32": dict(runner="fast", precision="model"),
    "chatui fast bf16": dict(runner="fast", quantize="none", precision="bfloat16"),
    "chatui fast int8 (default)": dict(runner="fast", quantize="int8", precision="auto"),
    "chatui fast int4": dict(runner="fast", quantize="int4", precision="auto"),
    "chatui fast int8 compiled": dict(runner="fast", quantize="int8", precision="auto",
                                      compile="on"),
    "chatui fast int4 compiled": dict(runner="fast", quantize="int4", precision="auto",
                                      compile="on"),
}


def followup_ttft(backend: LocalBackend, turns: int, k: int = 5) -> list[tuple[int, float]]:
    """A conversation grows turn by turn; returns (prompt tokens, ttft s) per turn."""
    messages: list[Message] = []
    out = []
    backend.reset()
    for i in range(turns):
        messages.append(Message("user", f"Question {i}: " + "tell me more about rivers. " * 8))
        req = GenerationRequest(tuple(messages), (SamplingParams(temperature=0,
                                                                 max_new_tokens=48),), k)
        ev = list(backend.generate(req, threading.Event()))
        started = next(e for e in ev if isinstance(e, Started))
        done = next(e for e in ev if isinstance(e, RowDone))
        out.append((started.prompt_tokens, done.usage.ttft_s))
        messages.append(Message("assistant", done.text))
    return out


@torch.inference_mode()
def prefill_speed(backend: LocalBackend, model, tokenizer, n: int = 1000) -> tuple[float, float]:
    """(chatui prefill tokens/s, transformers forward tokens/s) on the same n tokens."""
    ids = tokenizer.encode(("The history of printing is long and varied. " * (n // 8 + 2)))[:n]
    x = torch.tensor([ids])
    best_c = best_h = 0.0
    for _ in range(2):
        backend.reset()
        t = time.perf_counter()
        backend._prefill(ids, 0, threading.Event())
        best_c = max(best_c, n / (time.perf_counter() - t))
        t = time.perf_counter()
        model(x, logits_to_keep=1)
        best_h = max(best_h, n / (time.perf_counter() - t))
    backend.reset()
    return best_c, best_h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--skip-extras", action="store_true", help="decode speeds only")
    ap.add_argument("--threads", type=int, default=0, help="torch and llama.cpp threads "
                    "(default: torch's)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    ckpt = load_checkpoint(None, device="cpu", dtype="float32")
    backends = {name: LocalBackend.from_checkpoint(ckpt, **kw) for name, kw in CONFIGS.items()}
    llms = {}
    if not a.no_llamacpp:
        import bench_llamacpp as lc

        if lc.available():
            path = lc.default_gguf()
            llms = {"llama.cpp Q4_1": (lc.load(path, logits_all=False, threads=torch.get_num_threads()), None),
                    "llama.cpp Q4_1 top-5": (lc.load(path, logits_all=True, threads=torch.get_num_threads()), 5)}
    messages = make_prompt(ckpt.tokenizer, a.prompt_tokens)
    speeds: dict[str, list[float]] = {}

    def add(name: str, v: float) -> None:
        speeds.setdefault(name, []).append(v)
        print(f"  {name:45s} {v:7.1f} tokens/s", flush=True)

    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}, load {os.getloadavg()[0]:.2f}", flush=True)
        add("transformers generate fp32",
            hf_generate_speed(ckpt.model, ckpt.tokenizer, messages, a.new_tokens)[0])
        for name, b in backends.items():
            for k in (5, 0):
                res = run_bench(b, prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens,
                                top_logprobs=k)
                add(f"{name}{' top-5' if k else ' no top-k'}", res.decode_tokens_per_s)
        for name, (llm, lp) in llms.items():
            lc.decode_speed(llm, prompt_tokens=a.prompt_tokens, new_tokens=4, logprobs=lp)
            add(name, lc.decode_speed(llm, prompt_tokens=a.prompt_tokens,
                                      new_tokens=a.new_tokens, logprobs=lp)["decode_tokens_per_s"])

    report: dict = {"load_avg": os.getloadavg(), "threads": torch.get_num_threads(),
                    "decode_best": {k: max(v) for k, v in speeds.items()},
                    "decode_median": {k: statistics.median(v) for k, v in speeds.items()}}
    hf = report["decode_best"]["transformers generate fp32"]
    print("\nbest of rounds (tokens/s, x transformers generate fp32):")
    for k, v in report["decode_best"].items():
        print(f"  {k:45s} {v:7.1f}  {v / hf:5.2f}x")

    if not a.skip_extras:
        from inference import quality

        report["quality"] = {}
        for name, b in backends.items():
            if getattr(b.runner, "fast", None) is not None and "compiled" not in name:
                q = quality.measure(ckpt.model, ckpt.tokenizer, b.runner)
                report["quality"][name] = {"top1_agreement": q.top1_agreement,
                                           "perplexity": q.perplexity,
                                           "perplexity_increase": q.perplexity_increase,
                                           "tokens": q.tokens}
                print(f"quality {name:35s} top-1 {q.top1_agreement:.2%}  ppl {q.perplexity:.3f} "
                      f"({q.perplexity_increase:+.2%} vs fp32 {q.reference_perplexity:.3f})")
        for name in ("chatui fast bf16", "chatui fast int8 (default)", "chatui fast int4"):
            c, h = prefill_speed(backends[name], ckpt.model, ckpt.tokenizer)
            report.setdefault("prefill_1000", {})[name] = {"chatui": c, "transformers": h}
            print(f"prefill 1000 tokens {name}: {c:.0f} tokens/s, transformers forward fp32 "
                  f"{h:.0f} tokens/s")
            ttft = followup_ttft(backends[name], 8)
            report.setdefault("followup_ttft", {})[name] = ttft
            print(f"follow-up ttft {name}: " + ", ".join(f"{n} tok: {t * 1000:.0f} ms"
                                                         for n, t in ttft))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
