"""The executor: owns a backend and runs one command at a time, reporting through a ``put``
callback; the thread host and the process host both drive it. Also the worker's error type and
how an exception becomes one sentence for the user."""

from __future__ import annotations

import dataclasses
import logging
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from ..backend import Backend, BackendFactory
from ..types import (Failed, GenerationRequest, ModelInfo, RowDone, ScoreRequest, Started,
                     TokenBatch, Usage)

log = logging.getLogger("inference.worker")

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


@dataclass(frozen=True)
class Loaded:
    """Internal: the model loaded (carries its info to the parent)."""

    info: ModelInfo


class Executor:
    """Owns a backend and runs one command at a time; the same code behind both hosts, which
    hand it jobs by kind (``run``)."""

    def __init__(self, factory: BackendFactory) -> None:
        self.factory = factory
        self.backend: Backend | None = None

    def load(self, put: Put) -> None:
        try:
            self.backend = self.factory(put)
            put(Loaded(self.backend.info))
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
                    elif isinstance(ev, Failed):  # this row's: the next ones are still asked
                        ev = RowDone(i, "error", "".join(ev.partial),
                                     Usage(0, 0, 0, 0.0, 0.0), error=ev.message)
                    if not isinstance(ev, Started):
                        yield ev

        self._guarded(events, put)

    def score(self, request: ScoreRequest, cancel: threading.Event, put: Put) -> None:
        def events(b: Backend) -> Any:
            score = getattr(b, "score", None)
            if score is None:
                yield Failed(f"The {b.info.backend} backend cannot score a text.")
                return
            yield from score(request, cancel)

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

    def run(self, kind: str, args: tuple[Any, ...], cancel: threading.Event, put: Put) -> None:
        """Run one streamed job by kind ("load", "generate", "generate_batch", "score"): the
        one dispatch both hosts use."""
        if kind == "load":
            self.load(put)
        elif kind == "generate":
            self.generate(args[0], cancel, put)
        elif kind == "generate_batch":
            self.generate_batch(args[0], cancel, put)
        elif kind == "score":
            self.score(args[0], cancel, put)
        else:
            raise WorkerError(f"unknown job kind {kind!r}")

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
