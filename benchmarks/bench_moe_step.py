"""Where a decode step of a mixture-of-experts shape goes, and what ``decode.c``'s one call
for every layer saves over the per-layer Python loop, A/B in one process (issue 15).

Loads a shape built by ``benchmarks/shapes.py`` (``bench_decode.py --shapes`` builds them) with
chatui's fast runner in int8 and int4, prefills a prompt, then times decode steps (the logits'
log-softmax and top-5 included, as the engine's logprobs) round-robin: each quantization with
its layers in ``decode.c``'s one C call and with the per-layer Python loop (the path these
models took before; the same kernels and weights), and the output layer on its own. Prints the
median over the rounds of each, per step.

    nice .venv/bin/python benchmarks/bench_moe_step.py [--shapes-dir /tmp/speed16/shapes]
        [--shape qwen3-moe-small] [--rounds 7] [--steps 10] [--threads 1]

With one thread (the default) it times the process's CPU time: on a CPU shared with other
jobs two OpenMP threads wait at every barrier for whichever was preempted, and the wall clock
measures the neighbours (memory bandwidth is still shared, so compare only within a run).
Quantized weights are cached in ``$CHATUI_CACHE_DIR`` (default: ``<shapes-dir>/cache``).
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes-dir", type=Path, default=Path("/tmp/speed16/shapes"))
    ap.add_argument("--shape", default="qwen3-moe-small")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quantize", default="int4,int8")
    a = ap.parse_args()
    os.environ.setdefault("CHATUI_CACHE_DIR", str(a.shapes_dir / "cache"))
    torch.set_num_threads(a.threads)
    clock = time.process_time if a.threads == 1 else time.perf_counter
    ckpt = load_checkpoint(str(a.shapes_dir / a.shape / "hf"), device="cpu", dtype="float32")
    fasts = {q: LocalBackend.from_checkpoint(ckpt, runner="fast", quantize=q,
                                             precision="auto").runner.fast
             for q in a.quantize.split(",")}
    tok = torch.tensor([[500]])
    caches = {}
    for q, fast in fasts.items():
        if fast._c_layers() is None:
            print(f"{q}: the layers do not run in decode.c here; nothing to compare")
        for c_step in (True, False):
            caches[q, c_step] = fast.new_cache()
            fast.forward(caches[q, c_step], torch.randint(300, 1000, (1, 64)))

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
    print(f"load average {os.getloadavg()}, threads {a.threads}, "
          f"{'CPU time' if a.threads == 1 else 'wall clock'}")
    for _ in range(a.rounds):
        for q, fast in fasts.items():
            times.setdefault((q, "C step"), []).append(steps(fast, caches[q, True]))
            fast._c_layers = lambda: None  # the per-layer Python loop
            try:
                times.setdefault((q, "Python loop"), []).append(steps(fast, caches[q, False]))
            finally:
                del fast._c_layers
            times.setdefault((q, "output layer"), []).append(head(fast))
    print(f"load average at the end {os.getloadavg()}; median of {a.rounds} rounds x "
          f"{a.steps} steps, ms per decode step:")
    for q, fast in fasts.items():
        c, py, lm = (statistics.median(times[q, k])
                     for k in ("C step", "Python loop", "output layer"))
        print(f"  {a.shape} {q} ({fast.weight_bytes() / 1e6:.0f} MB read per token): "
              f"C step {c:.2f}, Python loop {py:.2f} ({py / c:.2f}x), of which the output "
              f"layer {lm:.2f}")


if __name__ == "__main__":
    main()
