"""The worker's asyncio API: ``InferenceWorker`` (load, generate, call, close) and the
``GenerationStream`` of event groups each request returns; which host runs the executor (a
thread or a child process) is a constructor argument, never visible to callers."""

from __future__ import annotations

import asyncio
import functools
import os
from typing import Any, AsyncIterator, Callable

from ..backend import Backend, BackendFactory
from ..types import Event, GenerationRequest, Message, ModelInfo, ScoreRequest, TokenBatch
from .channel import Channel
from .executor import Loaded
from .process_host import ProcessHost
from .thread_host import ThreadHost


def merge_batches(events: list[Event]) -> list[Event]:
    """Merge consecutive TokenBatch events of the same row (order of rows is kept)."""
    out: list[Event] = []
    for ev in events:
        if (isinstance(ev, TokenBatch) and out and isinstance(out[-1], TokenBatch)
                and out[-1].row == ev.row):
            out[-1] = TokenBatch(ev.row, out[-1].tokens + ev.tokens)
        else:
            out.append(ev)
    return out


class GenerationStream:
    """An async iterator of event groups for one request. ``cancel()`` stops it within a step."""

    def __init__(self, channel: Channel, cancel: Callable[[], None],
                 on_item: Callable[[Any], None] | None = None) -> None:
        self._channel = channel
        self._cancel = cancel
        self._cancelled = False
        self._closed = False
        self._on_item = on_item

    def cancel(self) -> None:
        """Ask the backend to stop; rows end with finish reason 'cancelled'."""
        if not self._cancelled and not self._closed:
            self._cancelled = True
            self._cancel()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def __aiter__(self) -> AsyncIterator[list[Event]]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[list[Event]]:
        while not self._closed:
            items = await self._channel.get()
            events: list[Event] = []
            for item in items:
                if item is None:
                    self._closed = True
                    break
                if isinstance(item, Loaded):
                    if self._on_item is not None:
                        self._on_item(item)
                    continue
                events.append(item)
            if events:
                yield merge_batches(events)

    async def collect(self) -> list[Event]:
        """All events until the end (for the CLI and tests)."""
        out: list[Event] = []
        async for group in self:
            out.extend(group)
        return out


class InferenceWorker:
    """Owns a backend off the event loop and exposes it to asyncio code.

    Args:
        factory: builds the backend (the model loads there), given a progress callback.
        isolate: run it in a child process. None asks the factory (``factory.isolate``).
        log_file: in isolated mode, where the child's output and logs go (never the terminal).
        settle_heap: in this process (not isolated), which is then the engine's own (a headless
            command, never the chat UI's): settle the heap after the load, as the isolated
            worker's process does (``heap.settle_heap``).
    """

    def __init__(self, factory: BackendFactory, *, isolate: bool | None = None,
                 log_file: str | os.PathLike[str] | None = None,
                 settle_heap: bool = False) -> None:
        if isolate is None:
            isolate = bool(getattr(factory, "isolate", False))
        self._host: ThreadHost | ProcessHost = (
            ProcessHost(factory, log_file) if isolate else ThreadHost(factory, settle=settle_heap))
        self._info: ModelInfo | None = None

    @property
    def isolated(self) -> bool:
        return isinstance(self._host, ProcessHost)

    @property
    def dead(self) -> str | None:
        """Why this worker can run no more jobs (its process died), or None while it can.
        A dead worker stays dead: build a new one to go on."""
        return self._host.dead

    @property
    def info(self) -> ModelInfo | None:
        """The loaded model, or None before loading finished."""
        return self._info

    def _remember(self, item: Any) -> None:
        if isinstance(item, Loaded):
            self._info = item.info

    def load(self) -> GenerationStream:
        """Build the backend. The stream yields Progress events, then ends (or Failed)."""
        channel = Channel(asyncio.get_running_loop())
        cancel = self._host.start("load", channel, ())
        return GenerationStream(channel, cancel, self._remember)

    def generate(self, request: GenerationRequest) -> GenerationStream:
        """Start a reply (or several, one per settings row). Iterate the stream for events."""
        channel = Channel(asyncio.get_running_loop())
        return GenerationStream(channel, self._host.start("generate", channel, (request,)))

    def generate_batch(self, requests: list[GenerationRequest]) -> GenerationStream:
        """Different conversations at once (row i answers request i). The local engine decodes
        them as one padded batch; other backends answer them one after another."""
        channel = Channel(asyncio.get_running_loop())
        return GenerationStream(channel,
                                self._host.start("generate_batch", channel, (list(requests),)))

    def score(self, request: ScoreRequest) -> GenerationStream:
        """Score a text under the model: the stream yields ``PromptProgress`` for a long text,
        then one ``Scored`` (or ``Failed``)."""
        channel = Channel(asyncio.get_running_loop())
        return GenerationStream(channel, self._host.start("score", channel, (request,)))

    async def call(self, fn: Callable[[Backend], Any]) -> Any:
        """Run ``fn(backend)`` where the backend lives (after queued jobs); return its result.
        In isolated mode ``fn`` must be picklable (a module-level function or a partial)."""
        return await self._host.call(fn)

    async def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """Prompt tokens of ``messages`` (for the context meter)."""
        return int(await self.call(functools.partial(_count_tokens, messages)))

    async def reset(self) -> None:
        """Drop the backend's cached conversation (``/clear``)."""
        await self.call(_reset)

    def close(self) -> None:
        """Stop after pending jobs; idempotent."""
        self._host.close()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread or process to end (after ``close``)."""
        self._host.join(timeout)

    async def aclose(self, timeout: float = 10.0) -> None:
        """Close and wait without blocking the loop."""
        self.close()
        await asyncio.get_running_loop().run_in_executor(None, self.join, timeout)


# Picklable calls (module-level functions work in both modes).


def _count_tokens(messages: tuple[Message, ...], backend: Backend) -> int:
    return backend.count_tokens(messages)


def _reset(backend: Backend) -> None:
    backend.reset()
