"""Where the decoder layers' time goes in a batched decode step: a build of chatui's kernels with
a clock around each phase of ``decode_layers`` (the QKV projection, the attention, the output
projection, the gate/up projection, the down projection), run at a comparison's state (a
138-token shared prompt and 64 own tokens a row) at 1, 4 and 8 rows, medians of interleaved
rounds in one process.

    nice .venv/bin/python benchmarks/bench_layer_phases.py [--rounds 4] [--rows 1,4,8]
        [--threads 2]

The timed build is the engine's own sources, compiled as the engine compiles them, with five
clock reads added per layer (``clock_gettime``, ~20 ns each: 0.003 ms a step); it fails loudly
where ``decode.c`` no longer has the lines it times. Issue 18's twelfth pass
(docs/batched-decode.md) used it: the rows a comparison adds cost matmul arithmetic in the
machine's quick memory periods and attention in all of them.
"""

from __future__ import annotations

import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


from benchmarks.shapes import read_bandwidth  # noqa: E402
from benchmarks.step_args import comparison_state, default_engine, step_parser  # noqa: E402
from inference import q8kernel  # noqa: E402

PHASES = ("QKV projection", "attention", "output projection", "gate/up projection",
          "down projection")

CLOCK = """#include <time.h>
static double chatui_phase[5];
static double chatui_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
double phase_time(int i) { double v = chatui_phase[i]; chatui_phase[i] = 0; return v; }
"""

# (the line in decode.c, what goes before it): a clock read before and after each phase
TIMERS = (
    ('#include "rowprep.h"\n', None),
    ("        qmm(L, x, B, hidden, L->wqkv,", "        double t0 = chatui_now();\n"),
    ("        attn_decode(qkv,", "        double t1 = chatui_now(); chatui_phase[0] += t1 - t0;\n"),
    ("        qmm(L, o, B, H * D,", "        double t2 = chatui_now(); chatui_phase[1] += t2 - t1;\n"),
    ("        add_bias(t, L->bo, B, hidden);",
     "        double t3 = chatui_now(); chatui_phase[2] += t3 - t2;\n"),
    ("        qmm(L, x, B, hidden, L->wgu,", "        double t4 = chatui_now();\n"),
    ("        add_bias(gu, L->bgu, B, 2 * inter);",
     "        double t5 = chatui_now(); chatui_phase[3] += t5 - t4;\n"),
    ("        add_bias(t, L->bd, B, hidden);",
     "        double t6 = chatui_now(); chatui_phase[4] += t6 - t5;\n"),
)


def timed_library(folder: Path) -> q8kernel.Q8Kernel:
    """The engine's kernels with decode.c's phases clocked, built into ``folder``."""
    plan = q8kernel.plan_build()
    sources = []
    for src in (*q8kernel.SOURCES, *q8kernel.HEADERS):
        text = src.read_text()
        if src.name == "decode.c":
            for line, before in TIMERS:
                if text.count(line) != 1:
                    raise SystemExit(f"decode.c no longer has {line.strip()!r} once: update "
                                     "this benchmark's TIMERS")
                text = text.replace(line, line + CLOCK if before is None else before + line)
        (folder / src.name).write_text(text)
        if src in q8kernel.SOURCES:
            sources.append(folder / src.name)
    lib = folder / "timed.so"
    q8kernel.compile_library(plan.cc, lib, plan.openmp, defines=plan.defines,
                             sources=tuple(sources))
    kernel = q8kernel.open_library(lib, plan.openmp)
    kernel.lib.phase_time.restype = ctypes.c_double
    kernel.lib.phase_time.argtypes = [ctypes.c_int]
    return kernel


def main() -> None:
    args = step_parser(__doc__.splitlines()[0]).parse_args()
    backend = default_engine(args.threads)
    fast = backend.runner.fast
    if fast is None or q8kernel.load_kernel() is None:
        raise SystemExit("The fast runner's C kernels are not in use here: nothing to time.")
    layers = fast._c_layers()
    rows = [int(r) for r in args.rows.split(",")]
    # a comparison's state: the prompt shared, then 64 tokens of each row's own
    states = {n: comparison_state(fast, n) for n in rows}
    with tempfile.TemporaryDirectory() as tmp:
        kernel = timed_library(Path(tmp))
        spent: dict[int, list[list[float]]] = {n: [] for n in rows}
        for rnd in range(args.rounds):
            read, _ = read_bandwidth(0.5)
            print(f"round {rnd + 1}: read bandwidth {read:.0f} GB/s", flush=True)
            for n in rows:
                samples = []
                for _ in range(25):
                    for i in range(len(PHASES)):
                        kernel.lib.phase_time(i)
                    start = time.perf_counter()
                    states[n].decode_layers(kernel, fast, layers)
                    total = time.perf_counter() - start
                    samples.append([total] + [kernel.lib.phase_time(i) for i in range(len(PHASES))])
                spent[n].append([statistics.median(s[j] for s in samples) * 1e3
                                 for j in range(len(PHASES) + 1)])
    print(f"\nmedians of {args.rounds} rounds, ms a step ({args.threads} threads):")
    print(f"  rows  layers  {'  '.join(PHASES)}  (matmuls)")
    for n in rows:
        med = [statistics.median(r[j] for r in spent[n]) for j in range(len(PHASES) + 1)]
        matmuls = med[1] + sum(med[3:])
        print(f"  {n:>4}  {med[0]:6.2f}  " + "  ".join(
            f"{v:>{len(name)}.3f}" for v, name in zip(med[1:], PHASES)) + f"  ({matmuls:.2f})")


if __name__ == "__main__":
    main()
