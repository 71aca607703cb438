"""Batched decode against single streams, round-robin: ``chatui bench --compare`` and
``chatui bench --fan-out`` (issue 18) several times over in one process, medians reported.

On a shared CPU a spike of load hits one run; alternating the two benchmarks round by round and
taking the median (and the best) of each figure over the rounds keeps one spike from deciding
a ratio. Each round runs both benchmarks once: N = 1, 2, 4, 8 rows decoded as one batch against
the same rows as N single-row requests, top-5 logprobs on, EOS ignored; with ``--repeats R``
each side R times in the round, the best run of the batch and of each single row kept
(``chatui bench --repeats``). Why repeats (issue 18's twenty-eighth pass): on the 2-core Zen 4
the same 8-row request, rerun in one process, took 7.5-8.2 ms a step in some minutes and
9.5-10.3 in others, in streaks, with no change in the read bandwidth; a round's one batched
run (1.2 s) falls in one mode while its eight single runs (6 s) average over both, so a
round's 8-row ratio came out near 4.0x or near 5.3x. The best of two puts both sides in the
quick mode more often than either alone.

    nice .venv/bin/python benchmarks/bench_batch.py [--rounds 3] [--repeats 1] [--new-tokens 64]
        [--prompt-tokens 128] [--threads N] [--json out.json]
        [--ckpt PATH | --random-weights [--tokenizer DIR]] [--device cuda] [--dtype auto]

``--random-weights`` decodes a random-weight model of the default model's exact shape
(``benchmarks/shapes.py``'s ``smollm2-135m``) with its tokenizer (or ``--tokenizer DIR``'s),
saved in a temporary folder: speed does not depend on the values, and it runs where the
default model's package is not installed (the GPU figures in the README were measured so).

Prints, per benchmark and N, the median and best over the rounds of the speedup (aggregate
tokens/s batched / sequential, prefill included), of the batched aggregate decode tokens/s and
of the single stream's decode tokens/s, the median of each round's ratio of those two decode
rates (the prefill left out), with the load average and the machine's read bandwidth before
and after. The bandwidth is there because it decides the ratios on a shared CPU: a single
stream's step reads every weight once and runs at the memory's pace, a batched step's
multiply-adds much less so; on this project's 2-core machine the memory other machines left
it went from about 85 GB/s to 50 within minutes (a sum of 106 MB in 1.2 ms, then 2.2), the
single stream from about 410 tok/s to 260 and the ratios with it (issue 18's tenth pass,
docs/batched-decode.md).

``--cpu-clock`` times with the process's CPU time instead of the wall clock, on one thread:
on a CPU shared with other jobs (a load of 6 on 2 cores), two OpenMP threads wait at every
barrier for whichever of them was preempted and the wall clock measures the neighbours; one
thread's CPU time measures the work (memory and cache are still shared).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inference import bench  # noqa: E402
from inference.checkpoint import load_checkpoint  # noqa: E402
from inference.engine import LocalBackend  # noqa: E402
from inference.runner import describe  # noqa: E402
from inference.worker.heap import settle_heap  # noqa: E402

from benchmarks.shapes import read_bandwidth  # noqa: E402


def random_checkpoint(out: Path, tokenizer_dir: Path | None) -> Path:
    """The default model's shape with random weights (bf16, normal init of transformers) and
    a tokenizer, saved as a checkpoint folder in ``out``."""
    from transformers import AutoTokenizer, GenerationConfig, LlamaForCausalLM

    from benchmarks.shapes import SHAPES
    from inference.checkpoint import default_model_path

    tok = AutoTokenizer.from_pretrained(tokenizer_dir or default_model_path())
    cfg = next(s for s in SHAPES if s.name == "smollm2-135m").config()
    cfg.bos_token_id, cfg.eos_token_id = tok.bos_token_id, tok.eos_token_id
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(eos_token_id=tok.eos_token_id).save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each side in a round, the best kept (chatui bench --repeats)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--cpu-clock", action="store_true")
    ap.add_argument("--ckpt", help="a checkpoint (default: the default model)")
    ap.add_argument("--random-weights", action="store_true",
                    help="a random-weight model of the default model's shape")
    ap.add_argument("--tokenizer", type=Path, help="with --random-weights (default: the "
                                                   "default model's)")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    ap.add_argument("--dtype", default=None,
                    help="float32 on a CPU by default, the engine's choice (auto) elsewhere")
    ap.add_argument("--only", choices=("compare", "fan-out"),
                    help="one benchmark (compare alone also runs on code from before fan-out)")
    args = ap.parse_args()
    if args.cpu_clock:
        args.threads = 1
        time.perf_counter = time.process_time  # what inference.bench and the engine read
    if args.threads:
        torch.set_num_threads(args.threads)
    # the same threads throughout, as the peers get (the engine's tuner, inference/threads.py,
    # would time a few steps with half of them at the first reply)
    os.environ.setdefault("CHATUI_THREADS", str(torch.get_num_threads()))
    load0, bw0 = os.getloadavg(), read_bandwidth(1.0)[0]
    dtype = args.dtype or ("float32" if args.device == "cpu" else "auto")
    if args.random_weights:
        tmp = Path(tempfile.mkdtemp(prefix="chatui-batch-"))
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        args.ckpt = str(random_checkpoint(tmp, args.tokenizer))
    t0 = time.perf_counter()
    ckpt = load_checkpoint(args.ckpt, device=args.device, dtype=dtype)
    backend = LocalBackend.from_checkpoint(ckpt, quantize="auto", precision="auto")
    print(f"loaded in {time.perf_counter() - t0:.1f} s ({describe(backend.runner)})", flush=True)
    # As the engine's process (and a headless command's) does after its load; unsettled, a
    # full collection ran inside a timed run now and then: 184 ms (the ~365,000 objects the
    # model and tokenizer leave alive), 3 ms a step of a 64-step 8-row run, in one run and
    # not in the other. Settled, a pass walks only what the runs make.
    settle_heap()
    names = [args.only] if args.only else ["compare", "fan-out"]
    runs: dict[str, list] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names:
            fn = bench.run_compare_bench if name == "compare" else bench.run_fan_out_bench
            result = fn(backend, ns=(1, 2, 4, 8), prompt_tokens=args.prompt_tokens,
                        new_tokens=args.new_tokens, repeats=args.repeats)
            runs[name].append(result.to_dict())
            print(f"round {r + 1} {name}: " + ", ".join(
                f"N={row.n} {row.speedup:.2f}x" for row in result.rows), flush=True)
    load1, bw1 = os.getloadavg(), read_bandwidth(1.0)[0]
    clock = "CPU time" if args.cpu_clock else "wall clock"
    where = (torch.cuda.get_device_name(ckpt.device) if ckpt.device.type == "cuda"
             else f"{torch.get_num_threads()} threads")
    print(f"\nmodel {ckpt.name}, {backend.info.dtype} {backend.info.quantization}, {where} "
          f"({clock}), "
          f"{args.rounds} rounds of best of {args.repeats}, {args.new_tokens} new tokens, "
          f"top-5 logprobs; load average "
          f"{load0[0]:.1f} before, {load1[0]:.1f} after; read bandwidth {bw0:.0f} GB/s before, "
          f"{bw1:.0f} after")
    summary: dict[str, dict] = {}
    for name, results in runs.items():
        print(f"{name}:  N  speedup median (best)   batched decode tok/s median   "
              f"single-stream decode tok/s median   decode rates' ratio median")
        for i, row in enumerate(results[0]["rows"]):
            n = row["n"]
            sp = [res["rows"][i]["speedup"] for res in results]
            bd = [res["rows"][i]["batched_decode_tokens_per_s"] for res in results]
            sd = [res["rows"][i]["sequential_decode_tokens_per_s"] for res in results]
            ratio = [b / s for b, s in zip(bd, sd)]  # (each round's own: the prefill left out)
            summary.setdefault(name, {})[n] = dict(
                speedup_median=statistics.median(sp), speedup_best=max(sp),
                batched_decode_median=statistics.median(bd),
                single_decode_median=statistics.median(sd),
                decode_ratio_median=statistics.median(ratio))
            print(f"          {n}  {statistics.median(sp):5.2f}x ({max(sp):.2f}x)"
                  f"          {statistics.median(bd):7.1f}"
                  f"                        {statistics.median(sd):7.1f}"
                  f"                          {statistics.median(ratio):5.2f}x")
    if args.json:
        args.json.write_text(json.dumps(dict(runs=runs, summary=summary, load=[load0, load1],
                                             read_bandwidth_gb_s=[bw0, bw1])))


if __name__ == "__main__":
    main()
