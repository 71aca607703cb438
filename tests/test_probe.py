"""``/probe TEXT`` (issue 17, part 4): the probability that the next token at a point of a
reply would be TEXT, its first token's rank over the whole vocabulary, and the whole text's
probability by a forced continuation, against a full forward's float64 log-softmax."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from inference.chat import encode_request
from inference.engine import LocalBackend
from inference.types import (AssistantPrefix, Failed, Message, Scored, ScoreRequest)

CONTEXT = (Message("system", "Be brief."), Message("user", "Where is the cat?"))


def reference(ckpt, ids: list[int], text_ids: list[int]) -> tuple[list[float], list[int]]:
    """Each text token's logprob and rank (1 = the most likely) from one full forward over
    the context and the text, in float64."""
    with torch.no_grad():
        logits = ckpt.model(torch.tensor([ids + text_ids])).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    out, ranks = [], []
    for j, tid in enumerate(text_ids):
        row = lp[len(ids) + j - 1]
        out.append(float(row[tid]))
        ranks.append(int((row > row[tid]).sum()) + 1)
    return out, ranks


@pytest.mark.parametrize("prefix, text", [
    (None, "The cat sat on the mat"),
    (AssistantPrefix("It is on the", None), " sofa, asleep."),
    (AssistantPrefix("", None), "日本"),
])
def test_probe_equals_a_full_forwards_log_softmax(tiny_ckpt, prefix, text):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    backend.prefill_chunk = 7  # the context is read in several chunks
    req = ScoreRequest(text, top_logprobs=3, context=CONTEXT, prefix=prefix)
    events = list(backend.score(req, threading.Event()))
    scored = events[-1]
    assert isinstance(scored, Scored)
    tok = tiny_ckpt.tokenizer
    ids = encode_request(tok, CONTEXT, 512, prefix, False).ids
    text_ids = tok(text, add_special_tokens=False)["input_ids"]
    assert [t.id for t in scored.tokens] == text_ids
    assert "".join(t.text for t in scored.tokens) == text
    lps, ranks = reference(tiny_ckpt, ids, text_ids)
    assert [t.logprob for t in scored.tokens] == pytest.approx(lps, abs=1e-4)
    assert list(scored.ranks) == ranks
    assert max(ranks) > 3, "some token lies outside the top-k and still has its rank"
    total = sum(t.logprob for t in scored.tokens)
    assert math.exp(total) == pytest.approx(math.exp(sum(lps)), rel=1e-3)


def test_probe_after_raw_text(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    ctx = (Message("user", "Once upon a time"),)
    req = ScoreRequest(" there", context=ctx, raw=True)
    scored = list(backend.score(req, threading.Event()))[-1]
    ids = tiny_ckpt.tokenizer("Once upon a time")["input_ids"]
    text_ids = tiny_ckpt.tokenizer(" there", add_special_tokens=False)["input_ids"]
    lps, ranks = reference(tiny_ckpt, ids, text_ids)
    assert [t.logprob for t in scored.tokens] == pytest.approx(lps, abs=1e-4)
    assert list(scored.ranks) == ranks


def test_probe_leaves_the_conversation_cache_alone_and_refuses_in_one_sentence(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    from inference.settings import SamplingParams
    from inference.types import GenerationRequest

    list(backend.generate(GenerationRequest(CONTEXT, (SamplingParams(max_new_tokens=3),)),
                          threading.Event()))
    before = list(backend._cache_ids)
    assert before
    list(backend.score(ScoreRequest("x", context=CONTEXT), threading.Event()))
    assert backend._cache_ids == before
    events = list(backend.score(ScoreRequest("word " * 600, context=CONTEXT), threading.Event()))
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert events[0].message.endswith(".") and "\n" not in events[0].message
    with pytest.raises(ValueError, match="needs a context"):
        ScoreRequest("x", raw=True)


def test_a_probe_past_the_end_of_the_context_is_one_sentence(tiny_ckpt):
    """A probe at a token near the end of the context (the reply before it and the text
    together past it) was refused with the continuation's words, "The reply cannot go on",
    and the context less the text as the model's context."""
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    tok = tiny_ckpt.tokenizer
    word = tuple(tok.encode(" sea", add_special_tokens=False))
    ids = word * 500
    events = list(backend.score(ScoreRequest(" and the sky" * 5, context=CONTEXT,
                                             prefix=AssistantPrefix(tok.decode(ids), ids)),
                                threading.Event()))
    assert events == [Failed("The conversation up to there and the text to probe take more "
                             "than the model's context of 512 tokens.")]
