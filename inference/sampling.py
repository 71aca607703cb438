"""Sampling as small pure functions over batched tensors, one settings row per batch row.

The order follows transformers' ``generate``: repetition penalty, then temperature, top-k,
top-p and min-p. Everything stays on the device; ``decode_step_outputs`` packs what the host
needs (chosen ids, their raw logprobs, entropy, top-k alternatives, and what the sampler did:
``sampler_stats``) into one small tensor so a step costs one transfer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

from .q8kernel import STATS_MAX_K, load_kernel
from .settings import SamplingParams


@dataclass
class RowSampling:
    """Per-row sampling settings as tensors on the device (shape [B] each)."""

    temperature: torch.Tensor  # [B] float; rows with 0 are greedy
    top_k: torch.Tensor  # [B] long; 0 = off
    top_p: torch.Tensor  # [B] float; 1 = off
    min_p: torch.Tensor  # [B] float; 0 = off
    repetition_penalty: torch.Tensor  # [B] float; 1 = off
    greedy: torch.Tensor  # [B] bool
    greedy_rows: tuple[bool, ...]
    """``greedy`` on the host (reading the tensor on a GPU would wait for the device)."""
    generators: list[torch.Generator]
    """One CPU generator a row, whatever the device: a sampled row draws one number a step
    from it (``_uniforms``), on the host, so a seed gives the same draws on a GPU as here."""
    any_sampled: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    any_penalty: bool

    @classmethod
    def build(cls, settings: Sequence[SamplingParams], device: torch.device) -> RowSampling:
        temps = [s.temperature for s in settings]
        gens = []
        for s in settings:
            g = torch.Generator()
            if s.seed is None:
                g.seed()
            else:
                g.manual_seed(s.seed)
            gens.append(g)
        greedy = [s.greedy for s in settings]
        return cls(
            temperature=torch.tensor([t if t > 0 else 1.0 for t in temps], device=device),
            top_k=torch.tensor([s.top_k for s in settings], device=device, dtype=torch.long),
            top_p=torch.tensor([s.top_p for s in settings], device=device),
            min_p=torch.tensor([s.min_p for s in settings], device=device),
            repetition_penalty=torch.tensor([s.repetition_penalty for s in settings], device=device),
            greedy=torch.tensor(greedy, device=device),
            greedy_rows=tuple(greedy),
            generators=gens,
            any_sampled=not all(greedy),
            any_top_k=any(s.top_k > 0 and not s.greedy for s in settings),
            any_top_p=any(s.top_p < 1 and not s.greedy for s in settings),
            any_min_p=any(s.min_p > 0 and not s.greedy for s in settings),
            any_penalty=any(s.repetition_penalty != 1 for s in settings),
        )

    def select(self, rows: torch.Tensor, keep: list[int]) -> RowSampling:
        """Keep only some rows (a finished row leaves the batch)."""
        return RowSampling(
            temperature=self.temperature[rows], top_k=self.top_k[rows], top_p=self.top_p[rows],
            min_p=self.min_p[rows], repetition_penalty=self.repetition_penalty[rows],
            greedy=self.greedy[rows], greedy_rows=tuple(self.greedy_rows[i] for i in keep),
            generators=[self.generators[i] for i in keep],
            any_sampled=self.any_sampled, any_top_k=self.any_top_k, any_top_p=self.any_top_p,
            any_min_p=self.any_min_p, any_penalty=self.any_penalty,
        )


NEG_INF = float("-inf")


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor,
                             penalty: torch.Tensor) -> torch.Tensor:
    """transformers' rule: a seen token's logit is divided by the penalty if positive,
    multiplied if negative. logits: [B, V]; seen: [B, V] bool; penalty: [B]."""
    p = penalty[:, None]
    penalised = torch.where(logits > 0, logits / p, logits * p)
    return torch.where(seen, penalised, logits)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits: [B, V] divided per row by temperature [B] (> 0)."""
    return logits / temperature[:, None]


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep the top_k[b] largest logits of row b (0 keeps all). Ties at the threshold are kept,
    as in transformers' TopKLogitsWarper."""
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    kmax = int(k.max())
    top_vals = torch.topk(logits, kmax, dim=-1).values  # [B, kmax]
    threshold = top_vals.gather(-1, (k - 1)[:, None])  # [B, 1]
    return logits.masked_fill(logits < threshold, NEG_INF)


def top_p_filter(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter (transformers' TopPLogitsWarper, per row): drop the least likely tokens
    whose cumulative probability stays within 1 - top_p; always keep the most likely one.

    On a CPU the nucleus is first looked for among each row's ``TOP_P_CANDIDATES`` most likely
    tokens (``_top_p_keep``): sorting the whole vocabulary cost 8 ms a row and a step (49,152
    tokens, one thread), more than the default model's whole forward; only a row whose nucleus
    is wider than the candidates is sorted in full."""
    if logits.device.type == "cpu" and logits.shape[-1] > TOP_P_CANDIDATES[0]:
        return logits.masked_fill(~_top_p_tiers(logits, top_p, TOP_P_CANDIDATES), NEG_INF)
    return _top_p_sorted(logits, top_p)


def _top_p_tiers(logits: torch.Tensor, top_p: torch.Tensor, tiers: tuple[int, ...]
                 ) -> torch.Tensor:
    """``top_p_filter``'s kept tokens [B, V] bool: among the first tier's candidates, the rows
    whose nucleus is wider among the next tier's, the rest by the full sort."""
    if not tiers or tiers[0] >= logits.shape[-1]:
        return ~torch.isinf(_top_p_sorted(logits, top_p))
    keep, wide = _top_p_keep(logits, top_p, tiers[0])
    if wide.any():
        rows = wide.nonzero()[:, 0]
        keep[rows] = _top_p_tiers(logits[rows], top_p[rows], tiers[1:])
    return keep


def _top_p_sorted(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """``top_p_filter`` by sorting every row's whole vocabulary (transformers' way)."""
    sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # [B, V] ascending
    remove_sorted = cum <= (1 - top_p)[:, None]
    remove_sorted[:, -1] = False
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


TOP_P_CANDIDATES = (256, 4096, 16384)
"""How many of a row's most likely tokens ``top_p_filter`` looks for the nucleus among, in
turn, before sorting them all (one thread, 49,152 tokens: 0.1 ms and 0.8 ms against 8 ms; the
default model's nucleus at top_p 0.95 outgrew the first for 73% of its steps at temperature
1.2, 20-36% at 1.0, 0-5% at 0.4-0.9). The third (0.38 ms against the sort's 3.7 ms, 2
threads): 13 of the 512 row-steps of an 8-column comparison (temperatures 0.4-1.2, 64 tokens)
outgrew the second, each sorted in full, 10% of that comparison's sampling."""


def _top_p_keep(logits: torch.Tensor, top_p: torch.Tensor,
                k: int = TOP_P_CANDIDATES[0]) -> tuple[torch.Tensor, torch.Tensor]:
    """(the tokens ``top_p_filter`` keeps [B, V] bool, found among each row's ``k`` most likely
    tokens; which rows [B] bool have a nucleus beyond them, whose row of the first is to be
    replaced).

    The reference's test at the token of rank j (best first) is ``cum <= 1 - top_p`` with
    ``cum`` the ascending cumulative sum, which torch accumulates in float64 on the CPU and
    rounds to float32: the row's total mass less the mass above rank j, computed here in
    float64 from the same float32 probabilities (only the order of the float64 additions
    differs). Every token below the candidates is dropped when the mass left below them passes
    the same test."""
    probs = logits.softmax(dim=-1)
    top, idx = _topk(probs, k)  # [B, k] best first
    top64 = top.double()
    total = probs.sum(dim=-1, dtype=torch.float64)[:, None]  # [B, 1]
    above = top64.cumsum(dim=-1) - top64  # mass strictly above each candidate
    limit = (1 - top_p)[:, None]
    tail = (total - top64.sum(dim=-1, keepdim=True)).float()  # cum at the best non-candidate
    remove = (total - above).float() <= limit
    remove[:, 0] = False
    keep = torch.zeros(probs.shape, dtype=torch.bool).scatter_(1, idx, ~remove)
    return keep, (tail > limit)[:, 0]


def _topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(x, k, dim=-1) for x [B, V]; on the CPU the C kernel's (``stats.c``: 0.06 ms
    against torch's 0.17 ms a row at k = 256, 0.16 ms against 0.57 ms at k = 4096, 49,152
    values, one thread), where equal values come by ascending id (torch's order among them is
    unspecified)."""
    kernel = load_kernel() if x.device.type == "cpu" and x.dtype == torch.float32 else None
    if kernel is None or x.dim() != 2 or k > x.shape[-1]:
        return torch.topk(x, k, dim=-1)
    return kernel.topk(x.contiguous(), k)


def min_p_filter(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p[b] x the top probability of row b."""
    probs = logits.softmax(dim=-1)
    top = probs.amax(dim=-1, keepdim=True)
    remove = probs < min_p[:, None] * top
    return logits.masked_fill(remove, NEG_INF)


def process_logits(logits: torch.Tensor, seen: torch.Tensor | None, rows: RowSampling) -> torch.Tensor:
    """All filters in transformers' order; returns processed logits [B, V] (fp32)."""
    return process_logits_traced(logits, seen, rows)[0]


CUT_NAMES = ("", "top-k", "top-p", "min-p", "greedy")
"""What removed a token, by code: 0 kept (in the nucleus), then each filter in the order the
chain runs; "greedy" is temperature 0 (every token but the argmax is out)."""
CUT_TOP_K, CUT_TOP_P, CUT_MIN_P, CUT_GREEDY = 1, 2, 3, 4


def process_logits_traced(logits: torch.Tensor, seen: torch.Tensor | None, rows: RowSampling
                          ) -> tuple[torch.Tensor, list[tuple[int, torch.Tensor]]]:
    """``process_logits`` that also returns the logits after each filter that ran, with the
    filter's cut code: a token first -inf after filter F was removed by F. The intermediate
    tensors exist anyway (every filter is out of place), so keeping them costs nothing."""
    x = logits
    stages: list[tuple[int, torch.Tensor]] = []
    if rows.any_penalty and seen is not None:
        x = apply_repetition_penalty(x, seen, rows.repetition_penalty)
    if rows.any_sampled:
        x = apply_temperature(x, rows.temperature)
        if rows.any_top_k:
            x = top_k_filter(x, rows.top_k)
            stages.append((CUT_TOP_K, x))
        if rows.any_top_p:
            x = top_p_filter(x, rows.top_p)
            stages.append((CUT_TOP_P, x))
        if rows.any_min_p:
            x = min_p_filter(x, rows.min_p)
            stages.append((CUT_MIN_P, x))
    return x, stages


def _uniforms(rows: RowSampling) -> torch.Tensor:
    """One float64 uniform number in [0, 1) per row from its generator for the CPU draw (0
    for a greedy row, which draws none), for ``sample_rows`` and the fused sampler alike."""
    return torch.cat([torch.zeros(1, dtype=torch.float64) if greedy
                      else torch.rand(1, generator=g, dtype=torch.float64)
                      for greedy, g in zip(rows.greedy_rows, rows.generators)])


def sample_rows(processed: torch.Tensor, rows: RowSampling,
                probs: torch.Tensor | None = None) -> torch.Tensor:
    """Choose one token per row: argmax for greedy rows, a draw from softmax otherwise; each
    row's randomness comes from its own generator, so a seeded row does not depend on the
    other rows. Returns ids [B] (long). ``probs``: softmax(processed) when the caller has it.

    A sampled row takes one uniform number from its generator (on the host, ``_uniforms``) and
    the first token whose cumulative probability (float64, in vocabulary order) passes it:
    exact sampling at one pass over the row (0.08 ms for 49,152 tokens, one row, 2 threads).
    It was the exponential race (argmax of p / Exp(1) noise, gpt-fast's), whose 49,152
    exponential draws cost 0.99 ms a row and a step on this CPU, and on a GPU one draw call a
    row from its own device generator: at 8 rows, 8 calls and launches of a step's ~40
    (issue 18's seventh pass); here every row draws in the same few launches on any device,
    and a seed gives the same reply on a GPU as on the CPU (up to the probabilities'
    rounding). Tokens the filters removed have probability 0 and are never passed.
    """
    greedy_ids = processed.argmax(dim=-1)
    if all(rows.greedy_rows):  # (also where the sampled rows have finished)
        return greedy_ids
    if probs is None:
        probs = processed.softmax(dim=-1)
    cum = probs.cumsum(dim=-1, dtype=torch.float64)  # [B, V], each term widened first
    u = _uniforms(rows).to(probs.device, non_blocking=True)  # 0 for a greedy row
    total = cum[:, -1]
    # below the total even where u * total rounds up to it: a token of probability > 0
    point = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    sampled = torch.searchsorted(cum, point[:, None], right=True)[:, 0]
    return torch.where(rows.greedy, greedy_ids, sampled)


def _stats_kernel(logits: torch.Tensor, k: int) -> Any:
    """The C statistics kernel (``q8kernel.Q8Kernel.token_stats``) when it can take these
    logits (fp32 on the CPU, k within its limit, the kernels built); else None."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32 or k > STATS_MAX_K:
        return None
    return load_kernel()


def token_stats(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
    """Raw-distribution statistics, packed for one transfer.

    logits: [B, V] raw (before any filter). Returns [B, 3 + 2k] fp32: chosen id, its logprob,
    entropy (nats), then k alternative ids and k logprobs (best first; equal logprobs by
    id).

    On the CPU the C kernel (``stats.c``) computes them in two passes over each row;
    elsewhere, or where the kernels do not build, ``token_stats_reference``. 8 rows of
    49,152 logits, top-5, one thread of the shared 2-core machine (load ~3): 0.13 ms against
    5.9 ms a step for ``token_stats_reference``'s ten passes a row and their allocations
    (argmax and the greedy sampler columns included in the first).
    """
    kernel = _stats_kernel(logits, k)
    if kernel is not None:
        return kernel.token_stats(logits.contiguous(), chosen, k)
    return token_stats_reference(logits, chosen, k)


def token_stats_reference(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> torch.Tensor:
    """``token_stats`` in torch (the reference the kernel is tested against, and the path on
    a GPU). Ties among the top k come in torch.topk's order."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
    p = logprobs.exp()
    entropy = -(torch.where(p > 0, p * logprobs, torch.zeros_like(p))).sum(dim=-1)  # [B]
    chosen_lp = logprobs.gather(-1, chosen[:, None])[:, 0]  # [B]
    parts = [chosen.float()[:, None], chosen_lp[:, None], entropy[:, None]]
    if k > 0:
        top_lp, top_ids = torch.topk(logprobs, k, dim=-1)  # [B, k]
        parts += [top_ids.float(), top_lp]
    return torch.cat(parts, dim=-1)


def score_stats(logits: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """``token_stats`` of each position's next token, with its rank (for scoring a text).

    logits: [T, V] raw, position t predicting ``targets[t]`` ([T] long). Returns [T, 4 + 2k]
    fp32: the ``token_stats`` columns, then the rank (1 = the most likely; ties share the
    better rank).
    """
    stats = token_stats(logits, targets, k)  # [T, 3 + 2k]
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [T, V]
    chosen = logprobs.gather(-1, targets[:, None])  # [T, 1]
    rank = (logprobs > chosen).sum(dim=-1, keepdim=True).float() + 1  # [T, 1]
    return torch.cat([stats, rank], dim=-1)


def sampler_stats(processed: torch.Tensor, probs: torch.Tensor | None,
                  stages: list[tuple[int, torch.Tensor]], rows: RowSampling,
                  chosen: torch.Tensor, top_ids: torch.Tensor) -> torch.Tensor:
    """What the sampler did at one step, packed for the same transfer as ``token_stats``.

    processed: [B, V] logits after the whole chain; probs: their softmax (None when every row
    is greedy); stages: ``process_logits_traced``'s; chosen: [B]; top_ids: [B, k] the raw
    top-k alternatives. Returns [B, 2 + 2k] fp32: the chosen token's probability after the
    chain (what the draw used; 1 for a greedy row), the nucleus size (tokens left with a
    probability above 0; 1 for a greedy row), each alternative's probability after the chain,
    then each alternative's cut code (``CUT_NAMES``: 0 kept, else the first filter that
    removed it).

    Cheap enough to run at every token: greedy rows add only [B, k] comparisons; a sampled
    row adds one count over the vocabulary and [B, k] gathers (the softmax is the one the draw
    needs anyway, and the filters' intermediate logits exist already). Measured on SmolLM2's
    vocabulary (49,152), one row, top-5, one thread of this 2-core CPU (shared, load ~9),
    min of 9 x 200 calls: 19 us for greedy (the whole sampling step: 529 us), 319 us for
    temperature 0.7 + top-p 0.95 (of 11.7 ms, top-p's sort dominating), 224 us for
    top-k 40 + top-p 0.9 + min-p 0.05 (of 3.4 ms): 3-7% of the sampling step, under 2% of a
    decode step of the 135M model here (``benchmarks/sampler_cut.py``). ``chatui bench
    --new-tokens 64 --prompt-tokens 64 --repeats 3`` (greedy, int8), interleaved before and
    after twice on the same machine: 7.7 and 4.9 tok/s before, 6.7 and 10.4 after: its noise
    there (a factor of 2, other work running) hides a cost of ~20 us a token at ~100-200 ms
    a step.
    """
    b, k = top_ids.shape
    greedy = rows.greedy[:, None]  # [B, 1]
    if probs is None:  # every row greedy
        chosen_p = torch.ones(b, 1, device=processed.device)
        nucleus = torch.ones(b, 1, device=processed.device)
        alt_p = (top_ids == chosen[:, None]).float()
        cut = torch.where(top_ids == chosen[:, None], 0, CUT_GREEDY).float()
        return torch.cat([chosen_p, nucleus, alt_p, cut], dim=-1)
    chosen_p = probs.gather(-1, chosen[:, None])  # [B, 1]
    if stages:
        nucleus = torch.isfinite(processed).sum(dim=-1, keepdim=True).float()  # [B, 1]
    else:
        nucleus = torch.full((b, 1), float(processed.shape[-1]), device=processed.device)
    alt_p = probs.gather(-1, top_ids)  # [B, k]
    cut = torch.zeros(b, k, device=processed.device)
    for code, x in reversed(stages):  # the earliest filter that removed it wins
        out = torch.isinf(x.gather(-1, top_ids))
        cut = torch.where(out, float(code), cut)
    is_chosen = top_ids == chosen[:, None]
    chosen_p = torch.where(greedy, 1.0, chosen_p)
    nucleus = torch.where(greedy, 1.0, nucleus)
    alt_p = torch.where(greedy, is_chosen.float(), alt_p)
    cut = torch.where(greedy, torch.where(is_chosen, 0.0, float(CUT_GREEDY)), cut)
    return torch.cat([chosen_p, nucleus, alt_p, cut], dim=-1)


def decode_step_outputs(logits: torch.Tensor, seen: torch.Tensor | None, rows: RowSampling,
                        k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's sampling: returns (next ids [B] on device, packed stats
    [B, 5 + 4k]: ``token_stats``' 3 + 2k columns, then ``sampler_stats``' 2 + 2k).

    On the CPU with chatui's kernels the whole step is one call of ``stats.c``'s sampler: the
    chain above, the CPU draw of ``sample_rows`` and every column, in a few vector passes over
    each row (the penalty, when set, still in torch). A comparison's 8 rows (temperatures
    0.4-1.2, top-p 0.95, peaked logits of 49,152 tokens, 2 threads): 7.2-9.7 ms a step for the
    torch chain, 1.3-2.0 ms fused (``benchmarks/bench_batch.py`` for what that makes of a step).
    Elsewhere, the torch functions above (the references the kernel is tested against)."""
    logits = logits.float()
    kernel = _stats_kernel(logits, k)
    if kernel is not None and not rows.any_sampled and not rows.any_penalty:
        # greedy: argmax, statistics and sampler columns in one call
        stats = kernel.token_stats(logits.contiguous(), None, k, float(CUT_GREEDY))
        return stats[:, 0].long(), stats
    if kernel is not None:  # the chain, the draw and every column in one call
        pre = logits
        if rows.any_penalty and seen is not None:
            pre = apply_repetition_penalty(logits, seen, rows.repetition_penalty)
        stats = kernel.sample(logits.contiguous(), pre.contiguous(), rows.temperature,
                              rows.top_k, rows.top_p, rows.min_p, rows.greedy,
                              _uniforms(rows), k)
        return stats[:, 0].long(), stats
    processed, stages = process_logits_traced(logits, seen, rows)
    probs = processed.softmax(dim=-1) if rows.any_sampled else None
    next_ids = sample_rows(processed, rows, probs)
    stats = token_stats(logits, next_ids, k)
    top_ids = stats[:, 3:3 + k].long()
    return next_ids, torch.cat([stats, sampler_stats(processed, probs, stages, rows, next_ids,
                                                     top_ids)], dim=-1)
