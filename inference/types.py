"""Plain data types that cross the boundary between the engine and its users.

The app, the CLI and transcripts only ever see these: no tensors, no tokenizer objects.
A backend (the local engine, an OpenAI-compatible server, a scripted fake) produces them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from .settings import SamplingParams

Role = Literal["system", "user", "assistant"]
FinishReason = Literal["stop", "length", "cancelled", "error"]
Channel = Literal["reasoning", "answer"]
"""Which part of a reply a token belongs to: the model's reasoning (``<think>...</think>``,
harmony's analysis channel) or its answer (see ``inference.reasoning``)."""


@dataclass(frozen=True)
class Message:
    """One chat message."""

    role: Role
    content: str
    reasoning: str = ""
    """An assistant reply's reasoning, given to the chat template under the key it reads
    (``reasoning_content``) when it has one; left out of the prompt otherwise."""


@dataclass(frozen=True)
class AssistantPrefix:
    """The start of the assistant reply to continue from (``/continue``, "continue from this
    alternative"). ``token_ids`` is exact when known; otherwise the text is encoded."""

    text: str
    token_ids: tuple[int, ...] | None = None
    spellings: tuple[tuple[int, str], ...] = ()
    """Some token ids with their spellings as the tokenizer that made ``token_ids`` spelled
    them (a reply's alternatives): the engine takes the ids only where its own tokenizer
    spells these alike. A reply made by another model (a conversation loaded under a new one)
    carries that model's ids, which mean other tokens here, or none: past the end of the
    vocabulary they read outside the embedding table (the engine process crashed)."""


@dataclass(frozen=True)
class GenerationRequest:
    """Ask for one reply per entry of ``settings`` to the same conversation.

    With several settings the rows share one prefill and decode as one batch (compare mode).
    """

    messages: tuple[Message, ...]
    settings: tuple[SamplingParams, ...] = (SamplingParams(),)
    top_logprobs: int = 5
    """How many alternatives to report per token (0 to 20)."""
    prefix: AssistantPrefix | None = None
    """Continue this partial assistant reply instead of starting a new one."""
    first_tokens: tuple[int, ...] | None = None
    """Row r starts with token ``first_tokens[r]`` instead of a sampled one (fan-out: the
    alternatives at one token decoded as branches in one batch, from one prefill); its event
    carries the token's real logprob and alternatives."""
    raw: bool = False
    """Raw completion: continue the text of the one message as a plain prompt (no chat
    template; the BOS token added as the tokenizer adds it), for base models."""

    thinking: bool | None = None
    """The template's reasoning switch (``enable_thinking``): None leaves it as the template
    has it; ignored by a template without one."""

    def __post_init__(self) -> None:
        if not self.settings:
            raise ValueError("a request needs at least one settings row")
        if self.raw and (len(self.messages) != 1 or self.prefix is not None):
            raise ValueError("a raw request continues one plain text: give one message and no "
                             "prefix")
        if self.first_tokens is not None and len(self.first_tokens) != len(self.settings):
            raise ValueError("first_tokens needs one token per settings row")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError("top_logprobs must be between 0 and 20")


@dataclass(frozen=True)
class ScoreRequest:
    """Score a text under the model (Llama 3's ``echo``): every token's logprob, rank, entropy
    and alternatives, from one chunked prefill. ``text`` is encoded as the tokenizer would
    (its BOS token added when it adds one); no chat template."""

    text: str
    top_logprobs: int = 5
    """How many alternatives to report per token (0 to 20)."""
    context: tuple[Message, ...] | None = None
    """Score ``text`` as what comes next after this conversation (``/probe``): the context is
    encoded as a reply's prompt is (chat template, then ``prefix``; or one plain text when
    ``raw``), ``text`` follows it encoded on its own (no special tokens), and only the text's
    tokens are scored, each under everything before it, from one forward over them."""
    prefix: AssistantPrefix | None = None
    """With ``context``: the start of the assistant reply the text would continue."""
    raw: bool = False
    """With ``context``: the context is one plain text (raw completion), no chat template."""

    def __post_init__(self) -> None:
        if not self.text:
            raise ValueError("there is no text to score")
        if self.context is None and (self.prefix is not None or self.raw):
            raise ValueError("a prefix or raw context needs a context")
        if self.raw and self.context is not None and (len(self.context) != 1
                                                      or self.prefix is not None):
            raise ValueError("a raw context is one plain text: give one message and no prefix")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError("top_logprobs must be between 0 and 20")


@dataclass(frozen=True)
class Alternative:
    """One of the most likely tokens at a position."""

    id: int | None
    """Token id; None when the backend cannot tell (OpenAI-compatible servers)."""
    text: str
    logprob: float


@dataclass(frozen=True)
class SamplerCut:
    """What the sampler chain (repetition penalty, temperature, top-k, top-p, min-p, in
    transformers' order) did at one generated token."""

    prob: float
    """The token's probability after the chain: the distribution it was drawn from (1 for a
    greedy token)."""
    nucleus: int
    """How many tokens the chain left with a probability above 0 (1 when greedy; the whole
    vocabulary when no filter is on)."""
    top_probs: tuple[float, ...] = ()
    """Each of the token's ``top`` alternatives' probability after the chain (0 if cut)."""
    top_cuts: tuple[str, ...] = ()
    """For each alternative, the filter that removed it: "top-k", "top-p", "min-p" or
    "greedy" (temperature 0); "" when it stayed in the nucleus."""


@dataclass(frozen=True)
class Token:
    """One generated token with what the model thought of it."""

    index: int
    """Position in the reply, from 0."""
    id: int | None
    text: str
    """The text this token adds to the reply (may be "" while a UTF-8 glyph is incomplete;
    the glyph's text then comes with its last token, and ``glyph_start`` says where it began)."""
    logprob: float | None
    """log P(token) under the raw distribution (before temperature and filters)."""
    entropy: float | None
    """Entropy of the raw distribution in nats; None when unavailable."""
    top: tuple[Alternative, ...] = ()
    special: bool = False
    """A control token (end of turn...), never shown as text by default."""
    glyph_start: int | None = None
    """When this token completes a glyph that started in an earlier token, that token's index."""
    raw: str = ""
    """The token's own spelling (e.g. '<|im_end|>' or '<0xE4>'), for a raw view."""
    channel: Channel = "answer"
    """Reasoning or answer; a reasoning marker (``</think>``) is ``special`` and belongs to
    the reasoning it delimits."""
    sampler: SamplerCut | None = None
    """What the sampler did here (local engine only; None for prompt, scored or forced
    tokens and for other backends)."""

    @property
    def prob(self) -> float | None:
        import math

        return None if self.logprob is None else math.exp(self.logprob)


@dataclass(frozen=True)
class Usage:
    """Counts and timings of one finished reply."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens reused from the cache (not prefilled again)."""
    ttft_s: float
    """Time from the request to the first token."""
    decode_tokens_per_s: float
    """Tokens per second after the first one (0 when there was none after it)."""
    context_limit: int = 0
    """The model's context when the reply ended (0 where it is not known)."""

    @property
    def filled_context(self) -> bool:
        """Whether the prompt and the reply took the model's whole context: a reply ended
        "length" there was cut off by the context's end, not by its token limit."""
        return 0 < self.context_limit <= self.prompt_tokens + self.completion_tokens

    @property
    def decode_rate(self) -> float | None:
        """:attr:`decode_tokens_per_s`, None where there is no rate: a reply of one token (a
        fan-out's branch that is its end-of-turn token said "0.0 tok/s")."""
        return self.decode_tokens_per_s if self.decode_tokens_per_s > 0 else None


# ---- events (what a backend yields while it works) ----


@dataclass(frozen=True)
class Started:
    """The prompt is encoded; decoding begins."""

    rows: int
    prompt_tokens: int
    cached_tokens: int
    dropped_messages: int = 0
    """Oldest messages left out so the conversation fits the context."""
    context_limit: int = 0


@dataclass(frozen=True)
class TokenBatch:
    """New tokens for one row, in order (grouped so a slow consumer never stalls the engine)."""

    row: int
    tokens: tuple[Token, ...]


def finish_words(reason: FinishReason, usage: Usage | None) -> str:
    """How a reply ended, in words for a person (a terminal, a status line): the finish
    reason itself ("length") read the same where the token limit cut a reply off and where the
    model's context did, and only the first can go on."""
    if reason == "length":
        if usage is not None and usage.filled_context:
            return f"cut off at the end of the model's context ({usage.context_limit:,} tokens)"
        return "cut off at the token limit"
    return {"stop": "ended", "cancelled": "stopped", "error": "failed"}[reason]


@dataclass(frozen=True)
class RowDone:
    """One row finished."""

    row: int
    finish_reason: FinishReason
    text: str
    usage: Usage
    error: str = ""
    """Why the row failed (``finish_reason`` "error"), one sentence, where one row of a batch
    failed and the others went on (a line too long for the context)."""


@dataclass(frozen=True)
class Failed:
    """The request failed; rows already done stay done, partial text is in ``partial``."""

    message: str
    partial: tuple[str, ...] = ()


@dataclass(frozen=True)
class Progress:
    """A long step (loading, converting, compiling) moved on."""

    stage: str
    done: float
    total: float | None = None


@dataclass(frozen=True)
class PromptProgress:
    """The engine fed another chunk of the prompt into the cache (sent only for prompts longer
    than one chunk: a 7.6k-token prompt took 19 s on a 2-core CPU, with nothing to show for it
    but "generating…" before this event existed)."""

    done: int
    """Prompt tokens fed so far (not counting those reused from the cache)."""
    total: int
    """Prompt tokens to feed in all."""
    seconds: float
    """Time since the first chunk started."""

    @property
    def tokens_per_s(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def describe(self) -> str:
        """One short line for a status bar or a terminal (the app and the headless commands;
        at 110 columns the app's status bar has about 37 for it)."""
        rate = f" · {self.tokens_per_s:,.0f} tok/s" if self.seconds > 0 else ""
        return f"reading {self.done:,}/{self.total:,}{rate}…"


@dataclass(frozen=True)
class Scored:
    """A text scored (the answer to a ``ScoreRequest``): one ``Token`` per token of the text,
    ``index`` its position. A token with nothing before it (the first, when the tokenizer
    adds no BOS; the BOS itself) has ``logprob`` None and no alternatives."""

    tokens: tuple[Token, ...]
    ranks: tuple[int | None, ...]
    """Each token's rank under the model (1 = the most likely); None where unscored."""

    @property
    def scored(self) -> int:
        """How many tokens have a logprob."""
        return sum(1 for t in self.tokens if t.logprob is not None)

    @property
    def perplexity(self) -> float:
        """exp(-mean logprob) over the scored tokens (1.0 when none is)."""
        import math

        lps = [t.logprob for t in self.tokens if t.logprob is not None]
        return math.exp(-sum(lps) / len(lps)) if lps else 1.0

    def least_likely(self, n: int = 5) -> list[Token]:
        """The ``n`` scored tokens with the lowest logprob, least likely first."""
        scored = [t for t in self.tokens if t.logprob is not None]
        return sorted(scored, key=lambda t: (t.logprob, t.index))[:n]


Event = Started | TokenBatch | RowDone | Failed | Progress | PromptProgress | Scored


@dataclass(frozen=True)
class ModelInfo:
    """What the app shows about the loaded model."""

    name: str
    backend: str
    """'local', 'openai' or 'scripted'."""
    device: str
    dtype: str
    context_limit: int
    checkpoint: str = ""
    weights_hash: str = ""
    quantization: str = "none"
    default_settings: SamplingParams = field(default_factory=SamplingParams)
    has_token_ids: bool = True
    has_entropy: bool = True
    chat_template_warning: str = ""
    url: str = ""
    reasoning: str = ""
    """How the model marks its reasoning: "think", "harmony", or "" (none known)."""
    thinking_switch: bool = False
    """Whether the chat template has a reasoning switch (``enable_thinking``)."""
