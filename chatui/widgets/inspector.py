"""The side panel of the token view: the selected token's probability, rank, entropy and its
top-k alternatives as bars (click one, or press its digit, to continue from it); for a token
the local engine sampled, also what the sampler did: the probability after the sampler chain,
the nucleus size, and per alternative its post-sampler probability or the filter that cut it."""

from __future__ import annotations

import math

from textual import events
from textual.containers import VerticalScroll
from textual.content import Content, Span
from textual.style import Style
from textual.widgets import Static

from inference.types import Token
from themes import heat_bin
from themes.chatui import HEAT_LABELS

from ..messages import AlternativeChosen
from .text import show_prob, show_token

BAR_WIDTH = 14
NARROW_BELOW = 72
"""Terminal widths under this put the token inspector (46 cells) below the conversation (the
chat) or the text (the notebook), not beside it."""
EMPTY_HINT = ("Select a token: click it, or use the arrow keys in a reply (Tab moves between "
              "replies).")


def heat_legend() -> Content:
    """The heat scale's colours with their probability ranges."""
    parts, spans, pos = [], [], 0
    for i, label in enumerate(HEAT_LABELS):
        piece = f"■ {label} "
        parts.append(piece)
        spans.append(Span(pos, pos + 1, f"$heat-{i}"))
        pos += len(piece)
    return Content("".join(parts).rstrip(), spans)


def token_rank(token: Token) -> int | None:
    """1-based rank of the sampled token among the reported alternatives, None if absent."""
    for i, alt in enumerate(token.top):
        same = (alt.id == token.id) if (alt.id is not None and token.id is not None) \
            else alt.text == token.text
        if same:
            return i + 1
    return None


def _bar(prob: float) -> str:
    eighths = int(round(prob * BAR_WIDTH * 8))
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(BAR_WIDTH)


def describe_tokens(tokens: list[Token], index: int, total: int,
                    forkable: bool = True) -> Content:
    """The panel's text for the unit made of ``tokens`` (alternatives are the first token's);
    ``forkable`` False (a scored message's tokens, which nothing continues) leaves out the
    alternatives' "continue from it"."""
    first = tokens[0]
    lines: list[Content] = []
    text = "".join(t.text for t in tokens)
    lines.append(Content.assemble(("token ", "bold"), f"{index + 1} of {total}  ",
                                  show_token(text or first.raw)))
    if len(tokens) > 1:
        probs = ", ".join(show_prob(t.prob) if t.prob is not None else "?" for t in tokens)
        lines.append(Content(f"glyph of {len(tokens)} tokens: {probs}"))
    if first.prob is not None:
        lines.append(Content(f"probability  {show_prob(first.prob, 2)}   logprob {first.logprob:.3f}"))
    cut = first.sampler
    if cut is not None:
        lines.append(Content(f"sampled      {show_prob(cut.prob, 2)}   nucleus {cut.nucleus:,} "
                             f"token{'s' if cut.nucleus != 1 else ''}"))
    rank = token_rank(first)
    if first.top:
        lines.append(Content(f"rank         {rank if rank else f'>{len(first.top)}'} "
                             f"of top-{len(first.top)}"))
    if first.entropy is not None:
        lines.append(Content(f"entropy      {first.entropy:.3f} nats"))
    if first.id is not None:
        lines.append(Content(f"id           {first.id}"))
    if first.channel == "reasoning":
        lines.append(Content("channel      reasoning"))
    if first.top:
        lines.append(Content(""))
        lines.append(Content.styled("alternatives  (digit or click: continue from it)"
                                    if forkable else "alternatives", "$text-muted"))
        cuts = cut is not None and len(cut.top_cuts) == len(first.top)
        if cuts:
            lines.append(Content.styled(f"{'':{BAR_WIDTH + 2}}    raw sampled", "$text-muted"))
        for i, alt in enumerate(first.top):
            prob = math.exp(alt.logprob)
            marker = "←" if rank == i + 1 else " "
            after = ""
            if cuts:  # the post-sampler probability, or the filter that removed it
                after = f"{cut.top_probs[i]:7.1%} " if not cut.top_cuts[i] \
                    else f"{cut.top_cuts[i]:>7} "
            label = f"{i + 1} {_bar(prob)} {prob:6.1%} {after}{show_token(alt.text)} {marker}"
            line = Content(label, [Span(2, 2 + BAR_WIDTH, f"$heat-{heat_bin(prob)}"),
                                   Span(0, len(label), Style.from_meta({"alt": i + 1}))])
            lines.append(line)
    return Content("\n").join(lines)


class TokenInspector(VerticalScroll):
    """Shows one token; the parent calls :meth:`show` (attributes down)."""

    DEFAULT_CSS = """
    TokenInspector { width: 46; border-left: tall $panel; padding: 0 1; background: $surface; }
    TokenInspector > .legend { height: auto; margin-bottom: 1; }
    TokenInspector > .detail { height: auto; }
    """

    def __init__(self, *, id: str | None = None, hint: str = EMPTY_HINT) -> None:
        super().__init__(id=id)
        self.hint = Content.styled(hint, "$text-muted")
        """What the panel says while no token is selected (raw mode's has no replies)."""
        self.view_id = ""
        self.token_index = -1
        self.position = -1
        """Position of the shown unit's first token in its reply (-1: nothing shown)."""

    def compose(self):
        yield Static(heat_legend(), classes="legend")
        yield Static(self.hint, classes="detail")
        branches = Static("", classes="branches")
        branches.display = False
        yield branches

    def show(self, view_id: str, tokens: list[Token], unit_index: int, total: int,
             position: int, forkable: bool = True) -> None:
        """Show the unit made of ``tokens`` (unit ``unit_index`` of ``total``, its first
        token at ``position`` in the reply) of a reply (``forkable``) or a scored message."""
        self.view_id = view_id
        self.token_index = tokens[0].index if tokens else -1
        self.position = position
        self.query_one(".detail", Static).update(
            describe_tokens(tokens, unit_index, total, forkable))
        self.show_branches("")

    def show_branches(self, text: str) -> None:
        """What the branches that leave the reply at the token shown start with (issue 18;
        empty: none leaves there)."""
        branches = self.query_one(".branches", Static)
        branches.update(Content(text))
        branches.display = bool(text)

    def clear(self) -> None:
        """Show nothing selected."""
        self.view_id = ""
        self.position = -1
        self.query_one(".detail", Static).update(self.hint)

    def on_click(self, event: events.Click) -> None:
        alt = event.style.meta.get("alt")
        if alt is not None and self.view_id:
            self.post_message(AlternativeChosen(self.view_id, self.position, int(alt)))
