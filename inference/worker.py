"""The async inference worker: the engine runs off the event loop; asyncio code talks to it.

Two modes with one API:

- **thread** (default): one thread in this process owns the backend.
- **isolated** (``isolate=True``, what the chat app uses for a local model): a child process
  owns the backend, so the UI's rendering never competes with the engine for Python's GIL, and
  a crash in native code cannot take the conversation down. The factory must be picklable.

Requests go to the engine through a queue; events come back through a buffer that the engine
fills without waiting and the loop drains in groups, so a consumer slower than the engine never
makes the engine wait per token.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable

from .backend import Backend, BackendFactory
from .types import (Event, Failed, GenerationRequest, Message, ModelInfo, Progress, RowDone,
                    Started, TokenBatch)

log = logging.getLogger(__name__)

Put = Callable[[Any], None]


class WorkerError(RuntimeError):
    """The worker cannot do what was asked (not loaded, closed, or its process died)."""


def describe_error(exc: BaseException) -> str:
    """One clear sentence for an exception raised by a backend."""
    user_message = getattr(exc, "user_message", None)
    if user_message:
        return str(user_message)
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if "OutOfMemory" in name or "out of memory" in text.lower():
        return ("The device ran out of memory; try a shorter conversation (/clear), fewer "
                "compare columns, or a smaller --dtype/--quantize.")
    return f"{text} ({name})" if text else name


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


# ---------------------------------------------------------------------------------------------
# The executor: owns a backend and runs one command at a time (same code in both modes).
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Loaded:
    """Internal: the model loaded (carries its info to the parent)."""

    info: ModelInfo


class _Executor:
    def __init__(self, factory: BackendFactory) -> None:
        self.factory = factory
        self.backend: Backend | None = None

    def load(self, put: Put) -> None:
        try:
            self.backend = self.factory(put)
            put(_Loaded(self.backend.info))
        except BaseException as exc:  # noqa: BLE001 - reported, never raised on the thread
            if getattr(exc, "user_message", None):  # the user's mistake: one sentence already
                log.info("load failed: %s", exc)
            else:
                log.error("load failed: %s", traceback.format_exc())
            put(Failed(describe_error(exc)))

    def generate(self, request: GenerationRequest, cancel: threading.Event, put: Put) -> None:
        self._guarded(lambda b: b.generate(request, cancel), put)

    def generate_batch(self, requests: list[GenerationRequest], cancel: threading.Event,
                       put: Put) -> None:
        def events(b: Backend) -> Any:
            batch = getattr(b, "generate_batch", None)
            if batch is not None:
                yield from batch(requests, cancel)
                return
            for i, req in enumerate(requests):  # backends without batching: one by one
                for ev in b.generate(req, cancel):
                    if isinstance(ev, (TokenBatch, RowDone)):
                        ev = dataclasses.replace(ev, row=i)
                    if not isinstance(ev, Started):
                        yield ev

        self._guarded(events, put)

    def _guarded(self, make: Callable[[Backend], Any], put: Put) -> None:
        if self.backend is None:
            put(Failed("The model is not loaded."))
            return
        try:
            for ev in make(self.backend):
                put(ev)
        except BaseException as exc:  # noqa: BLE001
            log.error("generation failed: %s", traceback.format_exc())
            put(Failed(describe_error(exc)))

    def call(self, fn: Callable[[Backend], Any]) -> Any:
        if self.backend is None:
            raise WorkerError("the model is not loaded")
        return fn(self.backend)

    def close(self) -> None:
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the backend failed")


# Picklable calls (module-level functions work in both modes).


def _count_tokens(messages: tuple[Message, ...], backend: Backend) -> int:
    return backend.count_tokens(messages)


def _reset(backend: Backend) -> None:
    backend.reset()


# ---------------------------------------------------------------------------------------------
# The loop side.
# ---------------------------------------------------------------------------------------------


class _Channel:
    """Engine -> loop event buffer. ``put`` never blocks; ``get`` returns everything pending."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Any] = deque()
        self._lock = threading.Lock()
        self._ready = asyncio.Event()
        self._wake_pending = False

    def put(self, item: Any) -> None:
        self.put_many((item,))

    def put_many(self, items: Any) -> None:
        with self._lock:
            self._items.extend(items)
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._ready.set)
        except RuntimeError:  # loop closed: nobody listens any more
            pass

    async def get(self) -> list[Any]:
        await self._ready.wait()
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._wake_pending = False
            self._ready.clear()
        return items


class GenerationStream:
    """An async iterator of event groups for one request. ``cancel()`` stops it within a step."""

    def __init__(self, channel: _Channel, cancel: Callable[[], None],
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
                if isinstance(item, _Loaded):
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
    """

    def __init__(self, factory: BackendFactory, *, isolate: bool | None = None,
                 log_file: str | os.PathLike[str] | None = None) -> None:
        if isolate is None:
            isolate = bool(getattr(factory, "isolate", False))
        self._host: _ThreadHost | _ProcessHost = (
            _ProcessHost(factory, log_file) if isolate else _ThreadHost(factory))
        self._info: ModelInfo | None = None

    @property
    def isolated(self) -> bool:
        return isinstance(self._host, _ProcessHost)

    @property
    def info(self) -> ModelInfo | None:
        """The loaded model, or None before loading finished."""
        return self._info

    def _remember(self, item: Any) -> None:
        if isinstance(item, _Loaded):
            self._info = item.info

    def load(self) -> GenerationStream:
        """Build the backend. The stream yields Progress events, then ends (or Failed)."""
        channel = _Channel(asyncio.get_running_loop())
        cancel = self._host.start("load", channel, ())
        return GenerationStream(channel, cancel, self._remember)

    def generate(self, request: GenerationRequest) -> GenerationStream:
        """Start a reply (or several, one per settings row). Iterate the stream for events."""
        channel = _Channel(asyncio.get_running_loop())
        return GenerationStream(channel, self._host.start("generate", channel, (request,)))

    def generate_batch(self, requests: list[GenerationRequest]) -> GenerationStream:
        """Different conversations at once (row i answers request i). The local engine decodes
        them as one padded batch; other backends answer them one after another."""
        channel = _Channel(asyncio.get_running_loop())
        return GenerationStream(channel,
                                self._host.start("generate_batch", channel, (list(requests),)))

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


def _future_setter(loop: asyncio.AbstractEventLoop,
                   fut: asyncio.Future[Any]) -> Callable[[bool, Any], None]:
    def settle(ok: bool, value: Any) -> None:
        def apply() -> None:
            if fut.done():
                return
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)
        try:
            loop.call_soon_threadsafe(apply)
        except RuntimeError:
            pass
    return settle


class _ThreadHost:
    """Runs the executor on one daemon thread of this process."""

    def __init__(self, factory: BackendFactory) -> None:
        self._executor = _Executor(factory)
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="chatui-inference", daemon=True)
        self._started = False
        self._closed = False

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()
        self._executor.close()

    def _submit(self, job: Callable[[], None]) -> None:
        if self._closed:
            raise WorkerError("the inference worker is closed")
        if not self._started:
            self._started = True
            self._thread.start()
        self._jobs.put(job)

    def start(self, kind: str, channel: _Channel, args: tuple[Any, ...]) -> Callable[[], None]:
        cancel = threading.Event()
        ex = self._executor

        def job() -> None:
            try:
                if kind == "load":
                    ex.load(channel.put)
                elif kind == "generate":
                    ex.generate(args[0], cancel, channel.put)
                else:
                    ex.generate_batch(args[0], cancel, channel.put)
            finally:
                channel.put(None)

        self._submit(job)
        return cancel.set

    async def call(self, fn: Callable[[Backend], Any]) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        settle = _future_setter(loop, fut)

        def job() -> None:
            try:
                settle(True, self._executor.call(fn))
            except BaseException as exc:  # noqa: BLE001
                settle(False, exc)

        self._submit(job)
        return await fut

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._started:
                self._jobs.put(None)

    def join(self, timeout: float | None) -> None:
        if self._started:
            self._thread.join(timeout)


# ---------------------------------------------------------------------------------------------
# Isolated mode: the executor in a child process.
# ---------------------------------------------------------------------------------------------


class _ProcessHost:
    """Runs the executor in a spawned child; a reader thread routes its messages."""

    def __init__(self, factory: BackendFactory, log_file: str | os.PathLike[str] | None) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe(duplex=True)
        self._proc = ctx.Process(target=_child_main, name="chatui-inference",
                                 args=(factory, child_conn, str(log_file) if log_file else None),
                                 daemon=True)
        self._child_conn = child_conn
        self._ids = itertools.count(1)
        self._routes: dict[int, Callable[[Any], None]] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._started = False
        self._closed = False
        self._dead: str | None = None
        self._reader = threading.Thread(target=self._read, name="chatui-inference-reader",
                                        daemon=True)

    def _ensure_started(self) -> None:
        if self._closed:
            raise WorkerError("the inference worker is closed")
        if not self._started:
            self._started = True
            # A UI may have replaced sys.stderr with an object without a real file descriptor,
            # which multiprocessing passes to its helper process: use the real one meanwhile.
            saved = sys.stderr
            sys.stderr = sys.__stderr__ or saved
            try:
                self._proc.start()
            except Exception as exc:  # noqa: BLE001
                log.error("starting the inference process failed: %s", traceback.format_exc())
                self._dead = f"The inference process could not start ({describe_error(exc)})."
                return
            finally:
                sys.stderr = saved
            self._child_conn.close()
            self._reader.start()

    def _send(self, msg: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._conn.send(msg)

    def _route_and_send(self, job: int, handler: Callable[[Any], None],
                        msg: tuple[Any, ...]) -> None:
        """Register where the job's replies go, then send it; a dead child answers at once."""
        with self._lock:
            dead = self._dead
            if dead is None:
                self._routes[job] = handler
        if dead is None:
            try:
                self._send(msg)
                return
            except (OSError, ValueError):
                with self._lock:
                    self._routes.pop(job, None)
                dead = self._dead or "The inference process stopped unexpectedly."
        handler(("died", dead))

    def start(self, kind: str, channel: _Channel, args: tuple[Any, ...]) -> Callable[[], None]:
        self._ensure_started()
        job = next(self._ids)

        def handle(msg: Any) -> None:
            tag, payload = msg
            if tag == "events":
                channel.put_many(payload)
            elif tag == "died":
                channel.put_many((Failed(payload), None))

        self._route_and_send(job, handle, (kind, job, *args))
        return lambda: self._send_quietly(("cancel", job))

    def _send_quietly(self, msg: tuple[Any, ...]) -> None:
        try:
            self._send(msg)
        except (OSError, ValueError):
            pass

    async def call(self, fn: Callable[[Backend], Any]) -> Any:
        self._ensure_started()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        settle = _future_setter(loop, fut)
        job = next(self._ids)

        def handle(msg: Any) -> None:
            tag, payload = msg
            if tag == "result":
                settle(True, payload)
            elif tag == "error":
                settle(False, payload)
            elif tag == "died":
                settle(False, WorkerError(payload))

        self._route_and_send(job, handle, ("call", job, fn))
        return await fut

    def _read(self) -> None:
        while True:
            try:
                job, tag, payload = self._conn.recv()
            except (EOFError, OSError):
                break
            with self._lock:
                handler = self._routes.get(job)
                if tag in ("result", "error") or (tag == "events" and payload and payload[-1] is None):
                    self._routes.pop(job, None)
            if handler is not None:
                handler((tag, payload))
        self._proc.join(5)
        code = self._proc.exitcode
        reason = ("The inference process stopped unexpectedly"
                  + (f" (exit code {code})" if code not in (None, 0) else "")
                  + "; see the log file for details.")
        with self._lock:
            self._dead = reason if not self._closed else "the inference worker is closed"
            routes, self._routes = self._routes, {}
        for handler in routes.values():
            handler(("died", self._dead))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._started:
            self._send_quietly(("close", 0))

    def join(self, timeout: float | None) -> None:
        if self._started:
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(1)


SEND_INTERVAL_S = 0.05
"""Shortest gap between two messages from the engine process to the UI (a frame is 100 ms),
except that the first tokens of a reply go at once."""


class _Sender:
    """Child side: batches messages per job and sends them from its own thread."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._pending: dict[int, list[Any]] = {}
        self._order: list[int] = []
        self._streaming: set[int] = set()
        """Jobs whose first tokens were sent."""
        self._wake = threading.Event()
        self._urgent = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chatui-sender", daemon=True)
        self._thread.start()

    def put(self, job: int, item: Any) -> None:
        urgent = False
        with self._lock:
            if job not in self._pending:
                self._pending[job] = []
                self._order.append(job)
            self._pending[job].append(item)
            if isinstance(item, TokenBatch) and job not in self._streaming:
                self._streaming.add(job)
                urgent = True
            elif item is None:  # the job's last event
                self._streaming.discard(job)
        if urgent:
            self._urgent.set()
        self._wake.set()

    def send_now(self, msg: tuple[Any, ...]) -> None:
        self.flush()
        with self._send_lock:
            self._conn.send(msg)

    def flush(self) -> None:
        with self._lock:
            pending, order = self._pending, self._order
            self._pending, self._order = {}, []
        with self._send_lock:
            for job in order:
                self._conn.send((job, "events", pending[job]))

    def _run(self) -> None:
        last = 0.0
        while True:
            self._wake.wait()
            # At most one message per SEND_INTERVAL_S: a sparse event goes at once, a fast
            # stream goes in groups, so the UI process is woken a few dozen times a second
            # rather than once per token.
            wait = last + SEND_INTERVAL_S - time.monotonic()
            if wait > 0:
                self._urgent.wait(wait)
            self._urgent.clear()
            self._wake.clear()
            try:
                self.flush()
            except (OSError, ValueError):
                return
            last = time.monotonic()


def _child_main(factory: BackendFactory, conn: Any, log_file: str | None) -> None:
    """Entry point of the isolated inference process."""
    if log_file:  # never write to the terminal the UI draws on
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        logging.basicConfig(filename=log_file, level=logging.INFO,
                            format="%(asctime)s %(levelname)s [engine] %(name)s: %(message)s")
    executor = _Executor(factory)
    sender = _Sender(conn)
    jobs: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
    cancels: dict[int, threading.Event] = {}
    cancels_lock = threading.Lock()

    def cancel_event(job: int) -> threading.Event:
        with cancels_lock:
            return cancels.setdefault(job, threading.Event())

    def receive() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                jobs.put(None)
                return
            if msg[0] == "cancel":
                cancel_event(msg[1]).set()
            elif msg[0] == "close":  # stop what runs now, then end after queued jobs
                with cancels_lock:
                    for ev in cancels.values():
                        ev.set()
                jobs.put(None)
                return
            else:
                jobs.put(msg)

    threading.Thread(target=receive, name="chatui-receiver", daemon=True).start()
    while (msg := jobs.get()) is not None:
        kind, job, *args = msg
        put = functools.partial(sender.put, job)
        if kind == "call":
            try:
                result: tuple[Any, ...] = (job, "result", executor.call(args[0]))
            except BaseException as exc:  # noqa: BLE001
                result = (job, "error", exc if _picklable(exc) else WorkerError(describe_error(exc)))
            sender.send_now(result)
            continue
        cancel = cancel_event(job)
        try:
            if kind == "load":
                executor.load(put)
            elif kind == "generate":
                executor.generate(args[0], cancel, put)
            elif kind == "generate_batch":
                executor.generate_batch(args[0], cancel, put)
        finally:
            put(None)
            with cancels_lock:
                cancels.pop(job, None)
    sender.flush()
    executor.close()


def _picklable(obj: Any) -> bool:
    import pickle

    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001
        return False
    return True


__all__ = ["InferenceWorker", "GenerationStream", "WorkerError", "merge_batches", "Progress",
           "describe_error"]
