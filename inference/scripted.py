"""A deterministic backend with no model: replies from a script, with made-up but stable logprobs.

Used by the app's tests and snapshots (stable pictures) and by ``chatui --backend scripted``
for trying the interface without a model.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterator

from .types import (
    Alternative,
    Event,
    GenerationRequest,
    Message,
    ModelInfo,
    PromptProgress,
    RowDone,
    Scored,
    ScoreRequest,
    Started,
    Token,
    TokenBatch,
    Usage,
)

ReplyFn = Callable[[GenerationRequest, int], "str | tuple[str, str]"]
"""A script: the reply's text, or ``(reasoning, answer)`` for a reply that reasons first."""


def echo_reply(request: GenerationRequest, row: int) -> str | tuple[str, str]:
    """The default script: a short Markdown reply that quotes the last user message; with
    ``/think on`` (``request.thinking``) it reasons first."""
    last = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
    s = request.settings[row]
    answer = (f"You said: {last}\n\nHere is a list:\n\n- one\n- two\n\n"
              f"```python\nprint({row} + {s.temperature:g})\n```\n")
    if request.thinking:
        return (f"The user wrote {last!r}. I should quote it back, then show a list and a "
                f"short code block. Two items are enough.", answer)
    return answer


THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class _Planned:
    """One scripted token before it is sent."""

    text: str
    channel: str = "answer"
    marker: str = ""
    """The marker's spelling when this is one (shown in the raw view only)."""


def _plan(script: str | tuple[str, str], budget: int | None) -> list[_Planned]:
    """A script's tokens: word-like pieces; a reasoning reply is ``<think>``, its reasoning
    (cut after ``budget`` pieces, as the engine's reasoning budget does), ``</think>``, then
    the answer after a blank line (as Qwen3 writes it: ``</think>\n\n``)."""
    if isinstance(script, str):
        return [_Planned(p) for p in split_tokens(script)]
    reasoning, answer = script
    pieces = split_tokens(reasoning)
    if budget is not None:
        pieces = pieces[:budget]
    return ([_Planned("", "reasoning", THINK_OPEN)]
            + [_Planned(p, "reasoning") for p in pieces]
            + [_Planned("", "reasoning", THINK_CLOSE)]
            + [_Planned(p) for p in split_tokens("\n\n" + answer)])


_TOKEN_RE = re.compile(r"\s*\S+|\s+")


def split_tokens(text: str) -> list[str]:
    """Split text into word-like pieces that concatenate back to it."""
    return _TOKEN_RE.findall(text)


def _score(piece: str, index: int, row: int) -> float:
    h = hashlib.sha256(f"{piece}|{index}|{row}".encode()).digest()
    return -4.0 * (h[0] / 255.0) ** 2  # logprob in [-4, 0]


KEPT_REQUESTS = 32


class ScriptedBackend:
    """Streams scripted replies token by token; honours cancel, max tokens and stop strings."""

    def __init__(self, reply: ReplyFn = echo_reply, *, delay_s: float = 0.0,
                 context_limit: int = 4096, name: str = "scripted") -> None:
        self.reply = reply
        self.delay_s = delay_s
        self.info = ModelInfo(name=name, backend="scripted", device="cpu", dtype="none",
                              context_limit=context_limit, reasoning="think",
                              thinking_switch=True)
        self.requests: deque[GenerationRequest] = deque(maxlen=KEPT_REQUESTS)
        """The latest requests (for tests); a long session must not keep every one, each
        holding the whole conversation's messages."""
        self.resets = 0
        self.scored: deque[ScoreRequest] = deque(maxlen=KEPT_REQUESTS)
        """The latest score requests (for tests)."""
        self.prefill_chunk = 512
        """Prompts longer than this report ``PromptProgress`` per chunk, as the engine does."""

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        return sum(len(split_tokens(m.content)) + 4 for m in messages)

    def reset(self) -> None:
        self.resets += 1

    def close(self) -> None:
        pass

    exit_on: str | None = None

    def score(self, request: ScoreRequest, cancel: threading.Event) -> Iterator[Event]:
        """Score a text with the same made-up logprobs as replies (word-like tokens; the first
        has nothing before it, so no logprob, as with a tokenizer that adds no BOS; after a
        ``context`` every token has one)."""
        self.scored.append(request)
        tokens, ranks = [], []
        for i, piece in enumerate(split_tokens(request.text)):
            if i == 0 and request.context is None:
                tokens.append(Token(index=0, id=None, text=piece, logprob=None, entropy=None))
                ranks.append(None)
                continue
            lp = _score(piece, i, 0)
            alts = [Alternative(None, piece, lp)]
            alts += [Alternative(None, f"alt{k}", -0.25 * k) for k in range(1, request.top_logprobs)]
            alts.sort(key=lambda a: -a.logprob)
            tokens.append(Token(index=i, id=None, text=piece, logprob=lp,
                                entropy=round(-lp * 0.8 + 0.1, 4),
                                top=tuple(alts[: request.top_logprobs])))
            ranks.append(1 + sum(1 for a in alts if a.logprob > lp))
        if cancel.is_set():
            return
        yield Scored(tuple(tokens), tuple(ranks))

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        if self.exit_on is not None and request.messages[-1].content == self.exit_on:
            os._exit(3)  # simulate a hard crash of the engine process
        self.requests.append(request)
        t0 = time.perf_counter()
        prompt = self.count_tokens(request.messages)
        yield Started(rows=len(request.settings), prompt_tokens=prompt, cached_tokens=0,
                      context_limit=self.info.context_limit)
        for done in range(self.prefill_chunk, prompt + self.prefill_chunk, self.prefill_chunk):
            if prompt <= self.prefill_chunk:
                break  # as the engine: one chunk says nothing
            yield PromptProgress(min(done, prompt), prompt, time.perf_counter() - t0)
        scripts = [_plan(self.reply(request, r), request.settings[r].reasoning_budget)
                   for r in range(len(request.settings))]
        texts = ["" for _ in scripts]
        done = [False] * len(scripts)
        first_at: list[float | None] = [None] * len(scripts)
        step = 0
        while not all(done):
            for row, pieces in enumerate(scripts):
                if done[row]:
                    continue
                s = request.settings[row]
                reason = None
                if cancel.is_set():
                    reason = "cancelled"
                elif step >= len(pieces):
                    reason = "stop"
                elif step >= s.max_new_tokens or prompt + step >= self.info.context_limit:
                    reason = "length"
                if reason is None:
                    planned = pieces[step]
                    piece = planned.text
                    if planned.channel == "answer":
                        candidate = texts[row] + piece
                        hit = next((st for st in s.stop if st in candidate), None)
                        if hit is not None:
                            texts[row] = candidate[: candidate.index(hit)]
                            reason = "stop"
                if reason is not None:
                    done[row] = True
                    elapsed = time.perf_counter() - t0
                    ttft = first_at[row] if first_at[row] is not None else elapsed
                    n = min(step, len(pieces))
                    tps = (n - 1) / max(elapsed - ttft, 1e-9) if n > 1 else 0.0
                    yield RowDone(row, reason, texts[row],
                                  Usage(prompt, n, 0, ttft, tps, self.info.context_limit))
                    continue
                if planned.marker:
                    tok = Token(index=step, id=None, text="", logprob=-0.01, entropy=0.05,
                                special=True, raw=planned.marker, channel="reasoning")
                else:
                    lp = _score(piece, step, row)
                    alts = [Alternative(None, piece, lp)]
                    for k in range(1, request.top_logprobs):
                        alts.append(Alternative(None, f"alt{k}", lp - k - 0.5))
                    alts.sort(key=lambda a: -a.logprob)
                    tok = Token(index=step, id=None, text=piece, logprob=lp,
                                entropy=round(-lp * 0.8 + 0.1, 4),
                                top=tuple(alts[: request.top_logprobs]),
                                channel=planned.channel)  # type: ignore[arg-type]
                    if planned.channel == "answer":
                        texts[row] += piece
                if first_at[row] is None:
                    first_at[row] = time.perf_counter() - t0
                yield TokenBatch(row, (tok,))
            step += 1
            if self.delay_s:
                time.sleep(self.delay_s)


@dataclass(frozen=True)
class ScriptedFactory:
    """A picklable factory (the isolated worker needs one). ``exit_on`` makes the backend's
    process exit abruptly when the last user message equals it (to test a crash)."""

    reply: ReplyFn = echo_reply
    delay_s: float = 0.0
    context_limit: int = 4096
    exit_on: str | None = None
    isolate: bool = False

    def __call__(self, progress: Callable[..., None]) -> ScriptedBackend:
        backend = ScriptedBackend(self.reply, delay_s=self.delay_s,
                                  context_limit=self.context_limit)
        if self.exit_on is not None:
            backend.exit_on = self.exit_on
        return backend


def perplexity(logprobs: list[float]) -> float:
    """exp(-mean logprob); 1.0 for an empty list."""
    return math.exp(-sum(logprobs) / len(logprobs)) if logprobs else 1.0
