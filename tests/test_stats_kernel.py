"""The C statistics kernel (``stats.c``: ``sampling.token_stats`` and the greedy step of
``decode_step_outputs`` in two passes a row) against float64 references and against the torch
version it replaces, on this CPU's build and on the AVX2 and portable builds."""

from __future__ import annotations

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
    """decode_step_outputs: the fused greedy step (and token_stats inside the torch path)
    gives the ids and columns of the torch-only step, up to float rounding."""
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
    exact = [0, *range(3, 8), *range(13, 25)]  # ids, alternatives and the sampler columns
    assert torch.equal(got[:, exact], ref[:, exact])
    assert torch.allclose(got, ref, atol=2e-5)


def test_without_the_kernels_token_stats_is_the_torch_version(monkeypatch):
    monkeypatch.setattr(sampling, "load_kernel", lambda: None)
    logits = torch.randn(2, 300)
    chosen = torch.tensor([3, 4])
    assert torch.equal(token_stats(logits, chosen, 4), token_stats_reference(logits, chosen, 4))
