"""Isolated mode: the executor in a spawned child process, so the UI's rendering never
competes with the engine for Python's GIL and a crash in native code cannot take the
conversation down. A reader thread in the parent routes the child's messages to each job; a
sender thread in the child batches them (``SEND_INTERVAL_S``)."""

from __future__ import annotations

import asyncio
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
from typing import Any, Callable

from ..backend import Backend, BackendFactory
from ..types import Failed, TokenBatch
from .channel import Channel, future_setter
from .executor import Executor, WorkerError, describe_error
from .heap import settle_heap

log = logging.getLogger("inference.worker")


class ProcessHost:
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

    @property
    def dead(self) -> str | None:
        """Why the child can run no more jobs (it died or never started); None when closed
        on purpose or alive."""
        with self._lock:
            return None if self._closed else self._dead

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

    def start(self, kind: str, channel: Channel, args: tuple[Any, ...]) -> Callable[[], None]:
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
        settle = future_setter(loop, fut)
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
    executor = Executor(factory)
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
            executor.run(kind, tuple(args), cancel, put)
            if kind == "load" and executor.backend is not None:
                settle_heap()
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
