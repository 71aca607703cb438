"""Scoring over an OpenAI-compatible server (issue 17, part 3): vLLM's ``prompt_logprobs`` on
``POST /v1/completions``, against the fake server of ``test_openai_backend``; a server without
the extension gets one sentence."""

from __future__ import annotations

import math
import threading

import pytest
from test_openai_backend import MODEL, fake  # noqa: F401  (the fixture)

from inference.openai_backend.backend import OpenAIBackend
from inference.openai_backend.scoring import request_body
from inference.types import Failed, Message, Scored, ScoreRequest

# vLLM's answer for "Hello world!" with prompt_logprobs=2 (token ids of a made-up tokenizer
# with a BOS): null for the BOS, then per token the prompt token first, then the top 2
VLLM_ENTRIES = [
    None,
    {"9906": {"logprob": -2.5, "rank": 7, "decoded_token": "Hello"},
     "40": {"logprob": -0.5, "rank": 1, "decoded_token": "I"},
     "791": {"logprob": -1.25, "rank": 2, "decoded_token": "The"}},
    {"1917": {"logprob": -0.75, "rank": 1, "decoded_token": " world"},
     "11": {"logprob": -1.5, "rank": 2, "decoded_token": ","}},
    {"0": {"logprob": -3.0, "rank": 2, "decoded_token": "!"},
     "13": {"logprob": -0.25, "rank": 1, "decoded_token": "."}},
]


def completions(fake, answer):  # noqa: F811
    """Make the fake answer ``POST /v1/completions`` with ``answer(body)`` (status, JSON)."""
    from test_openai_backend import Handler

    original = Handler.do_POST

    def do_post(h):
        if h.path == "/v1/completions":
            import json
            body = json.loads(h.rfile.read(int(h.headers.get("Content-Length", "0"))))
            fake.requests.append(body)
            h.send_json(*answer(body))
            return
        original(h)

    return do_post


@pytest.fixture
def vllm(fake, monkeypatch):  # noqa: F811
    from test_openai_backend import Handler

    def answer(body):
        return 200, {"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                     "choices": [{"index": 0, "text": " It", "logprobs": None,
                                  "finish_reason": "length",
                                  "prompt_logprobs": VLLM_ENTRIES}]}

    monkeypatch.setattr(Handler, "do_POST", completions(fake, answer))
    return fake


def score(url, text="Hello world!", k=2, **kw):
    backend = OpenAIBackend(url, MODEL)
    try:
        return list(backend.score(ScoreRequest(text, k, **kw), threading.Event()))
    finally:
        backend.close()


def test_scores_from_vllms_prompt_logprobs(vllm):
    [scored] = score(vllm.url)
    assert isinstance(scored, Scored)
    assert vllm.requests[-1] == request_body(MODEL, "Hello world!", 2) == {
        "model": MODEL, "prompt": "Hello world!", "max_tokens": 1, "temperature": 0,
        "prompt_logprobs": 2, "stream": False}
    assert [t.text for t in scored.tokens] == ["", "Hello", " world", "!"]
    assert [t.id for t in scored.tokens] == [None, 9906, 1917, 0]
    assert [t.logprob for t in scored.tokens] == [None, -2.5, -0.75, -3.0]
    assert list(scored.ranks) == [None, 7, 1, 2]
    assert [(a.id, a.text, a.logprob) for a in scored.tokens[1].top] == [
        (40, "I", -0.5), (791, "The", -1.25)]
    assert [a.id for a in scored.tokens[2].top] == [1917, 11]  # the prompt token among them
    assert scored.perplexity == pytest.approx(math.exp((2.5 + 0.75 + 3.0) / 3))


def test_first_token_without_an_entry_gets_the_text_the_others_leave(vllm):
    VLLM_ENTRIES_NO_BOS = [None] + VLLM_ENTRIES[2:]
    from inference.openai_backend.scoring import parse_scored

    scored = parse_scored({"choices": [{"prompt_logprobs": VLLM_ENTRIES_NO_BOS}]},
                          "Hello world!", 2)
    assert [t.text for t in scored.tokens] == ["Hello", " world", "!"]
    assert scored.tokens[0].logprob is None and scored.scored == 2


def test_a_server_without_prompt_logprobs_is_one_sentence(fake, monkeypatch):  # noqa: F811
    from test_openai_backend import Handler

    plain = {"id": "c", "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
    monkeypatch.setattr(Handler, "do_POST", completions(fake, lambda body: (200, plain)))
    [failed] = score(fake.url)
    assert isinstance(failed, Failed)
    assert failed.message.startswith("The server at ")
    assert "returned no prompt logprobs" in failed.message
    assert "vLLM's prompt_logprobs" in failed.message and failed.message.count(". ") == 0
    monkeypatch.setattr(Handler, "do_POST", completions(
        fake, lambda body: (400, {"error": {"message": "unknown field prompt_logprobs"}})))
    [failed] = score(fake.url)
    assert "HTTP 400: unknown field prompt_logprobs" in failed.message
    assert failed.message.endswith("(--backend local).")


def test_probe_over_openai_is_refused_in_one_sentence(vllm):
    [failed] = score(vllm.url, " Paris", context=(Message("user", "Capital of France?"),))
    assert isinstance(failed, Failed) and "/probe needs the local engine" in failed.message


def test_chatui_scores_table_shows_no_made_up_entropy(vllm, capsys):
    from chatui.cli.output import print_score

    [scored] = score(vllm.url)
    print_score(scored)
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if "'Hello'" in line)
    assert row.split()[1:5] == ["-2.5000", "8.21%", "7", "-"]
    assert lines[-1] == "perplexity %.4g over 3 scored tokens" % scored.perplexity
