"""A message scored under the model (``/score``): its tokens on the heat scale, coloured by
their own probability, under a header with its perplexity and least likely tokens.

The scores live only in this item and the screen's memory for the session: the transcript
schema has no place for a message's own logprobs, so a saved or reloaded conversation does
not keep them (``/score`` again computes them anew)."""

from __future__ import annotations

from typing import Sequence

from textual.app import ComposeResult
from textual.containers import Vertical

from inference.types import Token

from .parts_line import PartsLine, Piece, joined
from .text import show_prob
from .token_view import TokenView


def score_summary(label: str, tokens: Sequence[Token], perplexity: float, scored: int,
                  least: Sequence[Token]) -> str:
    """The header's one line: what was scored, its perplexity and least likely tokens."""
    return joined(score_summary_pieces(label, tokens, perplexity, scored, least))


def score_summary_pieces(label: str, tokens: Sequence[Token], perplexity: float, scored: int,
                         least: Sequence[Token]) -> list[Piece]:
    """:func:`score_summary` in parts, each token with its probability one of them (the
    header wraps between them, never inside a quoted token)."""
    head = f"scored {label}: perplexity {perplexity:.4g} over {scored} of {len(tokens)} tokens"
    worst = [f"{(t.text or t.raw)!r} {show_prob(t.prob, 2)}" for t in least]
    if not worst:
        return [(head, "")]
    worst[0] = "least likely: " + worst[0]
    return [(head, " · "), *[(w, ", ") for w in worst[:-1]], (worst[-1], "")]


class ScoredMessage(Vertical):
    """A scored text: a summary line and a token view of its tokens (see module docstring).

    Args:
        summary: the header line (:func:`score_summary_pieces`).
        tokens: the scored tokens (``Scored.tokens``).
        view_id: the id the token view reports its cursor under (``TokenSelected``).
    """

    DEFAULT_CSS = """
    ScoredMessage { height: auto; }
    ScoredMessage > .score-header { color: $text-muted; padding: 0 1; }
    """

    def __init__(self, summary: Sequence[Piece], tokens: Sequence[Token], *, raw: bool = False,
                 id: str | None = None) -> None:
        super().__init__(id=id)
        self.summary = summary
        self.tokens = list(tokens)
        self.raw = raw
        self.token_view = TokenView(self.tokens, raw=raw)
        """The tokens on the heat scale (made here, so it can be reached before mounting)."""
        self.token_view.owner_id = id or ""

    def compose(self) -> ComposeResult:
        header = PartsLine(classes="score-header")
        header.show(self.summary)
        yield header
        yield self.token_view
