"""Where a batched decode step's time goes: a comparison's rows (``bench.compare_settings``,
top-5 logprobs, EOS ignored) decoded at 1, 4 and 8 rows, each step split into the decoder
layers (``decode_layers``), the output layer, the sampler and the Python that turns a step into
events (``LocalBackend._accept``), with the machine's read bandwidth before each round.

    nice .venv/bin/python benchmarks/bench_step_split.py [--rounds 4] [--new-tokens 128]
        [--rows 1,4,8] [--threads 2]

Prints one line per round and row count, in ms a step (medians are the reader's: the machine's
memory, shared with other machines' work, moves the single stream's step between ~2.4 and
~4.5 ms within minutes, and the ratios with it; issue 18's tenth and eleventh passes,
docs/batched-decode.md).
The ratio targets of issue 18 ask that 4 rows take at most ~1.25 and 8 rows ~1.6 single steps.
The timers wrap the engine's own functions for this process only; nothing else changes.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


from benchmarks.shapes import read_bandwidth  # noqa: E402
from benchmarks.step_args import default_engine, step_parser  # noqa: E402
from inference import bench  # noqa: E402
from inference import engine as engine_module  # noqa: E402
from inference.q8kernel import load_kernel  # noqa: E402
from inference.types import GenerationRequest  # noqa: E402


class Timers:
    """Seconds spent in each wrapped function since ``clear``, and the decode steps counted."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = {}
        self.steps = 0

    def clear(self) -> None:
        self.spent.clear()
        self.steps = 0

    def wrap(self, owner: object, name: str, key: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spent[key] = self.spent.get(key, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    def wrap_forward(self, runner: object) -> None:
        """The runner's forward, counted only for one-token steps (not the prefill)."""
        inner = runner.forward  # type: ignore[attr-defined]

        def timed(cache, ids, **kwargs):
            start = time.perf_counter()
            out = inner(cache, ids, **kwargs)
            if ids.shape[1] == 1:
                self.spent["forward"] = self.spent.get("forward", 0.0) + time.perf_counter() - start
                self.steps += 1
            return out

        runner.forward = timed  # type: ignore[attr-defined]


def main() -> None:
    parser = step_parser(__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    args = parser.parse_args()
    backend = default_engine(args.threads)
    backend.eos_ids = frozenset()
    fast = backend.runner.fast
    if fast is None:
        raise SystemExit("The fast runner is not in use here (no kernels): nothing to split.")
    gc.collect()
    gc.freeze()
    timers = Timers()
    timers.wrap(type(load_kernel()), "decode_layers", "layers")
    timers.wrap(fast, "_logits", "output layer")
    timers.wrap(engine_module, "decode_step_outputs", "sampler")
    timers.wrap(backend, "_accept", "events")
    timers.wrap_forward(backend.runner)
    messages = bench.make_prompt(backend.tokenizer, args.prompt_tokens)
    rows = [int(r) for r in args.rows.split(",")]
    for rnd in range(args.rounds):
        read, _ = read_bandwidth(1.0)
        print(f"round {rnd + 1}: read bandwidth {read:.0f} GB/s", flush=True)
        for n in rows:
            backend.reset()  # the prompt prefilled and one short request first, as compare does
            list(backend.generate(GenerationRequest(messages, bench.compare_settings(n, 2), 5),
                                  threading.Event()))
            timers.clear()
            start = time.perf_counter()
            list(backend.generate(GenerationRequest(
                messages, bench.compare_settings(n, args.new_tokens), 5), threading.Event()))
            total = time.perf_counter() - start
            s = timers.spent
            per = 1e3 / max(1, timers.steps)
            print(f"  {n} rows: {total * per:.2f} ms a step: layers {s['layers'] * per:.2f}, "
                  f"output layer {s['output layer'] * per:.2f}, sampler {s['sampler'] * per:.2f},"
                  f" events {s['events'] * per:.2f}, forward's own "
                  f"{(s['forward'] - s['layers'] - s['output layer']) * per:.2f}, the rest "
                  f"{(total - s['forward'] - s['sampler'] - s['events']) * per:.2f} (the "
                  "prompt's cached prefill and the decode loop)",
                  flush=True)


if __name__ == "__main__":
    main()
