"""The context meter: how full the model's context is, in the status bar, with one warning
when it gets full and a notice when the oldest turns were left out of a reply."""

from __future__ import annotations

import logging
from typing import Any, Callable

from inference.types import Message

from ..recorder import ContextReported
from ..reporting import sentence
from ..widgets.status import CONTEXT_WARN, StatusBar

log = logging.getLogger(__name__)


class ContextMeter:
    """Keeps the status bar's context fields; ``notify`` shows a toast.

    The count is derived from the conversation's path: :meth:`follow` is called on a timer
    and recounts whenever the messages (or the model) differ from those last counted, so no
    change of path (a comparison's column picked with F6, a branch switched, /delete, a load)
    needs its own call to keep the meter true (F6 on a comparison kept the old column's
    count; /delete kept the deleted message's)."""

    def __init__(self, status: Callable[[], StatusBar], notify: Callable[..., None]) -> None:
        self._status = status
        self._notify = notify
        self._warned = False
        self._count_failed = False
        self._counted: tuple[object, tuple[Message, ...]] | None = None  # (model, messages)

    def reported(self, delta: ContextReported, default_limit: int, what: str) -> str:
        """The engine placed a prompt: show its size; returns the notice to show when the
        oldest messages were left out of this ``what`` (reply, comparison), else ""."""
        status = self._status()
        self._counted = None  # the bar shows a prompt's size now, not the path's count
        limit = delta.context_limit or default_limit
        status.context_limit = limit
        status.context_used = delta.prompt_tokens
        if delta.dropped_messages <= 0:
            return ""
        self._warned = True  # the notice says it; no toast about "soon" after it
        n = delta.dropped_messages
        oldest = "the oldest message was" if n == 1 else f"the oldest {n} messages were"
        return (f"The conversation no longer fits the model's context ({limit} tokens): "
                f"{oldest} left out of this {what}. Use /clear to start afresh.")

    async def follow(self, worker: Any, model: object, messages: tuple[Message, ...]) -> None:
        """Recount unless ``messages`` under ``model`` (compared by identity: another model
        counts with another tokenizer) are what the bar shows already."""
        counted = self._counted
        if counted is not None and counted[0] is model and counted[1] == messages:
            return
        self._counted = (model, messages)  # (a count that failed is not retried until then)
        await self.recount(worker, messages)

    async def recount(self, worker: Any, messages: tuple[Message, ...]) -> None:
        """Recount the conversation's tokens; warn once when the context gets full."""
        try:
            used = await worker.count_tokens(messages)
        except Exception as exc:  # noqa: BLE001 - the meter is a hint, never fatal
            log.error("counting the context's tokens failed", exc_info=exc)
            if not self._count_failed:  # once: it would fail again after every reply
                self._count_failed = True
                self._notify(sentence("Counting the context's tokens", exc), title="Error",
                             severity="error", markup=False)
            return
        self._count_failed = False
        status = self._status()
        status.context_used = used
        share = status.context_share
        if share >= CONTEXT_WARN and not self._warned:
            self._warned = True
            self._notify(context_warning(used, status.context_limit), title="Context",
                         severity="warning")
        elif share < CONTEXT_WARN:
            self._warned = False

    def reset(self) -> None:
        self._counted = None
        status = self._status()
        status.context_used = 0
        status.speed = ""


def context_warning(used: int, limit: int) -> str:
    """The toast when the context gets full, in the right tense: a conversation already
    longer than the context has its oldest turns left out of every reply now (the toast said
    "will be left out soon" at 104%)."""
    if used >= limit:
        return (f"The conversation ({used} tokens) is longer than the model's context "
                f"({limit}): its oldest turns are left out of every reply now. /clear starts "
                "afresh.")
    return (f"The context is {used / limit:.0%} full; the oldest turns will be left out "
            "soon. /clear starts afresh.")
