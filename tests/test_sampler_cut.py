"""What the sampler did (issue 17, part 4): per token, the probability after the sampler chain,
the filter that removed each alternative and the nucleus size, against transformers' own logits
processors chained as ``generate`` chains them."""

from __future__ import annotations

import base64
import json
import threading
from array import array

import pytest
import torch
from transformers.generation.logits_process import (MinPLogitsWarper,
                                                    RepetitionPenaltyLogitsProcessor,
                                                    TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from inference.engine import LocalBackend
from inference.sampling import CUT_NAMES, RowSampling, decode_step_outputs
from inference.settings import SamplingParams
from inference.types import GenerationRequest, Message, SamplerCut, Token, TokenBatch

V = 200


def reference(logits: torch.Tensor, seen_ids: torch.Tensor, s: SamplingParams
              ) -> tuple[torch.Tensor, list[str], int]:
    """transformers' chain on one row [V] (in ``generate``'s order, each processor only when
    ``generate`` would add it): (probabilities [V], what removed each token, nucleus size)."""
    x = logits[None].clone().double()
    ids = seen_ids[None]
    if s.repetition_penalty != 1:
        x = RepetitionPenaltyLogitsProcessor(s.repetition_penalty)(ids, x)
    cut = [""] * logits.shape[-1]
    if s.temperature == 0:  # greedy: generate applies no warper and takes the argmax
        best = int(x[0].argmax())
        probs = torch.zeros(logits.shape[-1], dtype=torch.float64)
        probs[best] = 1
        return probs, ["" if i == best else "greedy" for i in range(len(cut))], 1
    warpers = [("", TemperatureLogitsWarper(s.temperature))]
    if s.top_k > 0:
        warpers.append(("top-k", TopKLogitsWarper(s.top_k)))
    if s.top_p < 1:
        warpers.append(("top-p", TopPLogitsWarper(s.top_p)))
    if s.min_p > 0:
        warpers.append(("min-p", MinPLogitsWarper(s.min_p)))
    for name, warper in warpers:
        x = warper(ids, x)
        for i in torch.isinf(x[0]).nonzero()[:, 0].tolist():
            cut[i] = cut[i] or name
    return x[0].softmax(-1), cut, int(torch.isfinite(x[0]).sum())


ROWS = [
    SamplingParams(temperature=0.7, top_k=20, top_p=0.8, min_p=0.02, repetition_penalty=1.2,
                   seed=1),
    SamplingParams(temperature=1.3, top_p=0.5, seed=2),
    SamplingParams(temperature=0.9, min_p=0.1, seed=3),
    SamplingParams(temperature=1.0, top_k=3, seed=4),
    SamplingParams(temperature=1.0, seed=5),
    SamplingParams(temperature=0, repetition_penalty=1.5),
]


def unpack(row: list[float], k: int) -> tuple[int, list[int], SamplerCut]:
    base = 3 + 2 * k
    cut = SamplerCut(row[base], int(row[base + 1]), tuple(row[base + 2: base + 2 + k]),
                     tuple(CUT_NAMES[int(c)] for c in row[base + 2 + k:]))
    return int(row[0]), [int(i) for i in row[3:3 + k]], cut


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_post_sampler_probabilities_equal_transformers_processors(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(ROWS), V, generator=g) * 3
    seen_ids = torch.tensor([3, 7, 9, 150, int(logits[0].argmax())])
    seen = torch.zeros(len(ROWS), V, dtype=torch.bool)
    seen[:, seen_ids] = True
    rows = RowSampling.build(ROWS, torch.device("cpu"))
    k = 20
    ids, packed = decode_step_outputs(logits, seen, rows, k)
    assert packed.shape == (len(ROWS), 5 + 4 * k)
    for b, s in enumerate(ROWS):
        chosen, top_ids, cut = unpack(packed[b].tolist(), k)
        probs, removed, nucleus = reference(logits[b], seen_ids, s)
        assert chosen == int(ids[b])
        assert probs[chosen] > 0, "the sampler drew a token its chain had removed"
        assert cut.prob == pytest.approx(float(probs[chosen]), abs=1e-6)
        assert cut.nucleus == nucleus
        assert cut.top_probs == pytest.approx([float(probs[i]) for i in top_ids], abs=1e-6)
        assert list(cut.top_cuts) == [removed[i] for i in top_ids]
    # every filter is seen removing something in these rows
    names = {c for b in range(len(ROWS)) for c in unpack(packed[b].tolist(), k)[2].top_cuts}
    assert {"top-k", "top-p", "min-p", "greedy", ""} <= names


def test_no_alternatives_still_gives_the_chosen_tokens_cut():
    logits = torch.randn(2, V)
    rows = RowSampling.build([SamplingParams(temperature=0.5, top_k=4, seed=0),
                              SamplingParams(temperature=0)], torch.device("cpu"))
    ids, packed = decode_step_outputs(logits, None, rows, 0)
    assert packed.shape == (2, 5)
    assert packed[1, 3:].tolist() == [1.0, 1.0]  # greedy: certain, a nucleus of one
    assert int(packed[0, 4]) == 4


def _generated(backend: LocalBackend, text: str, s: SamplingParams, k: int = 8) -> list[Token]:
    req = GenerationRequest((Message("user", text),), (s,), top_logprobs=k, raw=True)
    return [t for e in backend.generate(req, threading.Event()) if isinstance(e, TokenBatch)
            for t in e.tokens]


@pytest.mark.parametrize("s", [
    SamplingParams(temperature=0.8, top_k=12, top_p=0.9, min_p=0.05, repetition_penalty=1.3,
                   seed=11, max_new_tokens=12),
    SamplingParams(temperature=1.5, top_p=0.6, seed=5, max_new_tokens=12),
    SamplingParams(temperature=0, repetition_penalty=1.2, max_new_tokens=6),
])
def test_engine_tokens_carry_the_chains_output_on_the_tiny_model(tiny_ckpt, s):
    """Each generated token's ``sampler`` equals the chain run by transformers' processors on a
    full forward of transformers' model over the same ids (cuts compared where the token is
    not within float noise of a filter's threshold)."""
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    text = "The quick brown fox jumps over"
    toks = _generated(backend, text, s)
    assert toks and all(t.sampler is not None for t in toks)
    ids = list(tiny_ckpt.tokenizer(text)["input_ids"])
    for t in toks:
        with torch.no_grad():
            logits = tiny_ckpt.model(torch.tensor([ids])).logits[0, -1].double()
        probs, removed, nucleus = reference(logits, torch.tensor(ids), s)
        cut = t.sampler
        assert cut.prob == pytest.approx(float(probs[t.id]), abs=1e-4)
        assert cut.nucleus == nucleus
        assert len(cut.top_probs) == len(cut.top_cuts) == len(t.top) == 8
        for alt, p, c in zip(t.top, cut.top_probs, cut.top_cuts):
            assert p == pytest.approx(float(probs[alt.id]), abs=1e-4)
            assert c == removed[alt.id]
        ids.append(t.id)


def test_forced_and_scored_tokens_have_no_sampler_record(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    req = GenerationRequest((Message("user", "hi"),), (SamplingParams(max_new_tokens=2),),
                            first_tokens=(42,))
    toks = [t for e in backend.generate(req, threading.Event()) if isinstance(e, TokenBatch)
            for t in e.tokens]
    assert toks[0].id == 42 and toks[0].sampler is None
    assert all(t.sampler is not None for t in toks[1:])


# ---- the record: TokenRecords columns and transcripts --------------------------------

def _with_cuts() -> list[Token]:
    from inference.types import Alternative

    alts = (Alternative(5, "a", -0.5), Alternative(6, "b", -1.5), Alternative(7, "c", -3.0))
    return [
        Token(0, 5, "a", -0.5, 1.0, alts, sampler=SamplerCut(0.75, 2, (0.75, 0.25, 0.0),
                                                              ("", "", "top-p"))),
        Token(1, 6, "b", -1.5, 1.0, alts),  # none recorded (a forced token)
        Token(2, 7, "c", -3.0, 1.0, alts[:2], sampler=SamplerCut(1.0, 1, (0.0, 0.0),
                                                                  ("greedy", "greedy"))),
        Token(3, 8, "d", -0.1, 0.5, (), sampler=SamplerCut(0.5, 49152)),
        Token(4, 9, "e", -0.1, 0.5, alts, sampler=SamplerCut(0.1, 3, (0.6, 0.3, 0.1),
                                                              ("min-p", "top-k", ""))),
    ]


def test_token_records_keep_the_sampler_columns():
    from chatui.token_records import TokenRecords

    tokens = _with_cuts()
    records = TokenRecords(tokens)
    assert list(records) == tokens
    assert [records.sampler_at(i) for i in range(5)] == [t.sampler for t in tokens]
    copy = records.copy()
    records.truncate(2)
    records.append(tokens[4])
    assert list(records) == tokens[:2] + [tokens[4]]
    assert list(copy) == tokens and copy == TokenRecords(tokens)
    assert copy != TokenRecords(tokens[:4] + [Token(4, 9, "e", -0.1, 0.5, tokens[4].top)])


def _sampler_doc():
    from chatui.conversation import Conversation
    from chatui.transcript import to_json_dict

    conv = Conversation()
    conv.add_user("go")
    entry = conv.add_assistant([SamplingParams()])
    entry.replies[0].tokens = _with_cuts()
    return conv, json.loads(json.dumps(to_json_dict(conv)))


def _column(tokens: dict, key: str, typecode: str) -> array:
    return array(typecode, base64.b64decode(tokens[key]))


def test_transcripts_keep_the_sampler_record_and_read_files_without_it():
    from chatui.transcript import from_json_dict

    conv, doc = _sampler_doc()
    saved = doc["messages"][1]["replies"][0]["tokens"]
    assert list(_column(saved, "sampler_prob", "d")) == [0.75, 0.0, 1.0, 0.5, 0.1]  # 1: none
    assert list(_column(saved, "sampler_nucleus", "q")) == [2, 0, 1, 49152, 3]
    assert list(_column(saved, "sampler_top_prob", "d")) == [0.75, 0.25, 0.0, 0.0, 0.0,
                                                              0.6, 0.3, 0.1]
    # kept, kept, top-p; greedy x2; min-p, top-k, kept
    assert list(_column(saved, "sampler_top_cut", "B")) == [0, 0, 2, 4, 4, 3, 1, 0]
    back = from_json_dict(doc)
    assert list(back.entries[1].replies[0].tokens) == _with_cuts()
    # an older file (no sampler columns) reads as before: no record
    for key in [k for k in saved if k.startswith("sampler_")]:
        del saved[key]
    old = from_json_dict(doc)
    assert all(t.sampler is None for t in old.entries[1].replies[0].tokens)


def _set(key: str, typecode: str, i: int, value: object):  # type: ignore[no-untyped-def]
    def edit(tokens: dict) -> None:
        column = _column(tokens, key, typecode)
        column[i] = value  # type: ignore[call-overload]
        tokens[key] = base64.b64encode(column.tobytes()).decode()
    return edit


@pytest.mark.parametrize("edit, words", [
    (_set("sampler_prob", "d", 0, 2.0), "sampler_prob holds a value that is not a probability"),
    (_set("sampler_top_cut", "B", 0, 9), "sampler_top_cut holds an unknown filter"),
    (_set("sampler_top_ends", "Q", 0, 2), "sampler_top_ends gives token 0 a record for each of 2"),
])
def test_a_bad_sampler_record_is_one_sentence(edit, words):
    from chatui.transcript import TranscriptError, from_json_dict

    _, doc = _sampler_doc()
    edit(doc["messages"][1]["replies"][0]["tokens"])
    with pytest.raises(TranscriptError, match=words):
        from_json_dict(doc)


def test_generate_json_carries_what_the_sampler_did():
    from chatui.cli.output import token_json

    tok = _with_cuts()[0]
    d = token_json(tok)
    assert d["sampled_prob"] == 0.75 and d["nucleus"] == 2
    assert [(a["sampled_prob"], a["cut"]) for a in d["top"]] == [
        (0.75, None), (0.25, None), (0.0, "top-p")]
    plain = token_json(_with_cuts()[1])
    assert "sampled_prob" not in plain and all("cut" not in a for a in plain["top"])
