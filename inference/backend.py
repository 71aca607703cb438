"""The backend protocol: what the worker drives, whatever produces the tokens.

A backend is synchronous and runs on the worker's thread. ``generate`` yields events and
checks ``cancel`` between steps; it must leave the backend usable after an error.
"""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Protocol

from .types import Event, GenerationRequest, Message, ModelInfo, Progress, ScoreRequest

ProgressCallback = Callable[[Progress], None]


class Backend(Protocol):
    """Something that turns a conversation into streamed tokens."""

    info: ModelInfo

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        """Yield events for ``request`` until every row is done, cancelled or failed."""
        ...

    def score(self, request: ScoreRequest, cancel: threading.Event) -> Iterator[Event]:
        """Yield ``PromptProgress`` while reading a long text, then one ``Scored`` (or a
        ``Failed`` saying in one sentence why this backend cannot score)."""
        ...

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """Prompt tokens the conversation takes (for the context meter)."""
        ...

    def reset(self) -> None:
        """Forget any cached conversation state (``/clear``)."""
        ...

    def close(self) -> None:
        """Free resources."""
        ...


BackendFactory = Callable[[ProgressCallback], Backend]
"""Builds a backend (loads the model); called on the worker thread with a progress callback."""
