"""Sampling filters against transformers' own logits processors, per row."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from inference.sampling import (RowSampling, apply_repetition_penalty, decode_step_outputs,
                                min_p_filter, process_logits, sample_rows, token_stats,
                                top_k_filter, top_p_filter)
from inference.settings import SamplingParams, SettingsError, parse_assignments

V = 200


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, V, generator=g) * 3


def test_top_k_per_row_matches_reference(logits):
    ks = [1, 5, 50, 0]
    out = top_k_filter(logits, torch.tensor(ks))
    for b, k in enumerate(ks):
        ref = logits[b:b + 1] if k == 0 else TopKLogitsWarper(k)(None, logits[b:b + 1].clone())
        assert torch.equal(out[b:b + 1], ref)


def test_top_p_per_row_matches_reference(logits):
    ps = [0.1, 0.5, 0.9, 1.0]
    out = top_p_filter(logits, torch.tensor(ps))
    for b, p in enumerate(ps):
        ref = logits[b:b + 1] if p == 1.0 else TopPLogitsWarper(p)(None, logits[b:b + 1].clone())
        assert torch.equal(torch.isinf(out[b:b + 1]), torch.isinf(ref))


def test_min_p_per_row_matches_reference(logits):
    ps = [0.0, 0.05, 0.2, 0.9]
    out = min_p_filter(logits, torch.tensor(ps))
    for b, p in enumerate(ps):
        ref = logits[b:b + 1] if p == 0 else MinPLogitsWarper(p)(None, logits[b:b + 1].clone())
        assert torch.equal(torch.isinf(out[b:b + 1]), torch.isinf(ref))


def test_repetition_penalty_matches_reference(logits):
    seen_ids = torch.tensor([[3, 7, 9, 150]] * 4)
    seen = torch.zeros(4, V, dtype=torch.bool).scatter(1, seen_ids, True)
    pens = [1.0, 1.1, 1.5, 0.8]
    out = apply_repetition_penalty(logits, seen, torch.tensor(pens))
    for b, p in enumerate(pens):
        ref = RepetitionPenaltyLogitsProcessor(p)(seen_ids[b:b + 1], logits[b:b + 1].clone())
        assert torch.allclose(out[b:b + 1], ref)


def test_full_pipeline_matches_transformers_order(logits):
    settings = [SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.02,
                               repetition_penalty=1.2)] * 4
    rows = RowSampling.build(settings, torch.device("cpu"))
    seen_ids = torch.tensor([[1, 2, 3]] * 4)
    seen = torch.zeros(4, V, dtype=torch.bool).scatter(1, seen_ids, True)
    ours = process_logits(logits, seen, rows)
    ref = RepetitionPenaltyLogitsProcessor(1.2)(seen_ids, logits.clone())
    for proc in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(20), TopPLogitsWarper(0.8),
                 MinPLogitsWarper(0.02)):
        ref = proc(seen_ids, ref)
    assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    finite = ~torch.isinf(ref)
    assert torch.allclose(ours[finite], ref[finite])


def test_greedy_rows_take_argmax_and_sampled_rows_follow_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(2, -1).contiguous()
    rows = RowSampling.build([SamplingParams(temperature=0),
                              SamplingParams(temperature=1.0, seed=123)], torch.device("cpu"))
    counts = torch.zeros(4)
    for _ in range(4000):
        ids = sample_rows(logits, rows)
        assert ids[0] == 0
        counts[ids[1]] += 1
    freq = counts / counts.sum()
    assert torch.allclose(freq, probs, atol=0.03)


def test_seeded_rows_do_not_depend_on_their_neighbours():
    logits = torch.randn(1, V)
    a = RowSampling.build([SamplingParams(temperature=1, seed=7)], torch.device("cpu"))
    b = RowSampling.build([SamplingParams(temperature=1, seed=99),
                           SamplingParams(temperature=1, seed=7)], torch.device("cpu"))
    seq_a = [int(sample_rows(logits, a)[0]) for _ in range(20)]
    seq_b = [int(sample_rows(logits.expand(2, -1), b)[1]) for _ in range(20)]
    assert seq_a == seq_b


def test_token_stats_are_raw_logprobs(logits):
    chosen = torch.tensor([0, 1, 2, 3])
    packed = token_stats(logits, chosen, 3)
    lp = torch.log_softmax(logits, -1)
    assert torch.allclose(packed[:, 1], lp[torch.arange(4), chosen])
    assert torch.allclose(packed[:, 2], -(lp.exp() * lp).sum(-1), atol=1e-5)
    top = torch.topk(lp, 3)
    assert torch.equal(packed[:, 3:6].long(), top.indices)
    assert torch.allclose(packed[:, 6:9], top.values)


def test_logprobs_ignore_temperature_and_filters(logits):
    rows = RowSampling.build([SamplingParams(temperature=0.3, top_k=2, seed=1)] * 4,
                             torch.device("cpu"))
    ids, packed = decode_step_outputs(logits, None, rows, 2)
    lp = torch.log_softmax(logits, -1)
    assert torch.allclose(packed[:, 1], lp[torch.arange(4), ids])


@pytest.mark.parametrize("text, words", [
    ("temperature=-1", "temperature must be between 0 and 100"),
    ("top_p=0", "top_p must be in (0, 1]"),
    ("top_k=1.5", "top_k must be a whole number"),
    ("min_p=1", "min_p must be in [0, 1)"),
    ("repetition_penalty=0", "repetition_penalty must be in (0, 10]"),
    ("seed=abc", "seed must be a whole number"),
    ("max_tokens=0", "max_tokens must be a whole number between 1"),
    ("warmth=1", "unknown setting 'warmth'"),
    ("temperature", "temperature needs a value: temperature=VALUE or temperature VALUE"),
    ("temp 0.5 top_p", "top_p needs a value"),
    ("temp 0.5 top_p max=9", "top_p needs a value"),
    ("warm 1", "unknown setting 'warm'"),
])
def test_invalid_settings_say_the_valid_range(text, words):
    with pytest.raises(SettingsError) as exc:
        parse_assignments(text)
    assert words in str(exc.value)


def test_settings_parse_and_describe():
    s = parse_assignments("temperature=0.7, top_p=0.9 seed=7 max_tokens=64")
    assert (s.temperature, s.top_p, s.seed, s.max_new_tokens) == (0.7, 0.9, 7, 64)
    assert "top_p=0.9" in s.describe(against=SamplingParams())
    assert SamplingParams.from_dict(s.to_dict()) == s
    assert parse_assignments("temperature=0").greedy
    # as the app shows them (the status line, a comparison's labels), and mixed
    shown = parse_assignments("temp 0.4 · max 64, top_p=0.9 seed 7")
    assert (shown.temperature, shown.max_new_tokens, shown.top_p, shown.seed) == (0.4, 64, 0.9, 7)
    from chatui.state import settings_label

    assert parse_assignments(settings_label(shown)) == shown


@pytest.mark.parametrize("scale, fast", [(8.0, True), (0.05, False)])
def test_top_p_over_a_large_vocabulary_matches_reference(scale, fast):
    """Past TOP_P_CANDIDATES tokens the nucleus is found among the most likely ones (a peaked
    row) or by the full sort (a flat row whose nucleus is wider; alone when its neighbours'
    nuclei fit): both as transformers'."""
    from inference.sampling import TOP_P_CANDIDATES, _top_p_keep

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 8 * TOP_P_CANDIDATES[0], generator=g) * scale
    ps = torch.tensor([0.1, 0.5, 0.9, 0.95, 0.999])
    wide = [False] * 5 if fast else [False, True, True, True, True]  # flat: 10% fits in 256
    assert _top_p_keep(logits, ps)[1].tolist() == wide
    if fast:  # a flat row among peaked ones: only it is sorted in full
        logits[2] *= 0.05 / scale
        assert _top_p_keep(logits, ps)[1].tolist() == [False, False, True, False, False]
    out = top_p_filter(logits, ps)
    for b, p in enumerate(ps.tolist()):
        ref = TopPLogitsWarper(p)(None, logits[b:b + 1].clone())
        assert torch.equal(torch.isinf(out[b:b + 1]), torch.isinf(ref))
    wider = torch.cat([logits, torch.randn(5, 8 * TOP_P_CANDIDATES[1], generator=g) * 0.02], -1)
    out = top_p_filter(wider, ps)  # the second tier (4,096 candidates), past it the third
    for b, p in enumerate(ps.tolist()):
        ref = TopPLogitsWarper(p)(None, wider[b:b + 1].clone())
        assert torch.equal(torch.isinf(out[b:b + 1]), torch.isinf(ref))
    widest = torch.cat([wider, torch.randn(5, 4 * TOP_P_CANDIDATES[2], generator=g) * 0.01], -1)
    out = top_p_filter(widest, ps)  # the third tier (16,384 candidates), past it the sort
    for b, p in enumerate(ps.tolist()):
        ref = TopPLogitsWarper(p)(None, widest[b:b + 1].clone())
        assert torch.equal(torch.isinf(out[b:b + 1]), torch.isinf(ref))


def test_filtered_rows_sample_their_renormalised_distribution_seeded_per_row():
    """A row its filters cut to a few tokens races only those: the draws follow the kept
    tokens' renormalised probabilities, and a seeded row draws the same tokens whatever its
    neighbours are."""
    vocab = 1000
    probs = torch.full((vocab,), 1e-4)
    probs[[10, 500, 999]] = torch.tensor([0.5, 0.3, 0.15])
    logits = (probs / probs.sum()).log()[None]
    one = RowSampling.build([SamplingParams(temperature=1.0, top_k=3, seed=5)],
                            torch.device("cpu"))
    two = RowSampling.build([SamplingParams(temperature=0.0),
                             SamplingParams(temperature=1.0, top_k=3, seed=5)],
                            torch.device("cpu"))
    counts = torch.zeros(vocab)
    for _ in range(3000):
        a = int(sample_rows(process_logits(logits, None, one), one)[0])
        b = sample_rows(process_logits(logits.expand(2, -1), None, two), two)
        assert int(b[0]) == 10 and int(b[1]) == a
        counts[a] += 1
    kept = torch.tensor([0.5, 0.3, 0.15]) / 0.95
    assert counts.sum() == counts[[10, 500, 999]].sum()
    assert torch.allclose(counts[[10, 500, 999]] / counts.sum(), kept, atol=0.03)


def test_a_draw_at_either_end_of_the_unit_interval_takes_a_kept_token(monkeypatch):
    """The CPU draw takes the first token whose cumulative probability passes u x total: u = 0
    gives the first kept token and u just below 1 the last one, never a removed token
    (probability 0) before, between or after them."""
    logits = torch.full((1, 50), float("-inf"))
    logits[0, [3, 17, 40]] = torch.tensor([0.0, 1.0, 2.0])
    rows = RowSampling.build([SamplingParams(temperature=1.0, seed=1)], torch.device("cpu"))
    for u, want in ((0.0, 3), (1 - 2 ** -53, 40), (0.999999, 40)):
        monkeypatch.setattr(torch, "rand", lambda *a, u=u, **k: torch.tensor([u], dtype=torch.float64))
        assert int(sample_rows(logits, rows)[0]) == want
