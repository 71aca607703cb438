"""The one error type of checkpoint loading, and how an underlying error becomes part of its
sentence."""

from __future__ import annotations

from ..backend import ProgressCallback
from ..types import Progress


class CheckpointError(Exception):
    """Bad user input about a checkpoint; ``str(exc)`` is one clear sentence (also
    ``.user_message``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.user_message = message

    def __str__(self) -> str:
        return self.user_message


def reason(exc: BaseException) -> str:
    """The first line of an exception's text, short and without a trailing period."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.strip().rstrip(".")
    if len(text) > 200:
        text = text[:197] + "..."
    return text


def report(progress: ProgressCallback | None, stage: str, done: float, total: float) -> None:
    if progress is not None:
        progress(Progress(stage=stage, done=done, total=total))
