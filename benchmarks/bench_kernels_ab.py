"""Two builds of chatui's C kernels side by side: a git revision's and the working tree's, each
timed in turn in one process (the machine's memory, shared with other machines' work, moves a
step by 10-20% within minutes: only figures measured alternately compare).

    nice .venv/bin/python benchmarks/bench_kernels_ab.py --base REV [--rows 1,4,8]
        [--seconds 10] [--threads 2] [--flush-mb 40]

Two measurements, medians over the rounds:
- attention: ``attn_decode`` over 30 layers' fp16 caches at a comparison's state (138 shared
  and 64 own keys a row, the default model's 9 query and 3 KV heads of 64), hot, called from a
  small C driver built here (a Python call a layer would add ~5-10 us to each 10-40 us call);
- decode layers: ``decode_layers`` of the default model (int8) at that state, called from
  Python as the engine calls it, each call after a read of ``--flush-mb`` MB (40 by default)
  that stands for what a real step reads between two visits of the layers (the output layer's
  28 MB, the logits, the sampler). Called back to back (``--flush-mb 0``), the layers' 106 MB
  partly stay in the ~100 MB of L3 this machine keeps for a process and the figures are the
  layers' at their quickest: 1 / 8 rows 2.94 / 6.07 ms there, 3.68 / 7.11 ms after 40 MB,
  against 3.46-3.76 / 6.84-7.16 ms inside real steps (``bench_step_split.py``); after 200 MB
  (every weight from memory) 5.70 / 8.82 ms (issue 18's seventeenth pass,
  docs/batched-decode.md).

Issue 18's fifteenth pass (docs/batched-decode.md) measured its attention and int8 epilogue
changes so: ``--base 8c1be37 --flush-mb 0``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


import torch  # noqa: E402

from benchmarks.step_args import comparison_state, default_engine, step_parser  # noqa: E402
from inference import q8kernel  # noqa: E402

DRIVER = r"""
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef void (*attn_t)(const float *, int, int, int, int, void *, void *, int, int,
                       const int64_t *, const float *, const float *, const uint8_t *, int,
                       float *, int, int);
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
/* argv: rows seconds threads lib_a lib_b; prints "ms_a ms_b rounds" */
int main(int argc, char **argv) {
    if (argc != 6) return 2;
    int B = atoi(argv[1]), threads = atoi(argv[3]);
    double seconds = atof(argv[2]);
    attn_t f[2];
    for (int i = 0; i < 2; i++) {
        void *h = dlopen(argv[4 + i], RTLD_NOW | RTLD_LOCAL);
        if (!h || !(f[i] = (attn_t)dlsym(h, "attn_decode"))) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    }
    enum { L = 30, H = 9, KV = 3, D = 64, C = 512, SHARED = 138, W = 138 + 64, MAXR = 4096 };
    float *cs = malloc(sizeof(float) * C * D / 2), *sn = malloc(sizeof(float) * C * D / 2);
    for (int i = 0; i < C * D / 2; i++) { cs[i] = cosf(i * 0.01f); sn[i] = sinf(i * 0.01f); }
    uint16_t *kc[L], *vc[L];
    size_t n = (size_t)B * KV * C * D;
    for (int l = 0; l < L; l++) {
        kc[l] = malloc(2 * n); vc[l] = malloc(2 * n);
        for (size_t i = 0; i < n; i++) {  /* fp16 values in [0.125, 0.5) */
            kc[l][i] = (uint16_t)(0x3000 + (i * 13 + l) % 0x800);
            vc[l][i] = (uint16_t)(0x3000 + (i * 7 + l) % 0x800);
        }
    }
    float *qkv = malloc(sizeof(float) * B * (H + 2 * KV) * D), *out = malloc(sizeof(float) * B * H * D);
    for (int i = 0; i < B * (H + 2 * KV) * D; i++) qkv[i] = sinf(i * 0.3f);
    int64_t pos[64];
    for (int b = 0; b < 64; b++) pos[b] = W;
    static double t[2][MAXR];
    int rounds = 0;
    double end = now() + seconds;
    while (now() < end && rounds < MAXR) {
        for (int v = 0; v < 2; v++) {
            double best = 1e9;
            for (int k = 0; k < 5; k++) {
                double t0 = now();
                for (int l = 0; l < L; l++)
                    f[v](qkv, B, H, KV, D, kc[l], vc[l], C, W, pos, cs, sn, NULL,
                         B > 1 ? SHARED : 0, out, threads, 1);
                double dt = now() - t0;
                best = dt < best ? dt : best;
            }
            t[v][rounds] = best;
        }
        rounds++;
    }
    for (int v = 0; v < 2; v++) qsort(t[v], rounds, sizeof(double), by_value);
    printf("%.4f %.4f %d\n", t[0][rounds / 2] * 1e3, t[1][rounds / 2] * 1e3, rounds);
    return 0;
}
"""


def kernels_at(rev: str, folder: Path) -> Path:
    """``inference/kernels`` of git revision ``rev``, unpacked into ``folder``."""
    blob = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "inference/kernels"],
                          check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(folder, filter="data")
    return folder / "inference" / "kernels"


def build(src: Path, out: Path) -> Path:
    """The kernels in ``src`` compiled as the engine compiles them, into ``out``."""
    plan = q8kernel.plan_build()
    q8kernel.compile_library(plan.cc, out, plan.openmp, defines=plan.defines,
                             sources=tuple(sorted(src.glob("*.c"))))
    return out


def attention(libs: list[Path], rows: list[int], seconds: float, threads: int,
              tmp: Path) -> None:
    plan = q8kernel.plan_build()
    driver = tmp / "attn_ab"
    (tmp / "attn_ab.c").write_text(DRIVER)
    subprocess.run([plan.cc, "-O2", str(tmp / "attn_ab.c"), "-o", str(driver), "-ldl", "-lm"],
                   check=True)
    print("attention, 30 layers, hot (ms; medians of interleaved rounds):")
    for n in rows:
        a, b, rounds = subprocess.run([str(driver), str(n), str(seconds), str(threads),
                                       *map(str, libs)], check=True, capture_output=True,
                                      text=True).stdout.split()
        print(f"  {n} rows: base {float(a):.3f}  working tree {float(b):.3f}  ({rounds} rounds)")


def decode_layers(libs: list[Path], rows: list[int], seconds: float, threads: int,
                  flush_mb: int) -> None:
    plan = q8kernel.plan_build()
    kernels = [q8kernel.open_library(lib, plan.openmp) for lib in libs]
    backend = default_engine(threads)
    fast = backend.runner.fast
    layers = fast._c_layers()
    flush = torch.ones(flush_mb * 2**20 // 4) if flush_mb > 0 else None
    print(f"decode layers, the default model int8, each call after reading {flush_mb} MB "
          "(ms; medians):")
    for n in rows:
        state = comparison_state(fast, n)
        spent: list[list[float]] = [[] for _ in kernels]
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for i, kernel in enumerate(kernels):
                samples = []
                for _ in range(20):
                    if flush is not None:
                        flush.sum()
                    start = time.perf_counter()
                    state.decode_layers(kernel, fast, layers)
                    samples.append(time.perf_counter() - start)
                spent[i].append(statistics.median(samples) * 1e3)
        print(f"  {n} rows: base {statistics.median(spent[0]):.3f}  working tree "
              f"{statistics.median(spent[1]):.3f}  ({len(spent[0])} rounds)", flush=True)


def main() -> None:
    parser = step_parser(__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--seconds", type=float, default=10.0, help="per row count and part")
    parser.add_argument("--flush-mb", type=int, default=40,
                        help="MB read before each decode_layers call (0: back to back)")
    args = parser.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        libs = [build(kernels_at(args.base, tmp / "base"), tmp / "base.so"),
                build(q8kernel.KERNELS, tmp / "tree.so")]
        attention(libs, rows, args.seconds, args.threads, tmp)
        decode_layers(libs, rows, args.seconds, args.threads, args.flush_mb)


if __name__ == "__main__":
    main()
