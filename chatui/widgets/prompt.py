"""The prompt box: multi-line, Enter sends, Ctrl+J (or Shift+Enter) inserts a newline,
Up/Down on the first/last line recall earlier prompts, Tab completes a slash command, Ctrl+L
empties it."""

from __future__ import annotations

from textual import events
from textual.binding import Binding

from .. import commands
from ..messages import PageConversation, PromptCleared, PromptSubmitted, SubmitSettled
from .text_box import TextBox


class PromptInput(TextBox):
    """A TextArea that posts :class:`PromptSubmitted` on Enter."""

    DEFAULT_CSS = """
    PromptInput { height: auto; max-height: 10; min-height: 3; border: tall $primary 40%; }
    PromptInput:focus { border: tall $primary; }
    """

    BINDINGS = [
        Binding("enter", "submit", "Send", priority=True, id="prompt.send",
                tooltip="Send the message (or run the /command)"),
        Binding("ctrl+j,shift+enter,alt+enter", "newline", "Newline", id="prompt.newline",
                tooltip="Insert a line break"),
        Binding("tab", "complete", "Complete", show=False, priority=True),
        Binding("ctrl+l", "clear_all", "Clear box", id="prompt.clear",
                tooltip="Empty the box (Ctrl+Z brings the text back)"),
    ]

    def __init__(self, *, id: str | None = None, argument_candidates=None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         placeholder="Message the model, or /help  (Enter sends, Ctrl+J newline)")
        self.prompt_history: list[str] = []
        self._history_pos: int | None = None
        self._draft = ""
        self.argument_candidates = argument_candidates or (lambda: {})
        """Callable returning ``{command: [argument, ...]}`` for completion."""

    def action_submit(self) -> None:
        # Enter is a priority binding: the app runs it as the key arrives, before keys queued
        # ahead of it have reached this widget (a burst from a fast typist, a terminal without
        # bracketed paste, a busy app). Submitting from this widget's own queue lets them in.
        self.call_later(self._submit)

    def _submit(self) -> None:
        text = self.text
        if not text.strip():
            self.app.post_message(SubmitSettled())  # nothing sent: typing goes on here
            return
        if not self.prompt_history or self.prompt_history[-1] != text:
            self.prompt_history.append(text)
        self._history_pos = None
        self.clear()
        self.post_message(PromptSubmitted(text))

    def action_clear_all(self) -> None:
        """Empty the box however much it holds (a 60 KB paste once could not be removed
        without restarting); an edit like any other, so Ctrl+Z undoes it."""
        if self.text:
            self.delete(self.document.start, self.document.end,
                        maintain_selection_offset=False)
            self.post_message(PromptCleared())
        self._history_pos = None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_all":
            return True if self.text else None  # in the footer only when there is text
        return True

    def on_text_area_changed(self, event: TextBox.Changed) -> None:
        if bool(self.text) != self._had_text:
            self._had_text = bool(self.text)
            self.refresh_bindings()

    _had_text = False

    def action_newline(self) -> None:
        self.insert("\n")

    def action_complete(self) -> None:
        # A priority binding, as Enter is: run from this widget's queue, behind the keys typed
        # before it ("/ti" and Tab typed at once completed "" and moved the focus instead).
        self.call_later(self._complete)

    def _complete(self) -> None:
        options = commands.completions(self.text, self.argument_candidates())
        if not options:
            self.screen.focus_next()
            return
        if len(options) == 1:
            self.set_text(options[0])
            return
        prefix = _common_prefix(options)
        if len(prefix) > len(self.text):
            self.set_text(prefix)
        else:
            self.notify("  ".join(o.strip() for o in options[:12]), title="Completions",
                        timeout=3)

    def keep_draft(self) -> bool:
        """Keep what is typed in the box in the prompt history (before the box is given
        other text); whether there was a draft to keep."""
        draft = self.text
        if not draft.strip():
            return False
        if draft not in self.prompt_history[-1:]:
            self.prompt_history.append(draft)
        self._history_pos = None
        self.notify("Your draft is kept: Up brings it back.", timeout=4)
        return True

    def set_text(self, text: str) -> None:
        """Replace the text and put the cursor at its end."""
        self.text = text
        self.move_cursor(self.document.end)

    # ---- history ----

    def _recall(self, step: int) -> bool:
        if not self.prompt_history:
            return False
        if self._history_pos is None:
            if step > 0:
                return False
            self._draft = self.text
            pos = len(self.prompt_history) - 1
        else:
            pos = self._history_pos + step
        if pos >= len(self.prompt_history):
            self._history_pos = None
            self.set_text(self._draft)
            return True
        self._history_pos = max(0, pos)
        self.set_text(self.prompt_history[self._history_pos])
        return True

    NEWLINE_KEYS = frozenset({"ctrl+j", "shift+enter", "alt+enter"})

    def on_key(self, event: events.Key) -> None:
        """Up on the first line and Down on the last recall the prompt history. A public
        handler: Textual calls it before TextArea's own key handling, which
        ``prevent_default`` skips.

        The newline and Ctrl+L are done here too, in the order the keys came, not by their
        bindings: a binding that is not a priority runs when its key has bubbled up to the
        app, after the keys queued behind it have been typed ("abc", Ctrl+J, "def" in one
        burst gave "abcdef" and then the line break; seen in tmux). The bindings stay for
        the footer."""
        if event.key in self.NEWLINE_KEYS or event.key == "ctrl+l":
            event.prevent_default()
            event.stop()
            if event.key == "ctrl+l":
                self.action_clear_all()
            else:
                self.action_newline()
            return
        row, _ = self.cursor_location
        if event.key in ("pageup", "pagedown") and self.document.line_count <= max(
                1, self.content_size.height):
            # the whole text is in view, so the box has nothing to page through: the user
            # means the conversation above (as in every chat app)
            event.prevent_default()
            event.stop()
            self.post_message(PageConversation(down=event.key == "pagedown"))
            return
        if event.key == "up" and row == 0 and self._recall(-1):
            event.prevent_default()
            event.stop()
        elif (event.key == "down" and row == self.document.line_count - 1
                and self._history_pos is not None and self._recall(1)):
            event.prevent_default()
            event.stop()

    @property
    def suggestion_text(self) -> str:
        """The first completion for what is typed (shown in the status line as a hint)."""
        options = commands.completions(self.text, self.argument_candidates())
        return options[0] if options else ""


def _common_prefix(items: list[str]) -> str:
    import os

    return os.path.commonprefix(items)
