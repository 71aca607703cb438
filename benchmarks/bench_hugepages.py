"""Decode steps on the weights in huge pages against the same weights on the disk cache's 4 KB
file pages (``inference/hugepages.py``), alternately in one process.

    nice .venv/bin/python benchmarks/bench_hugepages.py [--rounds 10] [--rows 1,4,8]
        [--new-tokens 128] [--threads 2] [--ckpt PATH] [--quantize int8|int4]

The default model (or ``--ckpt``) with int8 weights (or ``--quantize``'s), as ``chatui`` runs
it: its cached weights loaded twice,
once mapped from the file (``st_io.load_mapped``, what every start did before) and once read
into huge pages (``st_io.load_resident``, what a start runs on now), and for each row count a
comparison's rows (``bench.compare_settings``, top-5 logprobs, EOS ignored) decoded on each
copy in turn, the order alternating round by round. Prints each round's ms a step and the
medians, with how much of each copy lies in huge pages.
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

import torch  # noqa: E402

from benchmarks.step_args import (  # noqa: E402
    alternating_rounds, default_engine, step_parser)
from inference.checkpoint import load_checkpoint  # noqa: E402
from inference.engine import LocalBackend  # noqa: E402
from inference import bench, hugepages  # noqa: E402
from inference.quant import load_int8  # noqa: E402


def huge_share(weights: dict) -> float:
    """The share of ``weights``' bytes in huge pages."""
    tensors = [t for w in weights.values() for t in vars(w).values() if hasattr(t, "data_ptr")]
    held = sum(t.numel() * t.element_size() for t in tensors)
    huge = 0
    for t in tensors:
        huge += hugepages.huge_bytes(t.data_ptr(), t.numel() * t.element_size()) or 0
    return huge / held


def main() -> None:
    parser = step_parser(__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--quantize", default="int8", choices=("int8", "int4"))
    parser.set_defaults(rounds=10)
    args = parser.parse_args()
    if args.ckpt is None and args.quantize == "int8":
        backend = default_engine(args.threads)
    else:
        torch.set_num_threads(args.threads)
        backend = LocalBackend.from_checkpoint(load_checkpoint(args.ckpt, lazy=True),
                                               quantize=args.quantize, precision="auto")
    backend.eos_ids = frozenset()
    fast = backend.runner.fast
    path = backend.runner.int8_path
    backend.runner.pending = None  # (the start's own read into huge pages: not taken in)
    copies = {"huge pages": load_int8(path, backend.device, resident=True),
              "file pages": load_int8(path, backend.device)}
    for label, weights in copies.items():
        assert weights is not None and set(weights) == set(fast.quantized)
        print(f"{label}: {huge_share(weights):.0%} of the weights in huge pages", flush=True)

    def use(label: str) -> None:
        fast.adopt(copies[label])  # (what a start does once its read is done)

    messages = bench.make_prompt(backend.tokenizer, 128)
    rows = [int(r) for r in args.rows.split(",")]
    gc.collect()
    gc.freeze()
    spent = alternating_rounds(backend, messages, rows, list(copies), use, str, args.rounds,
                               args.new_tokens)
    print("medians, ms a step:")
    for n in rows:
        file, huge = (statistics.median(spent[(label, n)]) for label in ("file pages",
                                                                         "huge pages"))
        print(f"  {n} rows: file pages {file:.2f}, huge pages {huge:.2f} "
              f"({(file - huge) / file:+.1%})")


if __name__ == "__main__":
    main()
