"""Reasoning and answer, split on token ids and the chat template's own markers.

Reasoning models write their thinking before the answer: Qwen3, DeepSeek-R1 distills and
SmolLM3 between ``<think>`` and ``</think>`` (added tokens, each one id), gpt-oss in harmony
channels (``<|channel|>analysis<|message|>...<|end|>`` then
``<|start|>assistant<|channel|>final<|message|>...``). Parsers that search the decoded text for
the markers have leaked reasoning into the answer and back (llama.cpp, SGLang and vLLM each had
such bugs: a marker spelled by ordinary tokens, a marker split between two streamed chunks, a
reply stopped inside the reasoning). Here the split is decided on ids only: a marker is the
tokenizer's own id for it, so text that merely spells ``</think>`` stays text, and a harmony
header (several tokens: ``<|channel|>``, the channel's name, ``<|message|>``) is held back
until its ``<|message|>`` says which channel follows.

:func:`detect_format` reads the markers from the tokenizer and its template;
:class:`ChannelSplitter` assigns every token a channel and says which tokens are markers
(never shown as text). The splitter is first fed the prompt, so a template that opens the
reply inside ``<think>`` (a generation prompt ending in ``<think>\\n``) and a continued reply
(``/continue``, continue-from-alternative inside the reasoning) start in the right channel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Sequence

Channel = Literal["reasoning", "answer"]
REASONING: Channel = "reasoning"
ANSWER: Channel = "answer"

HARMONY_REASONING_CHANNELS = ("analysis",)
"""Harmony channels shown as reasoning; ``final`` and ``commentary`` (tool-call preambles,
meant for the user) are the answer."""


@dataclass(frozen=True)
class ReasoningFormat:
    """How a model marks its reasoning, as ids of its own tokenizer."""

    kind: Literal["think", "harmony"]
    open_id: int = -1
    """``<think>`` (think format)."""
    close_id: int = -1
    """``</think>`` (think format)."""
    start_id: int = -1
    """``<|start|>`` (harmony: opens a message header)."""
    channel_id: int = -1
    """``<|channel|>`` (harmony: names the channel in a header)."""
    message_id: int = -1
    """``<|message|>`` (harmony: ends a header)."""
    end_id: int = -1
    """``<|end|>`` (harmony: ends a message)."""
    header_stops: tuple[int, ...] = ()
    """Ids after the channel's name that end it (``<|message|>``, ``<|constrain|>``)."""
    reasoning_names: tuple[tuple[int, ...], ...] = ()
    """Harmony: the ids of each channel name that is reasoning (``analysis``)."""
    close_ids: tuple[int, ...] = ()
    """What a reasoning budget inserts to end the reasoning: ``</think>``, or harmony's
    ``<|end|><|start|>assistant<|channel|>final<|message|>``."""
    switch: bool = False
    """The template has a switch for the reasoning (``enable_thinking``)."""
    history_key: str = ""
    """The message key under which the template takes an earlier reply's reasoning
    (``reasoning_content`` for Qwen3, ``thinking`` for gpt-oss); "" if it takes none."""

    @property
    def markers(self) -> frozenset[int]:
        """Every id that is a marker by itself."""
        ids = (self.open_id, self.close_id, self.start_id, self.channel_id, self.message_id,
               self.end_id)
        return frozenset(i for i in ids if i >= 0)


def _single_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when the tokenizer has it as one token of its own (an added or
    special token), else None."""
    try:
        tid = tokenizer.convert_tokens_to_ids(text)
    except Exception:  # noqa: BLE001 - an odd tokenizer has no such token
        return None
    if not isinstance(tid, int) or tid < 0 or tid == getattr(tokenizer, "unk_token_id", None):
        return None
    try:
        ids = tokenizer.encode(text, add_special_tokens=False)
    except Exception:  # noqa: BLE001
        return None
    return tid if list(ids) == [tid] else None


def _template(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default", "") or ""
    return template if isinstance(template, str) else ""


def detect_format(tokenizer: Any) -> ReasoningFormat | None:
    """The reasoning markers of ``tokenizer`` (and its chat template), or None when it has
    none. ``<think>``/``</think>`` must each be one token of the tokenizer's own; harmony needs
    ``<|start|>``, ``<|channel|>``, ``<|message|>`` and ``<|end|>``."""
    template = _template(tokenizer)
    switch = "enable_thinking" in template
    history = "reasoning_content" if "reasoning_content" in template else ""
    channel = _single_id(tokenizer, "<|channel|>")
    message = _single_id(tokenizer, "<|message|>")
    start = _single_id(tokenizer, "<|start|>")
    end = _single_id(tokenizer, "<|end|>")
    if None not in (channel, message, start, end):
        assert channel is not None and message is not None and start is not None \
            and end is not None
        names = tuple(tuple(tokenizer.encode(n, add_special_tokens=False))
                      for n in HARMONY_REASONING_CHANNELS)
        constrain = _single_id(tokenizer, "<|constrain|>")
        stops = (message,) + ((constrain,) if constrain is not None else ())
        final = tuple(tokenizer.encode("<|start|>assistant<|channel|>final<|message|>",
                                       add_special_tokens=False))
        if not history and ("message.thinking" in template or "'thinking'" in template
                            or '"thinking"' in template or "message['thinking']" in template):
            history = "thinking"
        return ReasoningFormat("harmony", start_id=start, channel_id=channel,
                               message_id=message, end_id=end, header_stops=stops,
                               reasoning_names=names, close_ids=(end,) + final,
                               switch=switch, history_key=history)
    open_id = _single_id(tokenizer, "<think>")
    close_id = _single_id(tokenizer, "</think>")
    if open_id is not None and close_id is not None:
        return ReasoningFormat("think", open_id=open_id, close_id=close_id,
                               close_ids=(close_id,), switch=switch, history_key=history)
    return None


@dataclass(frozen=True)
class Decision:
    """What one token is: its channel, and whether it is a marker (never shown as text)."""

    channel: Channel
    marker: bool


class ChannelSplitter:
    """Assigns each token of a reply its channel, on ids only (see the module docstring).

    :meth:`push` returns the decisions for the tokens it resolves, in order: one for the
    token pushed, none while a harmony header is held back, or every held token at once when
    the header ends. A marker bordering the reasoning (``<think>``, ``</think>``, a header
    into or out of the analysis channel) belongs to the reasoning block.
    """

    def __init__(self, fmt: ReasoningFormat,
                 decode: Callable[[list[int]], str] | None = None) -> None:
        self.fmt = fmt
        self._decode = decode
        """Decodes a harmony header's channel name, so that a name the model spelled with
        other tokens than the tokenizer's own (``anal`` + ``ysis``) is still recognised;
        without it the name's ids are compared with the tokenizer's."""
        self.channel: Channel = ANSWER
        self.reasoning_tokens = 0
        """Tokens of text (no markers) since the reasoning last opened."""
        self._header: list[int] | None = None
        self._held = 0

    def clone(self) -> ChannelSplitter:
        """An independent copy (one per row of a batch, from the prompt's state)."""
        out = ChannelSplitter(self.fmt, self._decode)
        out.channel, out.reasoning_tokens = self.channel, self.reasoning_tokens
        out._header = None if self._header is None else list(self._header)
        out._held = self._held
        return out

    @property
    def holding(self) -> int:
        """How many pushed tokens wait for a decision (a harmony header)."""
        return self._held

    def feed_prompt(self, ids: Sequence[int]) -> None:
        """Run over the prompt (with any continued part of the reply): the reply starts in
        the channel the prompt leaves it in; nothing of the prompt is held."""
        for tid in ids:
            self.push(tid)
        self._held = 0

    def push(self, tid: int) -> list[Decision]:
        """Add the next token; returns the decisions it resolves (see the class)."""
        if self.fmt.kind == "think":
            return [self._push_think(tid)]
        return self._push_harmony(tid)

    def flush(self) -> list[Decision]:
        """The reply ended: tokens still held (a header cut short) are markers of the
        channel in force."""
        out = [Decision(self.channel, True)] * self._held
        self._held = 0
        self._header = None
        return out

    def _open(self, new: Channel) -> Channel:
        """Switch to ``new``; returns the channel of the marker that switched."""
        before = self.channel
        if new == REASONING and before != REASONING:
            self.reasoning_tokens = 0
        self.channel = new
        return REASONING if REASONING in (before, new) else ANSWER

    def _push_think(self, tid: int) -> Decision:
        fmt = self.fmt
        if tid == fmt.open_id:
            return Decision(self._open(REASONING), True)
        if tid == fmt.close_id:
            return Decision(self._open(ANSWER), True)
        if self.channel == REASONING:
            self.reasoning_tokens += 1
        return Decision(self.channel, False)

    def _push_harmony(self, tid: int) -> list[Decision]:
        fmt = self.fmt
        if self._header is not None:
            self._header.append(tid)
            self._held += 1
            if tid != fmt.message_id:
                return []
            channel = self._open(self._header_channel(self._header))
            out = [Decision(channel, True)] * self._held
            self._header, self._held = None, 0
            return out
        if tid in (fmt.start_id, fmt.channel_id):
            self._header, self._held = [tid], 1
            return []
        if tid == fmt.end_id:
            return [Decision(self.channel, True)]
        if self.channel == REASONING:
            self.reasoning_tokens += 1
        return [Decision(self.channel, False)]

    def _header_channel(self, header: list[int]) -> Channel:
        """The channel a finished header opens: reasoning when the ids after
        ``<|channel|>`` begin with a reasoning channel's name."""
        fmt = self.fmt
        if fmt.channel_id not in header:
            return ANSWER
        name = header[header.index(fmt.channel_id) + 1:]
        for i, tid in enumerate(name):
            if tid in fmt.header_stops:
                name = name[:i]
                break
        if self._decode is not None:
            text = self._decode(name).strip()
            word = text.split()[0] if text.split() else ""
            return REASONING if word in HARMONY_REASONING_CHANNELS else ANSWER
        for ids in fmt.reasoning_names:
            if ids and tuple(name[:len(ids)]) == ids:
                return REASONING
        return ANSWER
