"""How results cross from the engine's thread to the event loop: ``Channel`` (an event buffer
the engine fills without waiting and the loop drains in groups) and ``future_setter`` (one
value or exception into an asyncio future)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, Callable

from .executor import WorkerError


class Channel:
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


def future_setter(loop: asyncio.AbstractEventLoop,
                  fut: asyncio.Future[Any]) -> Callable[[bool, Any], None]:
    """A thread-safe ``settle(ok, value)`` that sets ``fut``'s result or exception on its loop.

    asyncio refuses a ``StopIteration`` as a future's exception (a TypeError raised inside the
    loop's callback, so the future never completes and its awaiter hangs): a call whose
    function leaked one (``next()`` on an empty iterator) gets a ``WorkerError`` saying so.
    """
    def settle(ok: bool, value: Any) -> None:
        if not ok and isinstance(value, StopIteration):
            error = WorkerError(f"the call raised StopIteration ({value!r}): an iterator ran out "
                                "where a value was expected")
            error.__cause__ = value
            value = error

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
