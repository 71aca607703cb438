"""The async inference worker: the engine runs off the event loop; asyncio code talks to it.

Two modes with one API:

- **thread** (default): one thread in this process owns the backend (``thread_host``).
- **isolated** (``isolate=True``, what the chat app uses for a local model): a child process
  owns the backend (``process_host``). The factory must be picklable.

Requests go to the engine through a queue; events come back through a buffer that the engine
fills without waiting and the loop drains in groups (``channel``), so a consumer slower than
the engine never makes the engine wait per token. Both hosts drive the same ``executor``.
"""

from __future__ import annotations

from ..types import Progress
from .api import GenerationStream, InferenceWorker, merge_batches
from .executor import WorkerError, describe_error

__all__ = ["InferenceWorker", "GenerationStream", "WorkerError", "merge_batches", "Progress",
           "describe_error"]
