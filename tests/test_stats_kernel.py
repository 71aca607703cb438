"""The C statistics kernel (``stats.c``: ``sampling.token_stats`` and the greedy step of
``decode_step_outputs`` in two passes a row) against float64 references and against the torch
version it replaces, on this CPU's build and on the AVX2 and portable builds."""

from __future__ import annotations

import math

import pytest
import torch

from inference import q8kernel, sampling
from inference.sampling import (CUT_GREEDY, RowSampling, decode_step_outputs, token_stats,
                                token_stats_reference)
from inference.settings import SamplingParams


def _reference64(logits: torch.Tensor, chosen: torch.Tensor, k: int):
    """(logprob of chosen [B], entropy [B], top ids [B, k], top logprobs [B, k]) in float64,
    ties among the top k by ascending id (a stable sort)."""
    lp = torch.log_softmax(logits.double(), -1)
    p = lp.exp()
    entropy = -torch.where(p > 0, p * lp, torch.zeros_like(p)).sum(-1)
    order = torch.sort(-logits.double(), dim=-1, stable=True).indices[:, :k]
    return lp.gather(-1, chosen[:, None])[:, 0], entropy, order, lp.gather(-1, order)


def _cases():
    """(name, logits [B, V]) with the shapes and oddities a decode step meets."""
    g = torch.Generator().manual_seed(18)
    yield "vocab", torch.randn(8, 49152, generator=g) * 4
    yield "odd width", torch.randn(3, 1000 + 13, generator=g) * 2
    yield "narrow", torch.randn(2, 7, generator=g)
    ties = torch.randint(-3, 4, (4, 5003), generator=g).float()  # many equal logits
    yield "ties", ties
    masked = torch.randn(5, 4099, generator=g) * 3
    masked[:, ::3] = float("-inf")  # filtered tokens
    masked[1, :4000] = float("-inf")
    yield "-inf", masked
    peaked = torch.randn(2, 3001, generator=g)
    peaked[:, 1234] = 60.0  # one token holds nearly all the mass
    yield "peaked", peaked


def _check(kern: q8kernel.Q8Kernel) -> None:
    for name, logits in _cases():
        b, v = logits.shape
        for k in range(0, 21):
            if k > v:
                continue
            greedy = kern.token_stats(logits, None, k, float(CUT_GREEDY))
            argmax = logits.argmax(-1)
            assert torch.equal(greedy[:, 0].long(), argmax), (name, k)
            chosen = torch.randint(0, v, (b,), generator=torch.Generator().manual_seed(k))
            chosen = torch.where(torch.isinf(logits.gather(-1, chosen[:, None])[:, 0]),
                                 argmax, chosen)
            given = kern.token_stats(logits, chosen, k)
            assert given.shape == (b, 3 + 2 * k) and greedy.shape == (b, 5 + 4 * k)
            assert torch.equal(greedy[:, 1:3 + 2 * k], kern.token_stats(logits, argmax, k)[:, 1:])
            lp, ent, ids, top = _reference64(logits, chosen, k)
            assert torch.equal(given[:, 0].long(), chosen)
            assert (given[:, 1].double() - lp).abs().max() <= 2e-6 * (1 + lp.abs().max()), name
            assert (given[:, 2].double() - ent).abs().max() <= 2e-5, name
            assert torch.equal(given[:, 3:3 + k].long(), ids), (name, k)
            if k:
                assert (given[:, 3 + k:].double() - top).abs().max() <= \
                    2e-6 * (1 + top.abs().max()), (name, k)
            # the greedy sampler columns: what sampler_stats gives an all-greedy batch
            rows = RowSampling.build([SamplingParams(temperature=0)] * b, torch.device("cpu"))
            ref = sampling.sampler_stats(logits, None, [], rows, argmax, ids)
            assert torch.equal(greedy[:, 3 + 2 * k:], ref), (name, k)


def _check_topk(kern: q8kernel.Q8Kernel) -> None:
    """Many of the best (the top-p filter's candidates) against a stable sort."""
    g = torch.Generator().manual_seed(4)
    cases = [("probs", (torch.randn(5, 49152, generator=g) * 3).softmax(-1)),
             ("peaked probs", (torch.randn(3, 49152, generator=g) * 30).softmax(-1)),
             ("ties", torch.randint(-5, 5, (4, 5003), generator=g).float())]
    masked = torch.randn(3, 2000, generator=g)
    masked[:, 100:] = float("-inf")
    cases.append(("-inf", masked))
    for name, x in cases:
        for k in (1, 7, 256, 4096, x.shape[-1]):
            if k > x.shape[-1]:
                continue
            vals, ids = kern.topk(x, k)
            order = torch.sort(-x.double(), dim=-1, stable=True).indices[:, :k]
            assert torch.equal(ids, order), (name, k)
            assert torch.equal(vals, x.gather(-1, order)), (name, k)


def test_the_kernel_matches_float64_and_orders_ties_by_id(kernel):
    _check(kernel)
    _check_topk(kernel)


@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_the_avx2_and_portable_builds_match_float64(march, tmp_path, x86_gcc):
    path = tmp_path / f"kernels-{march}.so"
    q8kernel.compile_library(x86_gcc, path, openmp=True, march=march)
    kern = q8kernel.open_library(path, openmp=True)
    _check(kern)
    _check_topk(kern)
    native = q8kernel.load_kernel()
    if native is not None:  # the sampler's draws are the same in every build, and with FMA
        # (AVX2, AVX-512) its bits: the portable build's exp rounds without it
        g = torch.Generator().manual_seed(3)
        for scale in (0.4, 3.0):
            raw = torch.randn(4, 49152 + 7, generator=g) * scale
            row = [torch.tensor(v) for v in ([0.7, 1.2, 1.0, 0.5], [0, 0, 40, 0],
                                            [0.95, 0.999, 1.0, 0.9], [0.0, 0.0, 0.05, 0.0],
                                            [False, False, False, True])]
            u = torch.rand(4, generator=g, dtype=torch.float64)
            got, want = kern.sample(raw, raw, *row, u, 5), native.sample(raw, raw, *row, u, 5)
            if march == "haswell":
                assert torch.equal(got, want)
            exact = [0, *range(3, 8), 14, *range(20, 25)]  # ids, nucleus sizes, cut codes
            assert torch.equal(got[:, exact], want[:, exact])
            assert torch.allclose(got, want, rtol=1e-6, atol=1e-9)


def test_the_kernel_agrees_with_the_torch_version(kernel):
    torch.manual_seed(5)
    logits = torch.randn(8, 49152) * 3
    chosen = torch.randint(0, 49152, (8,))
    for k in (0, 5, 20):
        ref = token_stats_reference(logits, chosen, k)
        got = token_stats(logits, chosen, k)
        assert torch.equal(got[:, 0], ref[:, 0])
        assert torch.equal(got[:, 3:3 + k], ref[:, 3:3 + k])  # no ties among random floats
        assert torch.allclose(got[:, 1:3], ref[:, 1:3], atol=2e-5)
        assert torch.allclose(got[:, 3 + k:], ref[:, 3 + k:], atol=2e-5)


@pytest.mark.parametrize("settings", [
    [SamplingParams(temperature=0)] * 4,
    [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_p=0.9, seed=1)] * 2,
    [SamplingParams(temperature=0, repetition_penalty=1.3)] * 4,
])
def test_a_step_with_the_kernel_equals_the_step_without(settings, kernel, monkeypatch):
    """decode_step_outputs: the fused step (greedy rows, and sampled ones with the sampler of
    stats.c) gives the ids and columns of the torch-only step: ids, alternatives, nucleus
    sizes and cut codes exactly, probabilities to float rounding (exp and sums of its own)."""
    torch.manual_seed(7)
    logits = torch.randn(4, 3000) * 3
    seen = torch.zeros(4, 3000, dtype=torch.bool)
    seen[:, :50] = True
    ids, got = decode_step_outputs(logits, seen, RowSampling.build(settings,
                                                                   torch.device("cpu")), 5)
    monkeypatch.setattr(sampling, "load_kernel", lambda: None)
    ref_ids, ref = decode_step_outputs(logits, seen, RowSampling.build(settings,
                                                                       torch.device("cpu")), 5)
    assert torch.equal(ids, ref_ids)
    assert got.shape == ref.shape
    exact = [0, *range(3, 8), 14, *range(20, 25)]  # ids, alternatives, nucleus, cut codes
    assert torch.equal(got[:, exact], ref[:, exact])
    assert torch.allclose(got, ref, atol=2e-5)


def _torch_step(logits, seen, settings, k, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(sampling, "load_kernel", lambda: None)
        return decode_step_outputs(logits, seen, RowSampling.build(settings, torch.device("cpu")),
                                   k)


MIXES = [
    [SamplingParams(temperature=t, top_p=0.95, seed=i + 1)
     for i, t in enumerate((0.7, 1.0, 0.4, 1.2, 0.9, 0.6, 0.7, 1.0))],  # a comparison's
    [SamplingParams(temperature=0.5, top_k=40, seed=3), SamplingParams(temperature=1.3, min_p=0.05,
                                                                       seed=4),
     SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=20, top_p=0.8,
                                                   min_p=0.02, repetition_penalty=1.3, seed=5)],
    [SamplingParams(temperature=1.0, top_p=0.3, seed=6),
     SamplingParams(temperature=2.0, top_p=0.999, seed=7)],
]


@pytest.mark.parametrize("vocab", [49152, 1013, 150])
@pytest.mark.parametrize("mix", range(len(MIXES)))
def test_the_fused_sampler_draws_what_the_torch_chain_draws(vocab, mix, kernel, monkeypatch):
    """stats.c's sampler (temperature, top-k, top-p in its tiers, min-p, the penalty, the
    float64 draw) against sampling.py's torch chain on peaked and flat rows (nuclei from a few
    tokens to most of the vocabulary, every tier): the same token at every step, the same
    nucleus sizes and cut codes, probabilities to float rounding. Random logits have no ties
    (the tie rule is the next test's)."""
    settings = MIXES[mix]
    g = torch.Generator().manual_seed(vocab + mix)
    calls = []
    fused = type(kernel).sample
    monkeypatch.setattr(type(kernel), "sample",
                        lambda self, *a, **kw: calls.append(1) or fused(self, *a, **kw))
    for step in range(12):
        logits = torch.randn(len(settings), vocab, generator=g) * (3.0 if step % 2 else 0.4)
        logits[:, :8] += 6.0 * (step % 3)
        seen = torch.rand(len(settings), vocab, generator=g) < 0.02
        ids, got = decode_step_outputs(logits, seen, RowSampling.build(settings,
                                                                       torch.device("cpu")), 5)
        ref_ids, ref = _torch_step(logits, seen, settings, 5, monkeypatch)
        assert torch.equal(ids, ref_ids), step
        exact = [0, *range(3, 8), 14, *range(20, 25)]
        assert torch.equal(got[:, exact], ref[:, exact]), step
        assert torch.allclose(got[:, 13:], ref[:, 13:], atol=1e-6, rtol=1e-4), step
        assert torch.allclose(got, ref, atol=3e-5), step
    assert len(calls) == 12  # one kernel call a step, the torch chain only for the reference


def test_the_fused_nucleus_breaks_ties_by_id_and_the_draw_takes_kept_tokens(kernel, monkeypatch):
    """Tokens of equal probability across top-p's boundary: the lower ids are kept (as the
    candidates' order has them), in every tier; u = 0 draws the first kept token and u just
    below 1 the last, never a removed one."""
    for vocab, tied in ((3000, 100), (49152, 20000)):  # within the first tier, past the third
        logits = torch.full((1, vocab), -30.0)
        logits[0, :tied] = 0.0
        for p in (0.5, 0.25):
            rows = RowSampling.build([SamplingParams(temperature=1.0, top_p=p, seed=1)],
                                     torch.device("cpu"))
            _, got = decode_step_outputs(logits, None, rows, 3)
            want = -int(-tied * p // 1)  # the fewest tokens with p of the mass, the first ids
            assert int(got[0, 10]) in (want, want + 1)  # (the mass's float rounding)
            kept = int(got[0, 10])
            for u, first in ((0.0, 0), (1 - 2 ** -53, kept - 1)):
                monkeypatch.setattr(torch, "rand",
                                    lambda *a, u=u, **k: torch.tensor([u], dtype=torch.float64))
                ids, _ = decode_step_outputs(logits, None, RowSampling.build(
                    [SamplingParams(temperature=1.0, top_p=p, seed=1)], torch.device("cpu")), 3)
                assert int(ids[0]) == first
                monkeypatch.undo()


@pytest.mark.parametrize("tail_mass", [0.04, 0.0501, 0.06, 0.3])
def test_the_fused_nucleus_through_a_long_tail_of_small_tokens(tail_mass, kernel, monkeypatch):
    """One likely token and 49,151 small ones holding tail_mass of the probability: at top-p
    0.95 the nucleus is the one token while the tail holds less than 5%, else it reaches into
    the tail (thousands of tokens, all near the kernel's bound below which it drops tokens
    unranked): the same nucleus sizes, cut codes and draws as the torch chain."""
    vocab = 49152
    g = torch.Generator().manual_seed(int(tail_mass * 1e4))
    tail = math.log(tail_mass / (1 - tail_mass) / (vocab - 1))
    logits = torch.full((2, vocab), tail) + 0.05 * torch.randn(2, vocab, generator=g)
    logits[:, 7] = 0.0
    settings = [SamplingParams(temperature=1.0, top_p=0.95, seed=s) for s in (1, 2)]
    ids, got = decode_step_outputs(logits, None, RowSampling.build(settings,
                                                                   torch.device("cpu")), 5)
    ref_ids, ref = _torch_step(logits, None, settings, 5, monkeypatch)
    assert torch.equal(ids, ref_ids)
    exact = [0, *range(3, 8), 14, *range(20, 25)]
    assert torch.equal(got[:, exact], ref[:, exact])
    kept = int(got[0, 14])
    assert kept == 1 if tail_mass < 0.05 else kept > 1000 * (tail_mass > 0.051)


def test_the_fused_draw_follows_the_kept_distribution(kernel):
    """3,000 seeded draws of a row cut to three tokens by top-k land on them in proportion."""
    vocab = 1000
    probs = torch.full((vocab,), 1e-4)
    probs[[10, 500, 999]] = torch.tensor([0.5, 0.3, 0.15])
    logits = (probs / probs.sum()).log()[None].expand(2, -1).contiguous()
    counts = torch.zeros(vocab)
    for seed in range(3000):
        rows = RowSampling.build([SamplingParams(temperature=0.0),
                                  SamplingParams(temperature=1.0, top_k=3, seed=seed)],
                                 torch.device("cpu"))
        ids, _ = decode_step_outputs(logits, None, rows, 3)
        assert int(ids[0]) == 10
        counts[int(ids[1])] += 1
    kept = torch.tensor([0.5, 0.3, 0.15]) / 0.95
    assert counts.sum() == counts[[10, 500, 999]].sum()
    assert torch.allclose(counts[[10, 500, 999]] / counts.sum(), kept, atol=0.03)


def test_without_the_kernels_token_stats_is_the_torch_version(monkeypatch):
    monkeypatch.setattr(sampling, "load_kernel", lambda: None)
    logits = torch.randn(2, 300)
    chosen = torch.tensor([3, 4])
    assert torch.equal(token_stats(logits, chosen, 4), token_stats_reference(logits, chosen, 4))
