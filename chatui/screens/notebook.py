"""Raw mode: a notebook for base models (``chatui --raw``, ``/raw-mode``).

One text the user edits; Ctrl+O has the model continue it in place, as plain text (no chat
template; the BOS token as the tokenizer adds it: ``GenerationRequest.raw``), streaming into
the text, with the chat's sampling settings and stop strings. The continuation's tokens are in
the token view below the text (heat scale, cursor, inspector with alternatives and what the
sampler did; a digit continues from alternative N: the text is cut before that token, the
alternative put in its place, and the model goes on). The whole text is scored as it is typed
(``/score``: :data:`SCORE_AFTER_S` after the last edit, its tokens coloured by their own
probability in the token view below, the perplexity in the status line), and on Ctrl+E. Each continuation is kept as a conversation whose transcript records
``"mode": "raw"``: the text before it as the user message, the continuation as the reply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from rich.cells import cell_len
from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Static, TextArea

from inference.types import (Failed, GenerationRequest, Message, RowDone, Scored, ScoreRequest,
                             TokenBatch, finish_words)

from ..conversation import Conversation, Reply
from ..messages import AlternativeChosen, TokenSelected
from ..reporting import run_reported
from ..widgets.inspector import NARROW_BELOW, WIDE_FROM, TokenInspector
from ..widgets.scored import score_summary
from ..widgets.text import safe_text
from ..widgets.text_box import TextBox
from ..widgets.token_view import TokenView
from .held_keys import behind_typed_keys
from .once import DismissOnce

if TYPE_CHECKING:
    from .chat import ChatScreen

NO_TEMPLATE_NOTICE = ("This checkpoint has no chat template: it opened in raw mode, a notebook "
                      "the model continues as plain text. F4 goes to the chat (a generic ChatML "
                      "template).")
SCORE_AFTER_S = 1.5
"""Pause in typing after which the text is scored (each score is one prefill of the whole
text: about a second for 1,000 tokens of the default model on this CPU)."""


def ending(reply: Reply) -> str:
    """How a continuation ended, in words for the status line (it showed the finish reason
    itself, "length" also where the text had filled the model's context and ^O could not go
    on: seen in tmux on a model of 256 tokens of context)."""
    context_full = reply.usage is not None and reply.usage.filled_context
    goes_on = reply.finish_reason == "cancelled" or (reply.finish_reason == "length"
                                                     and not context_full)
    return finish_words(reply.finish_reason, reply.usage) + (" (^O goes on)" if goes_on else "")


HELP = ("^O continue", "Esc stop", "^T tokens", "1-9 from alternative", "^E score", "F4 chat")
"""The keys the status line names after what happened, as many as fit, each whole."""


def fit_keys(head: str, keys: Sequence[str], width: int) -> str:
    """``head``, then as many of ``keys`` as fit in ``width`` cells, each whole (one line cut
    at the width had left "^E score · F4" of "F4 chat", and a long sentence without its end:
    seen in tmux at 100 columns). A head wider than the line is the whole text (it wraps)."""
    text = head
    for key in keys:
        joined = f"{text} · {key}" if text else key
        if cell_len(joined) > width:
            break
        text = joined
    return text


class StatusLine(Static):
    """The notebook's status: what happened, then the keys that fit (:func:`fit_keys`)."""

    def __init__(self, *, id: str) -> None:
        super().__init__(id=id)
        self.head, self.keys = "", HELP

    def say(self, head: str, *, keys: bool = False) -> None:
        self.head, self.keys = head, HELP if keys else ()
        self.refresh(layout=True)

    def render(self) -> Content:
        return Content(safe_text(fit_keys(self.head, self.keys, self.content_size.width)))


class NotebookScreen(DismissOnce, Screen[None]):
    """The notebook (see the module docstring). It reads the chat's settings and worker."""

    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (NARROW_BELOW, "-compact"),
                              (WIDE_FROM, "-wide")]
    """Under ``NARROW_BELOW`` cells the inspector goes below the text (beside it, at 64 cells
    it left the text 16 cells; seen in tmux), as the chat's goes below the conversation, and
    under ``WIDE_FROM`` it is beside it in its compact width."""

    BINDINGS = [
        Binding("ctrl+o", "continue_text", "Continue", priority=True, id="notebook.continue",
                tooltip="The model continues the text in place"),
        Binding("escape", "stop", "Stop", id="notebook.stop", tooltip="Stop the continuation"),
        Binding("ctrl+e", "score", "Score", priority=True, id="notebook.score",
                tooltip="Score the whole text under the model"),
        Binding("ctrl+t", "toggle_focus", "Tokens", priority=True, id="notebook.tokens",
                tooltip="Move between the text and the continuation's tokens"),
        Binding("f4", "chat", "Chat", id="notebook.chat", tooltip="Back to the chat"),
    ]

    DEFAULT_CSS = """
    NotebookScreen #notebook-main { height: 1fr; }
    NotebookScreen #notebook-left { width: 1fr; }
    NotebookScreen #notebook-text { height: 2fr; }
    NotebookScreen #notebook-tokens { height: 1fr; border-top: solid $panel; }
    NotebookScreen #notebook-notice { height: auto; color: $warning; padding: 0 1; }
    NotebookScreen #notebook-status { height: auto; color: $text-muted; padding: 0 1; }
    """

    def __init__(self, chat: ChatScreen, *, notice: str = "", text: str = "",
                 opened: Conversation | None = None) -> None:
        super().__init__()
        self.chat = chat
        self.initial_text = text
        self.initial_notice = notice
        self.opened = opened
        """A saved raw-mode conversation to show once up (see :meth:`show_saved`)."""
        self.conversation = Conversation(mode="raw")
        """The latest continuation as a conversation (what the transcript records)."""
        self.base = ""
        """The text the latest continuation continued."""
        self.reply: Reply | None = None
        self.scored: Scored | None = None
        self.stream: Any = None
        self.generating = False
        self.continued = ""
        """The text as the last continuation left it (edits made by the model are not typed
        text, and are not scored as such)."""
        self._score_timer: Any = None
        self._typed_meanwhile: list[str] = []
        """What was typed while the model wrote (the text read-only): added after it ends."""

    # ---- widgets ----

    def compose(self) -> ComposeResult:
        with Horizontal(id="notebook-main"):
            with Vertical(id="notebook-left"):
                yield Static(Content(safe_text(self.initial_notice)), id="notebook-notice")
                yield TextBox(self.initial_text, id="notebook-text", soft_wrap=True,
                               placeholder="Type a text for the model to continue, as it is "
                                           "(no chat template); Ctrl+O continues it.")
                view = TokenView(id="notebook-tokens")
                view.owner_id = "notebook-tokens"
                yield view
            yield TokenInspector(id="notebook-inspector", hint=(
                "Select a token: click it in the continuation, or Tab into it and use the "
                "arrow keys."))
        yield StatusLine(id="notebook-status")

    @property
    def text_area(self) -> TextArea:
        return self.query_one("#notebook-text", TextArea)

    @property
    def token_view(self) -> TokenView:
        return self.query_one("#notebook-tokens", TokenView)

    @property
    def inspector(self) -> TokenInspector:
        return self.query_one("#notebook-inspector", TokenInspector)

    def on_mount(self) -> None:
        notice = self.initial_notice
        kept = self.chat.carryover
        if not self.initial_text and kept.notebook_text:  # its document, as left
            self.text_area.text = kept.notebook_text
            if kept.notebook_from_before:
                kept.notebook_from_before = False
                notice = " ".join(filter(None, (notice, "The text from when chatui last "
                                                "ended is back (F7 then Delete empties it).")))
                self.query_one("#notebook-notice", Static).update(Content(safe_text(notice)))
        self.query_one("#notebook-notice").display = bool(notice)
        self.text_area.focus()
        self.text_area.move_cursor(self.text_area.document.end)
        if self.opened is not None:
            opened, self.opened = self.opened, None
            self.show_saved(opened)

    def show_saved(self, conv: Conversation) -> None:
        """A saved raw-mode conversation opened (``/load``, the search, ``--resume``): its
        text as its continuation left it, the continuation's tokens in the token view (an
        alternative continues from there); the chat opened it as a chat of one message once,
        and went on under the chat template. The text that was here is replaced by an edit,
        so Ctrl+Z brings it back, and the notice says so."""
        if self.generating:
            return
        base = next((e.text for e in conv.entries if e.role == "user"), "")
        reply = next((e.reply for e in conv.entries if e.reply is not None), None)
        text = base + (reply.text if reply is not None else "")
        old = self.text_area.text
        area = self.text_area
        if old != text:
            area.replace(text, area.document.start, area.document.end,
                         maintain_selection_offset=False)
        area.move_cursor(area.document.end)
        self.conversation, self.base, self.reply = conv, base, reply
        self.continued = text
        self.scored = None
        self.token_view.set_tokens(list(reply.tokens) if reply is not None else [])
        said = "A saved raw-mode text is open, as its last continuation left it."
        if old.strip() and old != text:
            said += " Ctrl+Z brings back the text that was here."
        notice = self.query_one("#notebook-notice", Static)
        notice.update(Content(said))
        notice.display = True

    def status(self, text: str, *, keys: bool = False) -> None:
        """What happened, on the status line (``keys``: then the keys that fit)."""
        self.query_one("#notebook-status", StatusLine).say(text, keys=keys)

    # ---- continuing ----

    def action_continue_text(self) -> None:
        # (a priority binding: text typed with Ctrl+O at once continued "Once upon a time,"
        # and the rest of the line, typed while the text was read-only, was lost)
        behind_typed_keys(self, self._continue_text)

    def _continue_text(self) -> None:
        if self.generating:
            return
        text = self.text_area.text
        if not text:
            self.status("Type a text first: the model continues it.")
            return
        self.start(text)

    def start(self, text: str, kept: list[Any] | None = None) -> None:
        """Continue ``text`` (``kept``: tokens of the continuation already in it, from a
        continue-from-alternative)."""
        settings = self.chat.state.settings
        self.base = text if kept is None else self.base
        self.reply = Reply(settings)
        self.reply.tokens.extend(kept or [])
        self.conversation = Conversation(mode="raw", model=self.conversation.model)
        self.conversation.add_user(self.base)
        self.conversation.append(self._assistant_entry(self.reply))
        self.token_view.set_tokens(list(self.reply.tokens))
        self.scored = None
        if self._score_timer is not None:
            self._score_timer.stop()
            self._score_timer = None
        self.generating = True
        self.text_area.read_only = True
        self.status("generating… (Esc stops)")
        request = GenerationRequest((Message("user", text),), (settings,),
                                    self.chat.state.top_logprobs, raw=True)
        run_reported(self, self._run(request), what="Continuing the text", group="notebook")

    @staticmethod
    def _assistant_entry(reply: Reply) -> Any:
        from ..conversation import Entry

        return Entry("assistant", replies=[reply])

    async def _run(self, request: GenerationRequest) -> None:
        reply = self.reply
        assert reply is not None
        finish = "stop"
        try:
            self.stream = stream = self.chat.services.worker.generate(request)
            async for group in stream:
                for ev in group:
                    if isinstance(ev, TokenBatch):
                        reply.tokens.extend(ev.tokens)
                        self.token_view.append(ev.tokens)
                        self.token_view.sync()
                        piece = "".join(t.text for t in ev.tokens if not t.special)
                        if piece:
                            self.text_area.insert(piece, self.text_area.document.end,
                                                  maintain_selection_offset=False)
                    elif isinstance(ev, RowDone):
                        finish = ev.finish_reason
                        reply.usage = ev.usage
                    elif isinstance(ev, Failed):
                        finish = "error"
                        reply.error = ev.message
                        self.status(ev.message)
        finally:
            self.stream = None
            self.generating = False
            self.continued = self.text_area.text
            self.text_area.read_only = False
            self._keep(finish)
            if finish != "error":
                self.status(f"{reply.token_count} tokens · {ending(reply)}", keys=True)
            self._add_typed_meanwhile()

    def _keep(self, finish: str) -> None:
        """The continuation ended (``finish``): its text and finish set, and saved."""
        reply = self.reply
        assert reply is not None
        reply.text = reply.tokens.text()
        reply.finish_reason = finish  # type: ignore[assignment]
        reply.tokens.compact()
        self._save()

    def _save(self) -> None:
        """Autosave the notebook as its own conversation (``"mode": "raw"``)."""
        services = self.chat.services
        ref = services.model_ref
        if ref is not None:
            self.conversation.model = ref
        save = getattr(services, "save_conversation", None)
        if save is not None:
            save(self.conversation)

    async def action_stop(self) -> None:
        if self.stream is not None:
            self.stream.cancel()

    def hang_up(self) -> None:
        """The terminal is gone (SIGHUP, see ``ChatApp._hung_up``): the continuation streaming
        now is stopped and saved as far as it got, with nothing drawn."""
        reply = self.reply
        if not self.generating or reply is None:
            return
        if self.stream is not None:
            self.stream.cancel()
        self._keep("cancelled")

    # ---- tokens ----

    def type_into(self, text: str, submit: bool) -> None:
        """Text typed in the token view goes to the document, where its cursor is (it was
        dropped; seen in tmux); Enter there is a new line, as in the document."""
        self.text_area.focus()
        if self.generating:
            self._typed_meanwhile.append(text + ("\n" if submit else ""))
            return
        self.text_area.insert(text + ("\n" if submit else ""))

    def on_key(self, event: events.Key) -> None:
        """A key the read-only text let through while the model writes: a character or Enter
        is kept for after the continuation (it was dropped: a person who goes on typing
        while the model writes lost it)."""
        if not self.generating or self.focused is not self.text_area:
            return
        if event.key == "enter":
            typed = "\n"
        elif event.is_printable and event.character:
            typed = event.character
        else:
            return
        event.stop()
        event.prevent_default()
        if not self._typed_meanwhile:
            self.status("generating… (Esc stops; what you type goes after it)")
        self._typed_meanwhile.append(typed)

    def _add_typed_meanwhile(self) -> None:
        """The text typed while the model wrote, at the end of the document, the cursor after
        it (it is the person's own text, and is scored as such)."""
        typed = "".join(self._typed_meanwhile)
        self._typed_meanwhile.clear()
        if typed:
            end = self.text_area.document.end
            self.text_area.insert(typed, end, maintain_selection_offset=False)
            self.text_area.move_cursor(self.text_area.document.end)

    def action_toggle_focus(self) -> None:
        if self.focused is self.token_view:
            self.text_area.focus()
        else:
            self.token_view.focus()

    @on(TokenSelected)
    def _token_selected(self, event: TokenSelected) -> None:
        tokens = list(self.scored.tokens) if self.scored is not None else (
            list(self.reply.tokens) if self.reply is not None else [])
        units = self.token_view.units
        if not 0 <= event.unit < len(units):
            return
        unit = units[event.unit]
        self.inspector.show(event.view_id, tokens[unit.start:unit.end + 1], event.unit,
                            len(units), position=unit.start)

    @on(AlternativeChosen)
    def _alternative_chosen(self, event: AlternativeChosen) -> None:
        """Cut the text before the token, put alternative N in its place, continue."""
        reply = self.reply
        if self.generating or reply is None or self.scored is not None:
            return
        position, rank = event.token_index, event.alt_rank
        if not 0 <= position < len(reply.tokens):
            return
        token = reply.tokens[position]
        if not 1 <= rank <= len(token.top):
            self.status(f"This token has {len(token.top)} alternatives; there is no "
                        f"number {rank}.")
            return
        from ..recorder import branch

        branch(reply, position, rank)
        kept = list(reply.tokens)
        text = self.base + reply.tokens.text()
        self.text_area.load_text(text)
        self.start(text, kept=kept)

    # ---- scoring ----

    @on(TextArea.Changed, "#notebook-text")
    def _typed(self) -> None:
        """Score the text once typing pauses (not while the model writes into it)."""
        if self.generating or self.text_area.text in ("", self.continued):
            return
        if self._score_timer is not None:
            self._score_timer.stop()
        self._score_timer = self.set_timer(SCORE_AFTER_S, self._score_typed)

    def _score_typed(self) -> None:
        self._score_timer = None
        if not self.generating and self.text_area.text not in ("", self.continued):
            self._score_text()

    def action_score(self) -> None:
        behind_typed_keys(self, self._score_text)

    def _score_text(self) -> None:
        if self.generating:
            return
        text = self.text_area.text
        if not text:
            self.status("There is no text to score.")
            return
        run_reported(self, self._score(text), what="Scoring the text", group="notebook-score")

    async def _score(self, text: str) -> None:
        request = ScoreRequest(text, self.chat.state.top_logprobs)
        result: Scored | None = None
        async for group in self.chat.services.worker.score(request):
            for ev in group:
                if isinstance(ev, Failed):
                    self.status(ev.message)
                    return
                if isinstance(ev, Scored):
                    result = ev
        if result is not None and not self.generating:  # (a continuation started meanwhile
            # shows its own tokens)
            self.scored = s = result
            self.token_view.set_tokens(list(s.tokens))
            self.status(score_summary("the text", list(s.tokens), s.perplexity, s.scored,
                                      s.least_likely(3)))

    # ---- leaving ----

    async def action_chat(self) -> None:
        await self.action_stop()
        self.chat.carryover.notebook_text = self.text_area.text  # (it opens with it again)
        self.dismiss()
