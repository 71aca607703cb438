"""No exception in a worker or a callback is ever swallowed: each one is logged in full and
shown to the user as one sentence (a notification), and the app goes on.

Textual hides an exception raised in a worker started with ``exit_on_error=False`` (the
worker's state just becomes ERROR): ``chatui --load PATH`` once opened an empty screen that
way, with the error nowhere. With ``exit_on_error=True`` the same exception ends the app. The
app and its screens therefore start every worker through :func:`run_reported` and wrap every
callback they hand to Textual (a screen's result callback, a thread's report) in
:func:`reported_callback`; a test raises inside each kind and checks the log and the
notification, and another checks that no ``run_worker`` call bypasses this module.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, Awaitable, Callable, TypeVar

from textual.dom import DOMNode
from textual.worker import Worker

from inference.worker import describe_error

log = logging.getLogger(__name__)

T = TypeVar("T")


def sentence(what: str, exc: BaseException) -> str:
    """The one sentence a user sees for ``exc`` raised while doing ``what``."""
    return f"{what} failed: {describe_error(exc)}. Details are in the log file."


def report(node: DOMNode, what: str, exc: BaseException) -> None:
    """Log ``exc`` with its traceback and show it as a notification."""
    log.error("%s failed", what, exc_info=exc)
    try:
        node.app.notify(sentence(what, exc), title="Error", severity="error", timeout=10,
                        markup=False)
    except Exception:  # noqa: BLE001 - no app any more (quitting): the log has it
        log.warning("could not show the error for %s", what)


async def reported(node: DOMNode, what: str, work: Awaitable[T]) -> T | None:
    """Await ``work``; an exception is reported (see :func:`report`) and None returned."""
    try:
        return await work
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # noqa: BLE001 - reported, never swallowed
        report(node, what, exc)
        return None


def run_reported(node: DOMNode, work: Awaitable[Any], *, what: str, group: str) -> Worker:
    """``node.run_worker(work)``, with any exception it raises reported (never hidden, never
    ending the app)."""
    return node.run_worker(reported(node, what, work), group=group, exit_on_error=False)


def reported_callback(node: DOMNode, what: str,
                      callback: Callable[..., Any]) -> Callable[..., Any]:
    """``callback`` with any exception it raises (or an awaitable it returns raises)
    reported instead of ending the app."""

    @functools.wraps(callback)
    async def call(*args: Any, **kwargs: Any) -> Any:
        try:
            result = callback(*args, **kwargs)
            if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
                result = await result
            return result
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported, never swallowed
            report(node, what, exc)
            return None

    return call
