"""The int8 kernel's two ways of fetching the weights it streams (``q8.c``'s AHEAD: into L2,
the default, or non-temporal, ``CHATUI_WEIGHT_FETCH=nontemporal``), as whole decode steps of
the default model, both builds alternately in one process.

    nice .venv/bin/python benchmarks/bench_weight_fetch.py [--rounds 6] [--rows 1,4,8]
        [--new-tokens 128] [--threads 2] [--file-pages]

Both libraries are built as the engine builds them (``q8kernel.plan_build`` with each
override); the engine's kernel then runs on one and the other in turn (the same functions, so
the same bits: ``tests/test_quant.py``), request by request, the order alternating round by
round. Each request is a comparison's rows (``bench.compare_settings``, top-5 logprobs, EOS
ignored) after the prompt's prefill and a short request of as many rows, as
``bench_step_split.py`` runs them. ``--file-pages`` also runs each build on the weights mapped
from the disk cache's file (4 KB pages) besides the copy in huge pages a chat runs on
(``inference/hugepages.py``). Prints the medians, ms a step, and each variant's ratios (N rows'
aggregate tokens/s over one row's). Issue 18's twenty-eighth pass (docs/batched-decode.md) made
the fetch into L2 the default on AMD with it.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks.step_args import (  # noqa: E402
    alternating_rounds, comparison_step_ms, default_engine, step_parser)
from inference import bench, q8kernel  # noqa: E402
from inference.quant import load_int8  # noqa: E402

FETCHES = ("l2", "nontemporal")


def build(fetch: str):
    """The kernel library built with ``fetch`` (``CHATUI_WEIGHT_FETCH``'s values), opened."""
    plan = q8kernel.plan_build(fetch)
    if not plan.path.is_file():
        q8kernel.compile_library(plan.cc, plan.path, plan.openmp, defines=plan.defines)
    return q8kernel.open_library(plan.path, plan.openmp).lib


def main() -> None:
    parser = step_parser(__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--file-pages", action="store_true")
    parser.set_defaults(rounds=6)
    args = parser.parse_args()
    kernel = q8kernel.load_kernel()
    if kernel is None or kernel.isa != "avx512-vnni":
        raise SystemExit("The fetches are those of the AVX-512 VNNI kernel, not in use here.")
    libs = {fetch: build(fetch) for fetch in FETCHES}
    backend = default_engine(args.threads)
    backend.eos_ids = frozenset()
    fast = backend.runner.fast
    copies = {"huge pages": None}
    if args.file_pages:
        path = backend.runner.int8_path
        copies = {"huge pages": load_int8(path, backend.device, resident=True),
                  "file pages": load_int8(path, backend.device)}
    variants = [(fetch, pages) for fetch in FETCHES for pages in copies]

    def use(variant: tuple[str, str]) -> None:
        # the engine's one kernel object (load_kernel is cached) runs on this build now
        object.__setattr__(kernel, "lib", libs[variant[0]])
        if copies[variant[1]] is not None:
            fast.adopt(copies[variant[1]])

    messages = bench.make_prompt(backend.tokenizer, 128)

    rows = [int(r) for r in args.rows.split(",")]
    gc.collect()
    gc.freeze()
    for variant in variants:  # (each build's first steps: untimed)
        use(variant)
        comparison_step_ms(backend, messages, max(rows), args.new_tokens)
    spent = alternating_rounds(backend, messages, rows, variants, use,
                               lambda v: f"{v[0]} {v[1]}", args.rounds, args.new_tokens)
    print(f"medians of {args.rounds} rounds, ms a step:")
    for variant in variants:
        med = {n: statistics.median(spent[(variant, n)]) for n in rows}
        ratios = (", ".join(f"{n} rows {n * med[1] / med[n]:.2f}x" for n in rows if n > 1)
                  if 1 in med else "")
        print(f"  {variant[0]:>11}, {variant[1]}: "
              + " / ".join(f"{med[n]:.2f}" for n in rows) + (f"  ({ratios})" if ratios else ""))


if __name__ == "__main__":
    main()
