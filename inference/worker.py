"""The async inference worker: one thread owns the backend; asyncio code talks to it.

The engine never runs on an event loop. Requests go to the thread through a queue; events
come back through a buffer that the thread fills without waiting and the loop drains in
groups, so a consumer slower than the engine never makes the engine wait per token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
import traceback
from collections import deque
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from .backend import Backend, BackendFactory
from .types import (Event, Failed, GenerationRequest, Message, ModelInfo, Progress, RowDone,
                    Started, TokenBatch)

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """The worker cannot do what was asked (not loaded, already closed)."""


def describe_error(exc: BaseException) -> str:
    """One clear sentence for an exception raised by a backend."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "OutOfMemory" in name or "out of memory" in text.lower():
        return ("The device ran out of memory; try a shorter conversation (/clear), fewer "
                "compare columns, or a smaller --dtype/--quantize.")
    return f"{text} ({name})" if text else name


class _Channel:
    """Thread -> loop event buffer. ``put`` never blocks; ``get`` returns everything pending."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Event | None] = deque()
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._wake_pending = False

    def put(self, item: Event | None) -> None:
        with self._lock:
            self._items.append(item)
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # loop closed: nobody listens any more
            pass

    def _wake(self) -> None:
        self._ready.set()

    async def get(self) -> list[Event | None]:
        await self._ready.wait()
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._wake_pending = False
            self._ready.clear()
        return items


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


@dataclass
class _Job:
    fn: Callable[[], None]


class GenerationStream:
    """An async iterator of event groups for one request. ``cancel()`` stops it within a step."""

    def __init__(self, channel: _Channel, cancel: threading.Event) -> None:
        self._channel = channel
        self._cancel = cancel
        self._closed = False

    def cancel(self) -> None:
        """Ask the backend to stop; rows end with finish reason 'cancelled'."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

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
    """Owns a backend on a dedicated thread and exposes it to asyncio code.

    Args:
        factory: builds the backend on the worker thread (the model loads there).
    """

    def __init__(self, factory: BackendFactory) -> None:
        self._factory = factory
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="chatui-inference", daemon=True)
        self._backend: Backend | None = None
        self._started = False
        self._closed = False
        self._busy = threading.Lock()

    @property
    def info(self) -> ModelInfo | None:
        """The loaded model, or None before loading finished."""
        return None if self._backend is None else self._backend.info

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            job.fn()
        if self._backend is not None:
            try:
                self._backend.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the backend failed")

    def _submit(self, fn: Callable[[], None]) -> None:
        if self._closed:
            raise WorkerError("the inference worker is closed")
        if not self._started:
            self._started = True
            self._thread.start()
        self._jobs.put(_Job(fn))

    def load(self) -> GenerationStream:
        """Build the backend. The stream yields Progress events, then ends (or Failed)."""
        loop = asyncio.get_running_loop()
        channel = _Channel(loop)
        cancel = threading.Event()

        def job() -> None:
            try:
                self._backend = self._factory(channel.put)
            except BaseException as exc:  # noqa: BLE001 - reported, never raised on the thread
                user_message = getattr(exc, "user_message", None)
                if user_message:  # the user's mistake, already one clear sentence
                    log.info("load failed: %s", user_message)
                else:
                    log.error("load failed: %s", traceback.format_exc())
                channel.put(Failed(user_message or describe_error(exc)))
            finally:
                channel.put(None)

        self._submit(job)
        return GenerationStream(channel, cancel)

    def generate(self, request: GenerationRequest) -> GenerationStream:
        """Start a reply (or several, one per settings row). Iterate the stream for events."""
        loop = asyncio.get_running_loop()
        channel = _Channel(loop)
        cancel = threading.Event()

        def job() -> None:
            try:
                if self._backend is None:
                    channel.put(Failed("The model is not loaded."))
                    return
                for ev in self._backend.generate(request, cancel):
                    channel.put(ev)
            except BaseException as exc:  # noqa: BLE001
                log.error("generation failed: %s", traceback.format_exc())
                channel.put(Failed(describe_error(exc)))
            finally:
                channel.put(None)

        self._submit(job)
        return GenerationStream(channel, cancel)

    def generate_batch(self, requests: list[GenerationRequest]) -> GenerationStream:
        """Different conversations at once (row i answers request i). The local engine decodes
        them as one padded batch; other backends answer them one after another."""
        loop = asyncio.get_running_loop()
        channel = _Channel(loop)
        cancel = threading.Event()

        def job() -> None:
            try:
                if self._backend is None:
                    channel.put(Failed("The model is not loaded."))
                    return
                batch = getattr(self._backend, "generate_batch", None)
                if batch is not None:
                    for ev in batch(requests, cancel):
                        channel.put(ev)
                    return
                for i, req in enumerate(requests):
                    for ev in self._backend.generate(req, cancel):
                        if isinstance(ev, (TokenBatch, RowDone)):
                            ev = dataclasses.replace(ev, row=i)
                        if not isinstance(ev, Started):
                            channel.put(ev)
            except BaseException as exc:  # noqa: BLE001
                log.error("batch generation failed: %s", traceback.format_exc())
                channel.put(Failed(describe_error(exc)))
            finally:
                channel.put(None)

        self._submit(job)
        return GenerationStream(channel, cancel)

    async def call(self, fn: Callable[[Backend], object]) -> object:
        """Run ``fn(backend)`` on the worker thread (after queued jobs) and return its result."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()

        def job() -> None:
            try:
                if self._backend is None:
                    raise WorkerError("the model is not loaded")
                result = fn(self._backend)
            except BaseException as exc:  # noqa: BLE001
                loop.call_soon_threadsafe(_set_exc, fut, exc)
            else:
                loop.call_soon_threadsafe(_set_result, fut, result)

        self._submit(job)
        return await fut

    async def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """Prompt tokens of ``messages`` (for the context meter)."""
        return int(await self.call(lambda b: b.count_tokens(messages)))  # type: ignore[arg-type]

    async def reset(self) -> None:
        """Drop the backend's cached conversation (``/clear``)."""
        await self.call(lambda b: b.reset())

    def close(self) -> None:
        """Stop the thread after pending jobs; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._jobs.put(None)

    def join(self, timeout: float | None = None) -> None:
        """Wait for the thread to end (after ``close``)."""
        if self._started:
            self._thread.join(timeout)

    async def aclose(self, timeout: float = 10.0) -> None:
        """Close and wait for the thread without blocking the loop."""
        self.close()
        if self._started:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout)


def _set_result(fut: asyncio.Future[object], value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exc(fut: asyncio.Future[object], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


__all__ = ["InferenceWorker", "GenerationStream", "WorkerError", "merge_batches", "Progress"]
