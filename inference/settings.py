"""Sampling settings: one frozen, validated dataclass shared by every backend.

Invalid values raise :class:`SettingsError` with a sentence that says the valid range, so the
CLI, the slash commands and the compare screen can show it as is.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping


class SettingsError(ValueError):
    """A sampling setting is out of range or cannot be parsed; the message says how to fix it."""


# Names a user may type (``/set top_p 0.9``, ``--setting temperature=0``) -> field names.
ALIASES: dict[str, str] = {
    "temp": "temperature",
    "t": "temperature",
    "max_tokens": "max_new_tokens",
    "max": "max_new_tokens",
    "rep": "repetition_penalty",
    "repeat_penalty": "repetition_penalty",
    "topk": "top_k",
    "topp": "top_p",
    "minp": "min_p",
}


@dataclass(frozen=True)
class SamplingParams:
    """How one reply is sampled. Every backend takes exactly this object."""

    temperature: float = 0.7
    """Softmax temperature; 0 means greedy (always the most likely token)."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables the filter."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability sums to at least top_p; 1 disables."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one; 0 disables."""
    repetition_penalty: float = 1.0
    """Divide positive logits (multiply negative ones) of tokens already seen; 1 disables."""
    seed: int | None = None
    """Seed for this reply's random draws; the same seed and settings give the same reply."""
    max_new_tokens: int = 512
    """Most tokens the reply may have."""
    stop: tuple[str, ...] = field(default=())
    """Strings that end the reply when generated (they are not shown)."""
    reasoning_budget: int | None = None
    """Most tokens of reasoning: after this many the closing marker (``</think>``) is
    inserted, as llama.cpp's ``--reasoning-budget``; None for no limit."""

    def __post_init__(self) -> None:
        _check(isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
               and 0 <= self.temperature <= 100,
               f"temperature must be between 0 and 100 (0 is greedy); got {self.temperature!r}")
        _check(_is_int(self.top_k) and 0 <= self.top_k <= 1_000_000,
               f"top_k must be a whole number >= 0 (0 disables it); got {self.top_k!r}")
        _check(isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1,
               f"top_p must be in (0, 1] (1 disables it); got {self.top_p!r}")
        _check(isinstance(self.min_p, (int, float)) and 0 <= self.min_p < 1,
               f"min_p must be in [0, 1) (0 disables it); got {self.min_p!r}")
        _check(isinstance(self.repetition_penalty, (int, float))
               and 0 < self.repetition_penalty <= 10,
               f"repetition_penalty must be in (0, 10] (1 disables it); got {self.repetition_penalty!r}")
        _check(self.seed is None or (_is_int(self.seed) and 0 <= self.seed < 2**63),
               f"seed must be a whole number between 0 and 2^63-1, or none; got {self.seed!r}")
        _check(_is_int(self.max_new_tokens) and 1 <= self.max_new_tokens <= 1_000_000,
               f"max_tokens must be a whole number between 1 and 1000000; got {self.max_new_tokens!r}")
        _check(isinstance(self.stop, tuple) and all(isinstance(s, str) and s for s in self.stop),
               "stop must be a list of non-empty strings")
        _check(len(self.stop) <= 16, "at most 16 stop strings")
        _check(self.reasoning_budget is None or (_is_int(self.reasoning_budget)
                                                 and 0 <= self.reasoning_budget <= 1_000_000),
               "reasoning_budget must be a whole number between 0 and 1000000, or none; "
               f"got {self.reasoning_budget!r}")

    @property
    def greedy(self) -> bool:
        """True when the reply is deterministic whatever the seed."""
        return self.temperature == 0 or self.top_k == 1

    def with_values(self, **values: Any) -> SamplingParams:
        """A copy with some fields changed, given by user-facing names and raw (string) values."""
        return dataclasses.replace(self, **{k: v for k, v in _coerce_all(values).items()})

    def describe(self, *, against: SamplingParams | None = None) -> str:
        """A short human label: every field that differs from ``against`` (or all main ones)."""
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if against is not None and getattr(against, f.name) == value:
                continue
            if against is None and f.name in ("stop",) and not value:
                continue
            if against is None and f.name == "reasoning_budget" and value is None:
                continue
            name = "max_tokens" if f.name == "max_new_tokens" else f.name
            if f.name == "stop":
                value = ",".join(value)
            parts.append(f"{name}={_fmt(value)}")
        return " ".join(parts) if parts else "defaults"

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (for transcripts)."""
        d = dataclasses.asdict(self)
        d["stop"] = list(self.stop)
        if self.reasoning_budget is None:  # optional: older readers never saw it
            del d["reasoning_budget"]
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        return cls().with_values(**dict(data))


SHOWN_NAMES: dict[str, str] = {"temperature": "temp", "max_new_tokens": "max",
                               "repetition_penalty": "rep"}
"""The short names the UI shows a setting by (each one an alias ``/set`` takes, so a label can
be typed back); the other fields are shown by their own names."""

ALWAYS_SHOWN = ("temperature", "max_new_tokens")
"""The fields a label names even at their defaults: the others at their defaults do nothing."""


def setting_words(name: str, value: Any) -> str:
    """One setting as the UI shows it, in the words ``/set`` takes: "temp 0.7", "max 512",
    "top_p 0.9", "stop </s>,###"."""
    return f"{SHOWN_NAMES.get(name, name)} {value_words(name, value)}"


def value_words(name: str, value: Any) -> str:
    """A setting's value as ``/set`` takes it: "0.7", "</s>,###", "none"."""
    if name == "stop":
        value = ",".join(value)
    return _fmt(value) if value not in (None, "") else "none"


def does_nothing(name: str, value: Any) -> bool:
    """Whether a setting at ``value`` leaves sampling as it is (top_p 1, top_k 0, min_p 0, rep
    1, no seed, no stop strings, no reasoning budget): a label leaves it out."""
    default = SamplingParams.__dataclass_fields__[name].default
    if name == "stop":
        default = ()
    return name not in ALWAYS_SHOWN and value == default


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise SettingsError(message)


FIELD_NAMES = tuple(f.name for f in dataclasses.fields(SamplingParams))
USER_NAMES = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "seed",
              "max_tokens", "stop", "reasoning_budget")


def canonical_name(name: str) -> str:
    """Map a user-typed setting name to the field name, or raise SettingsError."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in FIELD_NAMES:
        raise SettingsError(
            f"unknown setting {name!r}; known settings: {', '.join(USER_NAMES)}")
    return key


def _coerce(name: str, raw: Any) -> Any:
    if not isinstance(raw, str):
        if name == "stop" and isinstance(raw, (list, tuple)):
            return tuple(raw)
        if name in ("temperature", "top_p", "min_p", "repetition_penalty") and _is_int(raw):
            return float(raw)
        return raw
    if name == "stop":  # comma-separated; backslash escapes (\\n) allowed; no stripping
        parts = [unescape(p) for p in raw.split(",")]
        return tuple(p for p in parts if p)
    text = raw.strip()
    try:
        if name == "seed":
            return None if text.lower() in ("none", "random", "") else int(text)
        if name == "reasoning_budget":
            return None if text.lower() in ("none", "off", "-1", "") else int(text)
        if name in ("top_k", "max_new_tokens"):
            return int(text)
        return float(text)
    except ValueError:
        kind = ("a whole number" if name in ("seed", "top_k", "max_new_tokens",
                                              "reasoning_budget") else "a number")
        raise SettingsError(f"{name} must be {kind}; got {raw!r}") from None


def unescape(text: str) -> str:
    """Turn typed escapes (``\\n``, ``\\t``, ``\\u2028``) into the characters they name."""
    if "\\" not in text:
        return text
    try:
        return text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    except UnicodeDecodeError:
        return text


def _coerce_all(values: Mapping[str, Any]) -> dict[str, Any]:
    return {canonical_name(k): _coerce(canonical_name(k), v) for k, v in values.items()}


def parse_assignments(text: str, base: SamplingParams | None = None) -> SamplingParams:
    """Parse ``"temperature=0.7 top_p=0.9"`` onto ``base``: pairs ``NAME=VALUE`` or ``NAME
    VALUE``, between them spaces, commas or "·". The second form is how the app shows settings
    (``temp 0.7 · max 512``, a comparison's column labels), and ``/compare temp 0 | temp 1`` was
    refused ("expected NAME=VALUE, got 'temp'": seen in tmux).

    Raises:
        SettingsError: for a name without a value, an unknown name or an invalid value.
    """
    base = base or SamplingParams()
    words = text.replace(",", " ").replace("·", " ").split()
    values: dict[str, str] = {}
    while words:
        word = words.pop(0)
        name, equals, value = word.partition("=")
        if not equals:
            canonical_name(name)  # an unknown word is named as such, not as a missing value
            if not words or "=" in words[0]:
                raise SettingsError(f"{name} needs a value: {name}=VALUE or {name} VALUE (e.g. "
                                    "temperature=0.7)")
            value = words.pop(0)
        values[name] = value
    return base.with_values(**values)


def defaults_from_generation_config(gen: Any, base: SamplingParams | None = None) -> SamplingParams:
    """Sampling defaults from a transformers ``GenerationConfig`` (``generation_config.json``).

    Only values the file sets explicitly and that are valid are taken; ``do_sample=False``
    means greedy.
    """
    base = base or SamplingParams()
    if gen is None:
        return base
    explicit: dict[str, Any] = {}
    try:
        explicit = dict(gen.to_diff_dict()) if hasattr(gen, "to_diff_dict") else dict(gen)
    except Exception:  # noqa: BLE001 - a strange config just gives no defaults
        return base
    values: dict[str, Any] = {}
    for src, dst in (("temperature", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"),
                     ("min_p", "min_p"), ("repetition_penalty", "repetition_penalty"),
                     ("max_new_tokens", "max_new_tokens")):
        if explicit.get(src) is not None:
            values[dst] = explicit[src]
    if explicit.get("do_sample") is False:
        values["temperature"] = 0.0
    params = base
    for k, v in values.items():
        try:
            params = params.with_values(**{k: v})
        except SettingsError:
            continue
    return params
