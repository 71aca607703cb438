"""Issue 18, fan-out: the alternatives at one token decoded as branches in one batch. A branch
equals a fresh run that forces the same prefix (tokens and logprobs), on the tiny model and on
the default one; ``chatui generate --fork-at`` prints them tagged by branch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from inference.engine import LocalBackend
from inference.settings import SamplingParams
from inference.types import AssistantPrefix, GenerationRequest, Message, RowDone, TokenBatch

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
MESSAGES = (Message("user", "Name three colors and say why you like them."),)


def events(backend, request):
    return list(backend.generate(request, threading.Event()))


def row_tokens(evs, row=0):
    return [t for e in evs if isinstance(e, TokenBatch) and e.row == row for t in e.tokens]


@pytest.mark.parametrize("which", ["tiny_ckpt", "default_ckpt"])
def test_each_branch_equals_a_fresh_run_from_the_same_prefix(which, request):
    ckpt = request.getfixturevalue(which)
    backend = LocalBackend.from_checkpoint(ckpt)
    base = row_tokens(events(backend, GenerationRequest(MESSAGES, (GREEDY,), top_logprobs=4)))
    at = 3
    assert len(base) > at + 2
    alternatives = base[at].top[:4]
    prefix = AssistantPrefix("".join(t.text for t in base[:at]), tuple(t.id for t in base[:at]))
    fan = events(backend, GenerationRequest(MESSAGES, (GREEDY,) * 4, top_logprobs=4,
                                            prefix=prefix,
                                            first_tokens=tuple(a.id for a in alternatives)))
    assert sum(isinstance(e, RowDone) for e in fan) == 4
    for j, alt in enumerate(alternatives):
        branch = row_tokens(fan, j)
        assert branch[0].id == alt.id  # forced, and scored as the alternative was
        assert branch[0].logprob == pytest.approx(alt.logprob, abs=1e-4)
        forced = AssistantPrefix(prefix.text + alt.text, prefix.token_ids + (alt.id,))
        fresh = row_tokens(events(LocalBackend.from_checkpoint(ckpt), GenerationRequest(
            MESSAGES, (SamplingParams(temperature=0.0, max_new_tokens=23),), top_logprobs=4,
            prefix=forced)))
        assert [t.id for t in branch[1:]] == [t.id for t in fresh], j
        for x, y in zip(branch[1:], fresh):
            assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [a.id for a in x.top] == [a.id for a in y.top]


def test_first_tokens_must_match_the_rows():
    with pytest.raises(ValueError, match="one token per settings row"):
        GenerationRequest(MESSAGES, (GREEDY,) * 2, first_tokens=(1,))


def cli(tiny_model_dir, *args):
    return subprocess.run(
        [sys.executable, "-m", "chatui", "generate", "--ckpt", str(tiny_model_dir), "-p",
         "Name three colors.", "--temperature", "0", "--max-tokens", "12", *args],
        capture_output=True, text=True, env={**os.environ}, timeout=300)


def test_generate_fork_at_prints_the_branches_tagged(tiny_model_dir):
    out = cli(tiny_model_dir, "--fork-at", "2", "--fork-k", "3", "--json")
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    base = [x for x in lines if x.get("branch") == "base" and x.get("type") == "token"]
    fork = next(x for x in lines if x.get("type") == "fork")
    assert fork["at"] == 2 and [a["branch"] for a in fork["alternatives"]] == [0, 1, 2]
    assert [a["id"] for a in fork["alternatives"]] == [a["id"] for a in base[2]["top"][:3]]
    for j in range(3):
        branch = [x for x in lines if x.get("branch") == j and x.get("type") == "token"]
        assert branch[0]["id"] == fork["alternatives"][j]["id"]
        assert any(x.get("branch") == j and x.get("type") == "done" for x in lines)


@pytest.mark.parametrize("args, said", [
    (("--fork-k", "3"), "--fork-k needs --fork-at"),
    (("--fork-at", "1", "--fork-k", "9"), "between 2 and 8"),
    (("--fork-at", "1", "--fork-k", "6", "--top-logprobs", "5"), "raise --top-logprobs"),
    (("--fork-at", "500"), "--fork-at must be below"),
])
def test_generate_fork_refusals_are_one_sentence(tiny_model_dir, args, said):
    out = cli(tiny_model_dir, *args)
    assert out.returncode == 2 and said in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
