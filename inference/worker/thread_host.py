"""The worker's default host: the executor on one daemon thread of this process."""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any, Callable

from ..backend import Backend, BackendFactory
from .channel import Channel, future_setter
from .executor import Executor, WorkerError
from .heap import settle_heap


class ThreadHost:
    """Runs the executor on one daemon thread of this process; with ``settle``, the process
    is the engine's (a headless command): its heap is settled after the load
    (``heap.settle_heap``)."""

    def __init__(self, factory: BackendFactory, *, settle: bool = False) -> None:
        self._executor = Executor(factory)
        self._settle = settle
        self._jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="chatui-inference", daemon=True)
        self._started = False
        self._closed = False

    @property
    def dead(self) -> str | None:
        """A thread in this process does not die on its own (an exception ends one job)."""
        return None

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

    def start(self, kind: str, channel: Channel, args: tuple[Any, ...]) -> Callable[[], None]:
        cancel = threading.Event()
        ex = self._executor

        def job() -> None:
            try:
                ex.run(kind, args, cancel, channel.put)
                if kind == "load" and self._settle and ex.backend is not None:
                    settle_heap()
            finally:
                channel.put(None)

        self._submit(job)
        return cancel.set

    async def call(self, fn: Callable[[Backend], Any]) -> Any:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        settle = future_setter(loop, fut)

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
