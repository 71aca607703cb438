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
COMPACT_BAR_WIDTH = 8
NARROW_BELOW = 72
"""Terminal widths under this put the token inspector below the conversation (the chat) or
the text (the notebook), not beside it..."""
WIDE_FROM = 100
"""...from this width on it is beside it at 46 cells, and between the two at 38, its lines
shortened to fit (``themes/chatui.tcss``): at 80 columns, the classic terminal, the wide panel
left the conversation 33 cells (26 at 72: seen in tmux), 41 now."""
COMPACT_BELOW = 43
"""A panel whose text has fewer cells than this (the wide one has 43, the compact one 35)
shows the compact lines, each at most 35 cells."""
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


def _bar(prob: float, width: int = BAR_WIDTH) -> str:
    eighths = int(round(prob * width * 8))
    full, part = divmod(eighths, 8)
    return ("█" * full + (" ▏▎▍▌▋▊▉"[part] if part else "")).ljust(width)


def describe_tokens(tokens: list[Token], index: int, total: int,
                    forkable: bool = True, *, compact: bool = False, ids: bool = True,
                    entropy: bool = True) -> Content:
    """The panel's text for the unit made of ``tokens`` (alternatives are the first token's);
    ``forkable`` False (a scored message's tokens, which nothing continues) leaves out the
    alternatives' "continue". ``compact``: shorter labels and bars, every line at most
    35 cells (the panel between :data:`NARROW_BELOW` and :data:`WIDE_FROM` columns).
    ``ids`` / ``entropy`` False: the backend reports no token ids / no entropy (a server,
    ``ModelInfo``), and the panel says so instead of leaving the line out; a token with no
    logprob says why it has none."""
    first = tokens[0]
    lines: list[Content] = []
    pad, gap, bar = (9, "  ", COMPACT_BAR_WIDTH) if compact else (13, "   ", BAR_WIDTH)

    def field(label: str, value: str) -> Content:
        return Content(f"{label:<{pad}}{value}")

    text = "".join(t.text for t in tokens)
    lines.append(Content.assemble(("token ", "bold"), f"{index + 1} of {total}  ",
                                  show_token(text or first.raw)))
    if len(tokens) > 1:
        probs = ", ".join(show_prob(t.prob) if t.prob is not None else "?" for t in tokens)
        lines.append(Content(f"glyph of {len(tokens)} tokens: {probs}"))
    if first.prob is not None:
        lines.append(field("prob" if compact else "probability",
                           f"{show_prob(first.prob, 2)}{gap}logprob {first.logprob:.3f}"))
    elif forkable:  # (a reply's token: the server sent no logprobs)
        lines.append(field("prob" if compact else "probability",
                           "not sent" if compact else "not sent by the server"))
    else:  # (a scored text's first token, with no BOS before it)
        lines.append(field("prob" if compact else "probability",
                           "none (first token)" if compact else "none: nothing comes before it"))
    cut = first.sampler
    if cut is not None:
        unit = "" if compact else f" token{'s' if cut.nucleus != 1 else ''}"
        lines.append(field("sampled", f"{show_prob(cut.prob, 2)}{gap}nucleus "
                                      f"{cut.nucleus:,}{unit}"))
    rank = token_rank(first)
    if first.top:
        lines.append(field("rank", f"{rank if rank else f'>{len(first.top)}'} "
                                   f"of top-{len(first.top)}"))
    unreported = "not reported" if compact else "not reported by the server"
    if first.entropy is not None:
        lines.append(field("entropy", f"{first.entropy:.3f} nats"))
    elif not entropy:
        lines.append(field("entropy", unreported))
    if first.id is not None:
        lines.append(field("id", str(first.id)))
    elif not ids:
        lines.append(field("id", unreported))
    if first.channel == "reasoning":
        lines.append(field("channel", "reasoning"))
    if first.top:
        lines.append(Content(""))
        # (the wide panel's line was 48 cells in its 43 and wrapped; seen in tmux)
        how = "(digit: continue)" if compact else "(digit or click: continue)"
        lines.append(Content.styled(f"alternatives {how}" if forkable else "alternatives",
                                    "$text-muted"))
        cuts = cut is not None and len(cut.top_cuts) == len(first.top)
        if cuts:
            lines.append(Content.styled(f"{'':{bar + 2}}    raw sampled", "$text-muted"))
        for i, alt in enumerate(first.top):
            prob = math.exp(alt.logprob)
            marker = "←" if rank == i + 1 else " "
            after = ""
            if cuts:  # the post-sampler probability, or the filter that removed it
                after = f"{cut.top_probs[i]:7.1%} " if not cut.top_cuts[i] \
                    else f"{cut.top_cuts[i]:>7} "
            label = (f"{i + 1} {_bar(prob, bar)} {prob:6.1%} {after}{show_token(alt.text)} "
                     f"{marker}")
            line = Content(label, [Span(2, 2 + bar, f"$heat-{heat_bin(prob)}"),
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
        self._shown: tuple[list[Token], int, int, bool] | None = None
        """What :meth:`show` showed last, drawn again when the panel's width changes layout."""
        self._compact = False
        self.reports_ids = True
        """Whether the backend reports token ids (``ModelInfo.has_token_ids``; set by the
        screen when the model loads)..."""
        self.reports_entropy = True
        """...and the entropy of the full distribution (``ModelInfo.has_entropy``)."""

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
        self._shown = (tokens, unit_index, total, forkable)
        self._draw_detail()
        self.show_branches("")

    def _draw_detail(self) -> None:
        if self._shown is not None:
            tokens, unit_index, total, forkable = self._shown
            self.query_one(".detail", Static).update(
                describe_tokens(tokens, unit_index, total, forkable, compact=self._compact,
                                ids=self.reports_ids, entropy=self.reports_entropy))

    def on_resize(self, event: events.Resize) -> None:
        """The compact lines in a narrower panel (:data:`COMPACT_BELOW`), the wide ones
        again when it widens."""
        width = self.scrollable_content_region.width
        compact = 0 < width < COMPACT_BELOW
        if width and compact != self._compact:
            self._compact = compact
            self._draw_detail()

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
        self._shown = None
        self.query_one(".detail", Static).update(self.hint)

    def on_click(self, event: events.Click) -> None:
        alt = event.style.meta.get("alt")
        if alt is not None and self.view_id:
            self.post_message(AlternativeChosen(self.view_id, self.position, int(alt)))
