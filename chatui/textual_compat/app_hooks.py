"""An unhandled exception ends the app with one sentence, not Textual's traceback.

Textual reports an exception nobody caught through the private ``App._fatal_error``, which
prints a traceback with local variables on the terminal (textual 8.2.8). :class:`ReportsFatalErrors`
overrides it to call the app's public :meth:`~ReportsFatalErrors.fatal_error_message` (save what
can be saved, return the sentence to show) and print that sentence instead.

Where :mod:`.gate` turns the patches off the mixin is empty: Textual shows its traceback and
the app's ``on_unmount`` still runs; the conversation is as its last autosave left it.
"""

from __future__ import annotations

from textual.app import App

from .gate import ENABLED

__all__ = ["ReportsFatalErrors"]

_HOOK = ENABLED and all(hasattr(App, name) for name in ("_fatal_error",
                                                         "_close_messages_no_wait"))


class ReportsFatalErrors:
    """Mixin for the :class:`~textual.app.App`: an unhandled exception ends the app with
    :meth:`fatal_error_message`'s sentence on the terminal."""

    def fatal_error_message(self, error: BaseException | None) -> str:
        """Save what can be saved after ``error`` and return the sentence to show."""
        return f"stopped after an internal error: {error!s}"

    if _HOOK:

        def _fatal_error(self) -> None:
            app: App = self  # type: ignore[assignment]
            error = getattr(app, "_exception", None)
            message = self.fatal_error_message(error)
            app._exit_renderables.append(message)
            app._close_messages_no_wait()
