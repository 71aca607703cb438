"""Compare mode over HTTP: one thread per settings row, each streaming its own chat completion,
their events merged into the one iterator the worker consumes; cancel (polled every
``CANCEL_POLL_S``) shuts every open row's socket so the server stops generating."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ..types import Event, Failed, GenerationRequest, Message, RowDone, Started, TokenBatch, Usage
from .protocol import ChunkMapper, chat_body
from .transport import RowAborted, RowControl, Server

log = logging.getLogger("inference.openai_backend")

CANCEL_POLL_S = 0.05


@dataclass
class RowResult:
    """What a row thread reports at its end (tokens went out as they came)."""

    row: int
    finish_reason: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None


def generate_rows(server: Server, request: GenerationRequest, cancel: threading.Event,
                  count_tokens: Callable[[tuple[Message, ...]], int],
                  context_limit: int) -> Iterator[Event]:
    """The events of ``request`` (see the package docstring): ``Started``, token batches as
    rows stream, ``RowDone`` per row that ends, one ``Failed`` last when any row failed."""
    n = len(request.settings)
    prompt_est = count_tokens(request.messages + (
        (Message("assistant", request.prefix.text),) if request.prefix else ()))
    yield Started(rows=n, prompt_tokens=prompt_est, cached_tokens=0,
                  context_limit=context_limit)
    t0 = time.perf_counter()
    events: queue.Queue[TokenBatch | RowResult] = queue.Queue()
    controls = [RowControl() for _ in range(n)]
    mappers = [ChunkMapper(request.top_logprobs) for _ in range(n)]
    first_at: list[float | None] = [None] * n
    last_at: list[float] = [0.0] * n
    counts = [0] * n
    open_rows = set(range(n))
    failures: dict[int, str] = {}
    threads = []
    for row, params in enumerate(request.settings):
        body = chat_body(server.model, request.messages, params, request.top_logprobs,
                         request.prefix)
        t = threading.Thread(target=_run_row, name=f"chatui-openai-row{row}",
                             args=(server, row, body, mappers[row], controls[row], events),
                             daemon=True)
        threads.append(t)
    for t in threads:
        t.start()
    try:
        while open_rows:
            if cancel.is_set():
                for row in sorted(open_rows):
                    controls[row].abort()
                    yield RowDone(row, "cancelled", _sent_text(mappers[row], counts[row]),
                                  _usage(prompt_est, None, counts[row], first_at[row],
                                              last_at[row], t0))
                open_rows.clear()
                break
            try:
                item = events.get(timeout=CANCEL_POLL_S)
            except queue.Empty:
                continue
            if isinstance(item, TokenBatch):
                if item.row not in open_rows:
                    continue
                now = time.perf_counter()
                if first_at[item.row] is None:
                    first_at[item.row] = now - t0
                last_at[item.row] = now - t0
                counts[item.row] += len(item.tokens)
                yield item
                continue
            row = item.row
            if row not in open_rows:
                continue
            open_rows.discard(row)
            if item.error is not None:
                failures[row] = item.error
                continue
            yield RowDone(row, item.finish_reason or "stop",  # type: ignore[arg-type]
                          _sent_text(mappers[row], counts[row]),
                          _usage(prompt_est, item.usage, counts[row], first_at[row],
                                      last_at[row], t0))
    finally:
        for c in controls:  # also when the consumer stops iterating early
            c.abort()
    if failures:
        partial = tuple(_sent_text(mappers[r], counts[r]) for r in range(n))
        yield Failed(_combine(failures, n), partial)


def _usage(prompt_est: int, usage: dict[str, Any] | None, count: int,
           first: float | None, last: float, t0: float) -> Usage:
    prompt, completion, cached = prompt_est, count, 0
    if usage:
        if isinstance(usage.get("prompt_tokens"), int):
            prompt = usage["prompt_tokens"]
        if isinstance(usage.get("completion_tokens"), int):
            completion = usage["completion_tokens"]
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = details["cached_tokens"]
    ttft = first if first is not None else time.perf_counter() - t0
    tps = (count - 1) / (last - first) if first is not None and count > 1 and last > first \
        else 0.0
    return Usage(prompt, completion, cached, ttft, tps)


def _run_row(server: Server, row: int, body: dict[str, Any], mapper: ChunkMapper,
             control: RowControl, out: queue.Queue[TokenBatch | RowResult]) -> None:
    """One streaming request; posts TokenBatch per chunk, then one RowResult."""
    result = RowResult(row)
    try:
        result.finish_reason, result.usage = server.stream_chat(row, body, mapper, control, out)
    except RowAborted:
        return
    except Exception as exc:  # noqa: BLE001 - every failure becomes one sentence
        if control.aborted.is_set():
            return
        result.error = server.describe(exc, mapper)
        log.info("row %d failed: %s", row, result.error)
    finally:
        control.detach()
    out.put(result)


def _sent_text(mapper: ChunkMapper, count: int) -> str:
    """The text of the tokens the generator yielded (a row thread may be a little ahead)."""
    return "".join(mapper.parts[:count])


def _combine(failures: dict[int, str], rows: int) -> str:
    messages = list(dict.fromkeys(failures.values()))
    if rows == 1 or (len(messages) == 1 and len(failures) == rows):
        return messages[0]
    return " ".join(f"Column {r + 1}: {m}" for r, m in sorted(failures.items()))
