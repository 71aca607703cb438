"""A prompt's prefill with its RoPE, cache writes and attention in chatui's C kernel
(``attn_prefill``, the default) against torch's (the complex multiply, the cache writes and
``scaled_dot_product_attention``: ``FastLlama.c_prefill`` off), the default
model with int8 weights, the two taken in turn in one process (the machine's speed moves by
10-20% within minutes: only figures measured alternately compare).

    nice .venv/bin/python benchmarks/bench_prefill_attention.py [--rounds 12]
        [--prompt-tokens 128,1000] [--threads 2]

Prints, per prompt length, the median prefill time of each path (a fresh cache each time, the
whole prompt in one forward, as a first turn's prefill runs) and how far their last logits lie
apart (int8 activations turn the attention's other rounding into other levels, as any change
of the arithmetic does). Issue 18's twenty-ninth pass (docs/batched-decode.md) measured it.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from benchmarks.step_args import default_engine, step_parser  # noqa: E402
from inference import bench  # noqa: E402
from inference.chat import encode_messages  # noqa: E402


def main() -> None:
    parser = step_parser(__doc__.splitlines()[0])
    parser.set_defaults(rounds=12)
    parser.add_argument("--prompt-tokens", default="128,1000")
    args = parser.parse_args()
    backend = default_engine(args.threads)
    fast = backend.runner.fast
    if fast is None or not fast.c_prefill:
        raise SystemExit("The C attention is not in use here (no kernels): nothing to compare.")
    for n in (int(t) for t in args.prompt_tokens.split(",")):
        ids = encode_messages(backend.tokenizer, bench.make_prompt(backend.tokenizer, n))
        prompt = torch.tensor([ids])

        def prefill(c: bool) -> tuple[float, torch.Tensor]:
            fast.c_prefill = c
            cache = fast.new_cache()
            start = time.perf_counter()
            logits = fast.forward(cache, prompt)
            return time.perf_counter() - start, logits

        spent: dict[bool, list[float]] = {True: [], False: []}
        last = {c: prefill(c)[1] for c in (True, False)}  # (warm-up)
        for _ in range(args.rounds):
            for c in (True, False):
                spent[c].append(prefill(c)[0])
        fast.c_prefill = True
        c_ms, torch_ms = (statistics.median(spent[c]) * 1e3 for c in (True, False))
        diff = (last[True] - last[False]).abs().max().item()
        same = int(last[True].argmax()) == int(last[False].argmax())
        print(f"{len(ids)} tokens: C attention {c_ms:.1f} ms ({len(ids) / c_ms * 1e3:.0f} tok/s),"
              f" torch's {torch_ms:.1f} ms ({len(ids) / torch_ms * 1e3:.0f} tok/s); last logits "
              f"at most {diff:.3f} apart, the same top token: {same}", flush=True)


if __name__ == "__main__":
    main()
