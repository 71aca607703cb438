"""Scoring a text over an OpenAI-compatible server: vLLM's ``prompt_logprobs``.

The OpenAI API returns logprobs of generated tokens only; vLLM's completions endpoint also
takes ``"prompt_logprobs": k`` and answers, on the choice, one entry per prompt token: ``null``
for the first (nothing before it), else ``{"<id>": {"logprob", "rank", "decoded_token"}, ...}``
holding the prompt token itself first (vLLM builds the dict with it first, then the top-k;
``rank`` is its rank over the whole vocabulary) and the ``k`` most likely tokens (ranks 1..k).
A server without the extension (llama.cpp, SGLang, OpenAI) ignores or rejects the field: the
answer is then one sentence saying so.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import httpx

from ..types import Alternative, Event, Failed, Scored, ScoreRequest, Token
from .protocol import server_words
from .transport import Server


def no_prompt_logprobs(where: str, why: str = "") -> str:
    """The one sentence for a server that does not return prompt logprobs."""
    return (f"The server at {where} returned no prompt logprobs{why}: scoring a text over the "
            "OpenAI API needs vLLM's prompt_logprobs extension (llama.cpp's and SGLang's "
            "servers lack it); score with vLLM or the local engine (--backend local).")


PROBE_UNSUPPORTED = ("/probe needs the local engine (--backend local): over the OpenAI API "
                     "the conversation's template and the reply's exact tokens are the "
                     "server's, so a text cannot be placed after them token for token.")


def request_body(model: str, text: str, k: int) -> dict[str, Any]:
    """What vLLM's ``POST /v1/completions`` takes to score ``text``: its prompt logprobs with
    the top ``k`` alternatives, and one generated token (the least it allows)."""
    return {"model": model, "prompt": text, "max_tokens": 1, "temperature": 0,
            "prompt_logprobs": k, "stream": False}


def parse_scored(data: Any, text: str, k: int) -> Scored | None:
    """The ``Scored`` in a completions answer; None when it holds no prompt logprobs."""
    if not isinstance(data, dict):
        return None
    choices = data.get("choices")
    entries = None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        entries = choices[0].get("prompt_logprobs")
    if entries is None:
        entries = data.get("prompt_logprobs")  # (vLLM's chat answers carry it at the top)
    if not isinstance(entries, list) or not entries:
        return None
    tokens: list[Token] = []
    ranks: list[int | None] = []
    for i, entry in enumerate(entries):
        if entry is None:
            tokens.append(Token(i, None, "", None, None))
            ranks.append(None)
            continue
        if not isinstance(entry, dict) or not entry:
            return None
        items = []
        for key, v in entry.items():
            if not (isinstance(v, dict) and isinstance(v.get("logprob"), (int, float))):
                return None
            tid = int(key) if str(key).lstrip("-").isdigit() else None
            rank = v.get("rank") if isinstance(v.get("rank"), int) else None
            items.append((tid, str(v.get("decoded_token") or ""), float(v["logprob"]), rank))
        tid, piece, lp, rank = items[0]  # the prompt token comes first
        top = sorted((it for it in items if it[3] is not None and it[3] <= k),
                     key=lambda it: it[3])
        tokens.append(Token(i, tid, piece, lp, None,
                            tuple(Alternative(a[0], a[1], a[2]) for a in top[:k]), raw=piece))
        ranks.append(rank)
    # the first token(s) come with no entry: their text is what the others leave of the text
    rest = "".join(t.text for t in tokens if t.logprob is not None)
    if tokens and tokens[0].logprob is None and text.endswith(rest):
        head = text[:len(text) - len(rest)]
        tokens[0] = Token(0, None, head, None, None, raw=head)
    return Scored(tuple(tokens), tuple(ranks))


def score_over_openai(server: Server, request: ScoreRequest,
                      cancel: threading.Event) -> Iterator[Event]:
    """``Backend.score`` over ``server``: one completions request (see the module docstring)."""
    where = server.endpoint.display
    if request.context is not None:
        yield Failed(PROBE_UNSUPPORTED)
        return
    body = request_body(server.model, request.text, request.top_logprobs)
    try:
        response = server.client.post(server.endpoint.api_root + "/completions", json=body)
    except httpx.HTTPError as exc:
        yield Failed(server.describe_transport(exc))
        return
    if cancel.is_set():
        return
    if response.status_code >= 400:
        words = server_words(response.text)
        yield Failed(no_prompt_logprobs(
            where, f" (HTTP {response.status_code}{': ' + words if words else ''})"))
        return
    try:
        data = response.json()
    except ValueError:
        data = None
    scored = parse_scored(data, request.text, request.top_logprobs)
    yield scored if scored is not None else Failed(no_prompt_logprobs(where))
