"""``chatui generate --fork-at N --fork-k K``: a reply, then the K most likely tokens at its
token N decoded as K branches in one batch.

The branches share the reply's first N tokens: the engine prefills that prefix once, expands
the cache to K rows and forces row j's first token to the j-th alternative
(``GenerationRequest.first_tokens``), so a branch equals a fresh run that continues the same
prefix plus that token (``tests/test_fork.py`` checks tokens and logprobs). Every line of
``--json`` output is tagged with its ``"branch"``: ``"base"`` for the reply, then 0..K-1 in
the order of the alternatives' probability, after one ``{"type": "fork"}`` line naming them.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

from inference.types import (AssistantPrefix, Failed, GenerationRequest, RowDone, Token,
                             TokenBatch, finish_words)
from inference.worker import InferenceWorker

from .options import UserError
from .output import done_json, token_json

MAX_FORK_K = 8


def check_fork(at: int | None, k: int | None, top_logprobs: int) -> tuple[int, int] | None:
    """The (token index, branch count) asked for, or None; a bad combination is a UserError."""
    if at is None:
        if k is not None:
            raise UserError("--fork-k needs --fork-at (the token to branch at)")
        return None
    k = 3 if k is None else k
    if not 2 <= k <= MAX_FORK_K:
        raise UserError(f"--fork-k must be between 2 and {MAX_FORK_K}")
    if at < 0:
        raise UserError("--fork-at counts tokens from 0")
    if k > top_logprobs:
        raise UserError(f"--fork-k {k} needs at least {k} alternatives per token; "
                        f"raise --top-logprobs to {k}")
    return at, k


async def _collect(worker: InferenceWorker, request: GenerationRequest, as_json: bool,
                   tag: object) -> tuple[dict[int, list[Token]], dict[int, RowDone]]:
    """Run ``request``; print its events (``tag(row)`` names each row's branch) and return
    each row's tokens and end."""
    tokens: dict[int, list[Token]] = {}
    done: dict[int, RowDone] = {}
    async for group in worker.generate(request):
        for ev in group:
            if isinstance(ev, TokenBatch):
                tokens.setdefault(ev.row, []).extend(ev.tokens)
                if as_json:
                    for t in ev.tokens:
                        print(json.dumps({"branch": tag(ev.row), **token_json(t)},
                                         ensure_ascii=False))
            elif isinstance(ev, RowDone):
                done[ev.row] = ev
                if as_json:
                    print(json.dumps({"branch": tag(ev.row), **done_json(ev, None)}))
            elif isinstance(ev, Failed):
                raise UserError(ev.message)
    return tokens, done


async def fan_out(worker: InferenceWorker, request: GenerationRequest, at: int, k: int, *,
                  as_json: bool) -> None:
    """The reply to ``request`` (its first settings row), then its K branches at token ``at``."""
    info = worker.info
    if info is not None and not info.has_token_ids:
        raise UserError("--fork-at needs token ids, which this backend does not give; use a "
                        "local checkpoint")
    base = replace(request, settings=request.settings[:1])
    tokens, done = await _collect(worker, base, as_json, lambda row: "base")
    reply = tokens.get(0, [])
    if not as_json:
        print("".join(t.text for t in reply))
    if at >= len(reply):
        raise UserError(f"the reply has {len(reply)} tokens; --fork-at must be below that")
    fork = reply[at]
    alternatives = fork.top[:k]
    if len(alternatives) < k:
        raise UserError(f"token {at} has only {len(alternatives)} alternatives")
    if as_json:
        print(json.dumps({"type": "fork", "at": at, "alternatives": [
            {"branch": j, "id": a.id, "text": a.text, "logprob": a.logprob}
            for j, a in enumerate(alternatives)]}, ensure_ascii=False))
    prefix = AssistantPrefix("".join(t.text for t in reply[:at]),
                             tuple(t.id for t in reply[:at]))
    branches = replace(base, settings=base.settings * k, prefix=prefix,
                       first_tokens=tuple(a.id for a in alternatives))
    tokens, done = await _collect(worker, branches, as_json, lambda row: row)
    if not as_json:
        print(f"\n--- {k} branches at token {at} ({fork.text or fork.raw!r}) ---")
        for j, a in enumerate(alternatives):
            text = "".join(t.text for t in tokens.get(j, []))
            reason = finish_words(done[j].finish_reason, done[j].usage) if j in done else "?"
            body = f"{prefix.text}{text}".replace("\n", "\n    ")
            print(f"[{j}] {a.text!r} p={math.exp(a.logprob):.2%}  [{reason}]\n    {body}")
