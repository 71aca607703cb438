"""The per-token cost of recording what the sampler did (inference.sampling.sampler_stats)
against the whole sampling step, on SmolLM2's vocabulary (49,152), one row, top-5, one thread;
min over 9 runs of 200 calls. Run: ``python benchmarks/sampler_cut.py`` from the checkout."""
import time

import torch

from inference.sampling import RowSampling, process_logits_traced, sample_rows, sampler_stats, token_stats
from inference.settings import SamplingParams
torch.set_num_threads(1)
V, k = 49152, 5
logits = torch.randn(1, V, generator=torch.Generator().manual_seed(0)) * 3
for name, s in {"greedy": SamplingParams(temperature=0),
                "t=0.7 top_p=0.95": SamplingParams(temperature=0.7, top_p=0.95, seed=1),
                "t=0.7 top_k=40 top_p=0.9 min_p=0.05": SamplingParams(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=1)}.items():
    rows = RowSampling.build([s], torch.device("cpu"))
    processed, stages = process_logits_traced(logits, None, rows)
    probs = processed.softmax(-1) if rows.any_sampled else None
    ids = sample_rows(processed, rows, probs)
    top = token_stats(logits, ids, k)[:, 3:3 + k].long()
    best = 1e9; full = 1e9
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(200):
            sampler_stats(processed, probs, stages, rows, ids, top)
        best = min(best, (time.perf_counter() - t0) / 200)
        t0 = time.perf_counter()
        for _ in range(50):
            p2, st = process_logits_traced(logits, None, rows)
            pr = p2.softmax(-1) if rows.any_sampled else None
            i2 = sample_rows(p2, rows, pr)
            token_stats(logits, i2, k)
        full = min(full, (time.perf_counter() - t0) / 50)
    print(f"{name:40s} sampler_stats {best*1e6:6.0f} us of a {full*1e6:6.0f} us sampling step ({best/full:.1%})")
