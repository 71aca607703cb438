"""int4's output layer, 6-bit (``Q6Weight``, ``q6.c``) against int8 (``Q8Weight``, as before),
A/B in one process (issue 16).

Loads a shape built by ``benchmarks/shapes.py`` (``bench_decode.py --shapes`` builds them) with
chatui's fast runner in int4, and a twin that shares its decoder but holds the output layer
(and a tied embedding) in int8, as int4 did before. Prefills a prompt in each, then times
round-robin decode steps (the logits' log-softmax and top-5 included, as the engine's
logprobs) and the output layer on its own. Prints the median over the rounds, per step, and
the bytes each reads per token.

    nice .venv/bin/python benchmarks/bench_int4_head.py [--shapes-dir /tmp/speed16/shapes]
        [--shape llama3.2-1b] [--rounds 7] [--steps 10] [--threads 1]

With one thread (the default) it times the process's CPU time (see ``bench_moe_step.py``).
Quantized weights are cached in ``$CHATUI_CACHE_DIR`` (default: ``<shapes-dir>/cache``).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inference.checkpoint import load_checkpoint  # noqa: E402
from inference.engine import LocalBackend  # noqa: E402
from inference.quant import Q6Weight, Q8Weight  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes-dir", type=Path, default=Path("/tmp/speed16/shapes"))
    ap.add_argument("--shape", default="llama3.2-1b")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    os.environ.setdefault("CHATUI_CACHE_DIR", str(a.shapes_dir / "cache"))
    torch.set_num_threads(a.threads)
    clock = time.process_time if a.threads == 1 else time.perf_counter
    ckpt = load_checkpoint(str(a.shapes_dir / a.shape / "hf"), device="cpu", dtype="float32")
    six = LocalBackend.from_checkpoint(ckpt, runner="fast", quantize="int4",
                                       precision="auto").runner.fast
    if not isinstance(six.lm_head, Q6Weight):
        sys.exit(f"{a.shape}: int4's output layer is {type(six.lm_head).__name__} here, not "
                 "6-bit; nothing to compare")
    eight = copy.copy(six)
    eight.lm_head = Q8Weight.quantize(ckpt.model.lm_head.weight.detach())
    if six.tied:
        eight.embed = eight.lm_head
    fasts = {"6-bit output layer": six, "int8 output layer": eight}
    tok = torch.tensor([[500]])
    caches = {}
    for name, fast in fasts.items():
        caches[name] = fast.new_cache()
        fast.forward(caches[name], torch.randint(300, 1000, (1, 64)))

    def steps(fast, cache) -> float:
        t = clock()
        for _ in range(a.steps):
            logits = fast.forward(cache, tok)
            torch.log_softmax(logits, dim=-1).topk(5)
        return 1000 * (clock() - t) / a.steps

    def head(fast) -> float:
        x = torch.randn(1, fast.hidden)
        t = clock()
        for _ in range(a.steps):
            fast._logits(x)
        return 1000 * (clock() - t) / a.steps

    times: dict[tuple[str, str], list[float]] = {}
    print(f"{a.shape}: load average {os.getloadavg()}, threads {a.threads}, "
          f"{'CPU time' if a.threads == 1 else 'wall clock'}", flush=True)
    for _ in range(a.rounds):
        for name, fast in fasts.items():
            times.setdefault((name, "step"), []).append(steps(fast, caches[name]))
            times.setdefault((name, "head"), []).append(head(fast))
    print(f"load average at the end {os.getloadavg()}; median of {a.rounds} rounds x "
          f"{a.steps} steps, ms per decode step:")
    base = statistics.median(times["int8 output layer", "step"])
    for name, fast in fasts.items():
        step, lm = (statistics.median(times[name, k]) for k in ("step", "head"))
        print(f"  {a.shape} int4, {name} ({fast.weight_bytes() / 1e6:.0f} MB read per token, "
              f"output layer {fast.lm_head.nbytes / 1e6:.0f} MB): step {step:.2f} "
              f"({base / step:.2f}x), of which the output layer {lm:.2f}", flush=True)


if __name__ == "__main__":
    main()
