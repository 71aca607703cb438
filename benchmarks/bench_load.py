"""Start-up cost of a checkpoint as the app loads it: peak resident memory and time of the first
start (nothing cached: the GGUF's metadata converted, the weights read and quantized, the
quantized weights saved, then read back into huge pages) and of a later start (the quantized
weights read from the disk cache into huge pages, ``inference/hugepages.py``).

    python benchmarks/make_checkpoints.py --out /tmp/ckpts
    python benchmarks/bench_load.py /tmp/ckpts/llama-3.2-1b-random.Q8_0.gguf \\
        /tmp/ckpts/llama-3.2-1b-random.Q4_K_M.gguf [--quantize int8 int4]

Each start is a fresh process (``--child``), so its peak resident set (``ru_maxrss``) is its
own; both starts of a file share one fresh cache directory. "load" is ``load_checkpoint(lazy)``
plus ``build_runner`` (what the app does before its first token); "python+imports" is the
interpreter, torch and transformers, paid by any start; "first token" is a 4-token prompt's
forward, which reads every weight once. The page
cache is warm for the later start (its file was just written). "weights" is what the runner
holds: every quantized tensor plus the norms it keeps in full precision.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(spec: str, quantize: str) -> dict[str, float]:
    """One start, measured from inside the process."""
    t0 = time.perf_counter()
    sys.path.insert(0, str(ROOT))
    import torch

    from inference.checkpoint import load_checkpoint
    from inference.runner import build_runner

    import transformers.models.llama.modeling_llama  # noqa: F401 - any llama start imports it

    t_import = time.perf_counter() - t0
    rss_import = _rss_mb()
    t1 = time.perf_counter()
    ckpt = load_checkpoint(spec, device="cpu", lazy=True)
    t_ckpt = time.perf_counter() - t1
    runner = build_runner(ckpt, quantize=quantize, precision="auto")
    t_load = time.perf_counter() - t1
    t2 = time.perf_counter()
    runner.forward(runner.new_cache(), torch.tensor([[1, 2, 3, 4]]))
    t_token = time.perf_counter() - t2
    held = sum(t.numel() * t.element_size() for w in runner.fast.quantized.values()
               for t in vars(w).values() if isinstance(t, torch.Tensor))
    small = sum(p.numel() * p.element_size() for p in ckpt.model.parameters() if not p.is_meta)
    return {"import_s": t_import, "rss_import_mb": rss_import, "checkpoint_s": t_ckpt,
            "load_s": t_load, "first_token_s": t_token,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "final_rss_mb": _rss_mb(), "weights_mb": (held + small) / 2**20}


def shared_kernels() -> Path:
    """chatui's C kernels built once for every start (a first start with a fresh cache would
    otherwise count their compilation, which a user pays once per machine, not per model)."""
    root = Path(tempfile.gettempdir()) / "chatui-bench-load-kernels"
    subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                    "from inference import q8kernel; q8kernel.load_kernel()", str(ROOT)],
                   env=dict(os.environ, CHATUI_CACHE_DIR=str(root)), check=True)
    return root / "kernels"


def run_start(spec: Path, quantize: str, cache: Path) -> dict[str, float]:
    env = dict(os.environ, CHATUI_CACHE_DIR=str(cache))
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", str(spec), "--quantize", quantize],
                         env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise SystemExit(f"{spec} {quantize} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ckpts", nargs="*", type=Path)
    ap.add_argument("--quantize", nargs="+", default=["int8"])
    ap.add_argument("--child", default=None)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.quantize[0])))
        return
    kernels = shared_kernels()
    print(f"{'checkpoint':38} {'quant':5} {'start':6} {'imports s':>9} {'load s':>7} "
          f"{'1st tok s':>9} {'wall s':>7} {'peak RSS MB':>11} {'weights MB':>10} "
          f"{'imports MB':>10} {'peak - weights':>14}")
    for spec in args.ckpts:
        for quantize in args.quantize:
            cache = Path(tempfile.mkdtemp(prefix="chatui-bench-load-"))
            (cache / "kernels").symlink_to(kernels)
            try:
                for start in ("first", "cached"):
                    r = run_start(spec, quantize, cache)
                    print(f"{spec.name[:38]:38} {quantize:5} {start:6} {r['import_s']:9.2f} "
                          f"{r['load_s']:7.2f} {r['first_token_s']:9.2f} {r['wall_s']:7.2f} "
                          f"{r['peak_rss_mb']:11.0f} {r['weights_mb']:10.0f} "
                          f"{r['rss_import_mb']:10.0f} "
                          f"{r['peak_rss_mb'] - r['weights_mb']:14.0f}", flush=True)
            finally:
                shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
