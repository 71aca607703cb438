"""Scoring a text (issue 17, part 3): the engine's prefill against a full forward's
log_softmax in float64, the worker's ``score`` in both hosts, the scripted and OpenAI
backends."""

from __future__ import annotations

import threading

import pytest
import torch

from inference.engine import LocalBackend
from inference.types import Failed, PromptProgress, Scored, ScoreRequest

TEXT = "The cat sat on the mat. It was a sunny day 🙂 and 日本語 too."


def full_forward(ckpt, ids):
    """log_softmax of a full forward over ids, float64: row t predicts ids[t + 1]."""
    with torch.no_grad():
        logits = ckpt.model(torch.tensor([ids])).logits[0]
    return torch.log_softmax(logits.double(), dim=-1)


def check_against_forward(ckpt, scored: Scored, k: int) -> None:
    ids = [t.id for t in scored.tokens]
    assert ids == ckpt.tokenizer(TEXT)["input_ids"]
    lp = full_forward(ckpt, ids)
    first = scored.tokens[0]
    assert first.logprob is None and first.top == () and scored.ranks[0] is None
    for t, rank in zip(scored.tokens[1:], scored.ranks[1:]):
        row = lp[t.index - 1]
        assert t.logprob == pytest.approx(row[t.id].item(), abs=1e-4)
        assert rank == int((row > row[t.id] + 1e-6).sum()) + 1
        ent = -(row.exp() * row).sum().item()
        assert t.entropy == pytest.approx(ent, abs=1e-4)
        top = torch.topk(row, k)
        assert [a.id for a in t.top] == top.indices.tolist()
        for a, v in zip(t.top, top.values.tolist()):
            assert a.logprob == pytest.approx(v, abs=1e-4)
    mean = sum(lp[i - 1, ids[i]].item() for i in range(1, len(ids))) / (len(ids) - 1)
    assert scored.perplexity == pytest.approx(torch.tensor(-mean).exp().item(), rel=1e-4)
    assert "".join(t.text for t in scored.tokens) == ckpt.tokenizer.decode(ids)


def score(backend, text=TEXT, k=5):
    return list(backend.score(ScoreRequest(text, k), threading.Event()))


@pytest.mark.parametrize("chunk", [512, 5])
def test_score_matches_full_forward_tiny(tiny_ckpt, chunk):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    backend.prefill_chunk = chunk
    events = score(backend, k=4)
    assert isinstance(events[-1], Scored)
    progress = [e for e in events if isinstance(e, PromptProgress)]
    assert bool(progress) == (chunk == 5)
    check_against_forward(tiny_ckpt, events[-1], 4)


def test_score_matches_full_forward_default_model(default_ckpt):
    backend = LocalBackend.from_checkpoint(default_ckpt)
    backend.prefill_chunk = 7
    events = score(backend)
    check_against_forward(default_ckpt, events[-1], 5)


def test_score_leaves_the_conversation_cache_alone(tiny_ckpt):
    from inference.settings import SamplingParams
    from inference.types import GenerationRequest, Message

    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    req = GenerationRequest((Message("user", "Hi"),), (SamplingParams(temperature=0,
                                                                      max_new_tokens=3),))
    list(backend.generate(req, threading.Event()))
    before = backend.cached_ids
    score(backend)
    assert backend.cached_ids == before


def test_score_refuses_a_text_longer_than_the_context(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    events = score(backend, "word " * 600)
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert "too long to score" in events[0].message


def test_score_request_validates():
    with pytest.raises(ValueError, match="no text"):
        ScoreRequest("")
    with pytest.raises(ValueError, match="top_logprobs"):
        ScoreRequest("a", 21)


def test_scripted_score_is_deterministic():
    from inference.scripted import ScriptedBackend

    a, b = score(ScriptedBackend(), "one two three four"), score(ScriptedBackend(),
                                                                 "one two three four")
    assert a == b and isinstance(a[0], Scored)
    s = a[0]
    assert "".join(t.text for t in s.tokens) == "one two three four"
    assert s.tokens[0].logprob is None and s.scored == 3
    assert s.least_likely(1)[0].logprob == min(t.logprob for t in s.tokens[1:])


@pytest.mark.parametrize("isolate", [False, True])
async def test_worker_scores_in_both_hosts(isolate, tmp_path):
    from inference.scripted import ScriptedFactory
    from inference.worker import InferenceWorker

    w = InferenceWorker(ScriptedFactory(), isolate=isolate, log_file=tmp_path / "engine.log")
    await w.load().collect()
    events = await w.score(ScoreRequest("alpha beta gamma", 2)).collect()
    assert len(events) == 1 and isinstance(events[0], Scored)
    assert [t.text for t in events[0].tokens] == ["alpha", " beta", " gamma"]
    await w.aclose()


# ---- chatui score ----

def chatui(*args: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "chatui", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_cli_score_json_equals_full_forward(tiny_ckpt, tiny_model_dir, tmp_path):
    import json

    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    r = chatui("score", str(path), "--json", "--top-logprobs", "3", "--ckpt", str(tiny_model_dir),
               "--quantize", "none")  # int8 (the CPU default) is not exact
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    toks, summary = lines[:-1], lines[-1]
    ids = [t["id"] for t in toks]
    assert ids == tiny_ckpt.tokenizer(TEXT)["input_ids"]
    lp = full_forward(tiny_ckpt, ids)
    assert toks[0]["logprob"] is None and toks[0]["rank"] is None
    for t in toks[1:]:
        row = lp[t["index"] - 1]
        assert t["logprob"] == pytest.approx(row[t["id"]].item(), abs=1e-4)
        assert t["rank"] == int((row > row[t["id"]] + 1e-6).sum()) + 1
        assert [a["id"] for a in t["top"]] == torch.topk(row, 3).indices.tolist()
    mean = sum(t["logprob"] for t in toks[1:]) / (len(toks) - 1)
    assert summary["type"] == "score" and summary["scored_tokens"] == len(toks) - 1
    assert summary["perplexity"] == pytest.approx(torch.tensor(-mean).exp().item(), rel=1e-6)


def test_cli_score_table_on_the_scripted_backend():
    r = chatui("score", "-p", "one two three", "--backend", "scripted")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:5] == ["#", "logprob", "prob", "rank", "entropy"]
    assert len(lines) == 5 and lines[-1].startswith("perplexity ")
    assert "over 2 scored tokens" in lines[-1]


@pytest.mark.parametrize("args, words", [
    (["score"], "give the text to score as FILE or with -p TEXT"),
    (["score", "x.txt", "-p", "hi"], "give the text to score as FILE or with -p TEXT"),
    (["score", "-p", "  "], "the text given with -p is empty"),
    (["score", "/no/such/file"], "cannot read the text file"),
    (["score", "-p", "hi", "--top-logprobs", "21"], "--top-logprobs must be between 0 and 20"),
])
def test_cli_score_bad_input_is_one_sentence_and_exit_2(args, words):
    r = chatui(*args, "--backend", "scripted")
    assert r.returncode == 2, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


def test_cancel_stops_scoring_a_long_text_between_two_layers(tiny_backend):
    """/score of a long text stops before the model's next layer when cancelled (it finished
    the 512-token chunk it was reading first), and says nothing (no Scored)."""
    from test_engine import _SetAfter

    tiny_backend.prefill_chunk = 1024
    cancel = _SetAfter(3)  # before the chunk, before layer 0, then before layer 1: stop
    events = list(tiny_backend.score(ScoreRequest("word " * 300, top_logprobs=3), cancel))
    assert not any(isinstance(e, Scored) for e in events) and cancel.asked == 3
    scored = list(tiny_backend.score(ScoreRequest("word " * 300, top_logprobs=3),
                                     threading.Event()))
    assert isinstance(scored[-1], Scored)  # (the backend is still usable)
