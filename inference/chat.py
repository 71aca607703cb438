"""Chat encoding in one place: messages -> prompt ids through the tokenizer's chat template,
fitted to the model's context by dropping the oldest turns (the system prompt stays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .types import AssistantPrefix, Message


class PromptTooLongError(ValueError):
    """Even the newest message alone does not fit the context."""


GENERIC_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML, for checkpoints that ship no template (a warning says so); it starts with the
tokenizer's BOS token when it has one, as the tokenizer's own encoding would."""


@dataclass(frozen=True)
class TemplateOptions:
    """What a request sets in the chat template beyond the messages."""

    thinking: bool | None = None
    """The template's reasoning switch (``enable_thinking``); None: the template's default."""
    reasoning_key: str = ""
    """The message key under which the template reads an earlier reply's reasoning
    (``reasoning_content``); "" leaves reasoning out of the prompt."""

    def kwargs(self) -> dict[str, Any]:
        return {} if self.thinking is None else {"enable_thinking": self.thinking}


NO_OPTIONS = TemplateOptions()


@dataclass(frozen=True)
class EncodedPrompt:
    """A conversation ready for the model."""

    ids: list[int]
    dropped_messages: int
    """How many of the oldest non-system messages were left out to fit."""


def _as_dicts(messages: Sequence[Message], reasoning_key: str = "") -> list[dict[str, str]]:
    out = []
    for m in messages:
        d = {"role": m.role, "content": m.content}
        if reasoning_key and m.reasoning and m.role == "assistant":
            d[reasoning_key] = m.reasoning  # the template decides whether it is kept
        out.append(d)
    return out


def encode_messages(tokenizer: Any, messages: Sequence[Message],
                    prefix: AssistantPrefix | None = None,
                    options: TemplateOptions = NO_OPTIONS) -> list[int]:
    """Encode with the chat template and the generation prompt.

    Control tokens typed in messages (e.g. ``<|im_end|>``) are encoded as plain text. With a
    ``prefix`` the assistant reply is left open after it: its exact ``token_ids`` are appended
    when given, else its text is encoded as the open final message.
    """
    msgs = _as_dicts(messages, options.reasoning_key)
    extra = options.kwargs()
    if prefix is not None and prefix.token_ids is None:
        msgs.append({"role": "assistant", "content": prefix.text})
        return list(tokenizer.apply_chat_template(
            msgs, continue_final_message=True, tokenize=True, return_dict=False,
            sanitize_control_tokens=True, **extra))
    ids = list(tokenizer.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=False,
        sanitize_control_tokens=True, **extra))
    if prefix is not None and prefix.token_ids is not None:
        ids += list(prefix.token_ids)
    return ids


def encode_raw(tokenizer: Any, text: str, budget: int,
               context: int | None = None) -> EncodedPrompt:
    """A plain prompt for raw completion: ``text`` as the tokenizer encodes it (its BOS token
    added when the tokenizer adds one), no chat template. A text over ``budget`` is continued
    in the room left, up to ``context`` (the model's whole context): a document is continued
    as a reply is (``fit_to_context``), not refused while the context still has room.

    Raises:
        PromptTooLongError: when it takes more than ``budget`` tokens (with ``context``: when
            it leaves no room for one more token).
    """
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    if context is not None and budget < len(ids) < context:
        return EncodedPrompt(ids, 0)
    if context is not None and len(ids) > budget:
        raise PromptTooLongError(
            f"The text fills the model's context: it takes {len(ids)} tokens, and the model "
            f"holds {context}.")
    if len(ids) > budget:
        raise PromptTooLongError(
            f"The text is too long for the model's context: it takes {len(ids)} tokens and at "
            f"most {budget} fit (with room kept for the continuation).")
    return EncodedPrompt(ids, 0)


def encode_request(tokenizer: Any, messages: Sequence[Message], budget: int,
                   prefix: AssistantPrefix | None = None, raw: bool = False,
                   options: TemplateOptions = NO_OPTIONS,
                   context: int | None = None) -> EncodedPrompt:
    """A request's prompt: the plain text of its one message when ``raw``, else the chat
    (:func:`fit_to_context`)."""
    if raw:
        return encode_raw(tokenizer, messages[0].content, budget, context)
    return fit_to_context(tokenizer, messages, budget, prefix, options, context)


def fit_to_context(tokenizer: Any, messages: Sequence[Message], budget: int,
                   prefix: AssistantPrefix | None = None,
                   options: TemplateOptions = NO_OPTIONS,
                   context: int | None = None) -> EncodedPrompt:
    """Encode ``messages``, dropping the oldest turns until the prompt takes at most ``budget``
    tokens. The system prompt and the newest user message always stay.

    A reply continued (``prefix``) whose tokens leave less room than ``budget`` keeps for it
    once every older turn is out goes on in the room there is, up to ``context`` (the model's
    whole context): ``/continue`` on a long reply near the end of the context failed, saying
    "the message is too long" of a message the user had not changed.

    Raises:
        PromptTooLongError: when the system prompt and the last message alone do not fit (a
            reply continued: when they leave no room for one more token).
    """
    system = [m for m in messages[:1] if m.role == "system"]
    rest = list(messages[len(system):])
    dropped = 0
    while True:
        ids = encode_messages(tokenizer, system + rest, prefix, options)
        if len(ids) <= budget:
            return EncodedPrompt(ids, dropped)
        if len(rest) <= 1:
            if prefix is None:
                raise PromptTooLongError(
                    f"The message is too long for the model's context: it takes {len(ids)} "
                    f"tokens and at most {budget} fit (with room kept for the reply).")
            if context is not None and len(ids) < context:
                return EncodedPrompt(ids, dropped)
            raise PromptTooLongError(
                f"There is no room left to go on: the reply and the message it answers take "
                f"{len(ids)} tokens, and the model's context holds {context or budget}.")
        # Drop the oldest turn; keep the conversation starting with a user message.
        rest.pop(0)
        dropped += 1
        while len(rest) > 1 and rest[0].role != "user":
            rest.pop(0)
            dropped += 1
