"""The command line's options, each defined once: groups of flags as frozen dataclasses that
every command shares, validated when they are built (before any model loads), and the
``with_options`` decorator that turns a command's dataclass parameters into typer flags.

A command declares ``checkpoint: ModelOptions`` and gets ``--ckpt``, ``--device``, ... with the same
names, help and checks as every other command; a new flag is one field here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, NoReturn, Optional, TypeVar, get_type_hints

import typer

from inference.settings import SamplingParams, SettingsError, unescape

from ..backends import BackendOptions
from ..textfile import TextFileError, decode_text, read_text_file
from .terminal import piped_input


class UserError(Exception):
    """A mistake in the command line or its inputs: printed as one sentence, exit code 2."""


def fail(message: object) -> NoReturn:
    """Print ``chatui: <message>`` on stderr and exit with code 2."""
    print(f"chatui: {message}", file=sys.stderr)
    raise typer.Exit(2)


def _choose(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"unknown {what} {value!r}; choose {', '.join(choices[:-1])} or "
                        f"{choices[-1]}")


# ---- flags outside the groups (their defaults differ between commands) ----

TopLogprobs = Annotated[Optional[int], typer.Option(
    "--top-logprobs", help="Alternatives per token, 0-20 (default: 5; batch: 0).",
    show_default=False)]
SystemPrompt = Annotated[Optional[str], typer.Option("--system", help="System prompt.")]


def check_top_logprobs(k: int | None, default: int, *, unused: str | None = None) -> int:
    """The number of alternatives to ask for: ``default`` when the flag is not given; a flag
    given where nothing shows the alternatives is refused with ``unused``."""
    if k is None:
        return default
    if not 0 <= k <= 20:
        raise UserError(f"--top-logprobs must be between 0 and 20; got {k}")
    if unused is not None:
        raise UserError(unused)
    return k


# ---- the groups ----

QUANTIZE = ("auto", "none", "int8", "int4")
COMPILE = ("auto", "on", "off")
RUNNERS = ("auto", "fast", "hf")
BACKENDS = ("local", "openai", "scripted")


@dataclass(frozen=True)
class ModelOptions:
    """Where the local model comes from and how it runs (``--backend local`` only)."""

    ckpt: Annotated[Optional[str], typer.Option(
        "--ckpt", help="Checkpoint: a Hugging Face directory, a .gguf file, or a model name in "
                       "the local Hugging Face cache. Default: SmolLM2-135M-Instruct.")] = None
    device: Annotated[Optional[str], typer.Option(
        "--device", help="cpu, cuda, cuda:N or mps (default: CUDA when available, else "
                         "CPU).")] = None
    dtype: Annotated[Optional[str], typer.Option(
        "--dtype", help="float32, bfloat16, float16 or auto (default: bf16/fp16 on GPU, fp32 "
                        "on CPU).")] = None
    device_map: Annotated[Optional[str], typer.Option(
        "--device-map", help="'auto' shards a model that does not fit one GPU over "
                             "several.")] = None
    quantize: Annotated[str, typer.Option(
        "--quantize", help="Weight-only quantization at load time: auto (int8 on a CPU where "
                           "chatui's kernel builds, unless --dtype is given), none, int8 or "
                           "int4 (CPU; output layer 6-bit, or int8 when its width is not "
                           "a multiple of 256).")] = "auto"
    compile: Annotated[str, typer.Option(
        "--compile", help="The fast runner's decode step through torch.compile (and a CUDA "
                          "graph on CUDA): auto (CUDA only), on or off.")] = "auto"
    runner: Annotated[str, typer.Option(
        "--runner", help="auto (the fast runner where the model supports it), fast, or hf "
                         "(transformers' modules, for comparison).")] = "auto"
    trust_remote_code: Annotated[bool, typer.Option(
        "--trust-remote-code", help="Allow checkpoints that ship their own Python code.")] = False
    allow_pickle: Annotated[bool, typer.Option(
        "--allow-pickle", help="Allow pickle weights (pytorch_model.bin); pickle can run code, "
                               "use only for trusted files.")] = False

    def __post_init__(self) -> None:
        _choose("quantization", self.quantize, QUANTIZE)
        _choose("compile mode", self.compile, COMPILE)
        _choose("runner", self.runner, RUNNERS)
        if self.runner == "hf" and self.compile != "auto":
            raise UserError("--compile applies to the fast runner; --runner hf runs "
                            "transformers' modules, so leave --compile out")
        if self.runner == "hf" and self.quantize == "int4":
            raise UserError("--quantize int4 needs the fast runner; with --runner hf use "
                            "--quantize int8 or none (or leave it out)")

    def given(self) -> list[str]:
        """The flags set to something other than their default."""
        return [_flag(type(self), f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name) != f.default]


@dataclass(frozen=True)
class ServerOptions:
    """Which backend answers: this process, an OpenAI-compatible server, or the scripted one."""

    backend: Annotated[str, typer.Option(
        "--backend", help="local (a checkpoint in this process), openai (an OpenAI-compatible "
                          "server) or scripted (no model; for trying the interface).")] = "local"
    base_url: Annotated[Optional[str], typer.Option(
        "--base-url", help="Server URL for --backend openai.")] = None
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Model name on the server (default: the first one it lists).")] = None
    api_key_env: Annotated[Optional[str], typer.Option(
        "--api-key-env", help="Name of the environment variable that holds the server's API "
                              "key.")] = None

    def __post_init__(self) -> None:
        _choose("backend", self.backend, BACKENDS)
        if self.backend == "openai":
            if not self.base_url:
                raise UserError("--backend openai needs --base-url, e.g. "
                                "http://127.0.0.1:8000/v1")
            return
        given = [_flag(type(self), name) for name in ("base_url", "model", "api_key_env")
                 if getattr(self, name) is not None]
        if given:
            raise UserError(f"{', '.join(given)} applies to --backend openai only (the backend "
                            f"is {self.backend})")


def backend_options(model: ModelOptions, server: ServerOptions) -> BackendOptions:
    """The backend to build from both groups; a local-model flag with another backend is
    refused (it would be ignored)."""
    given = model.given()
    if server.backend != "local" and given:
        raise UserError(f"{', '.join(given)} applies to --backend local only (the backend is "
                        f"{server.backend})")
    return BackendOptions(
        backend=server.backend, ckpt=model.ckpt, device=model.device,  # type: ignore[arg-type]
        dtype=model.dtype, device_map=model.device_map, quantize=model.quantize,
        runner=model.runner, compile=model.compile, trust_remote_code=model.trust_remote_code,
        allow_pickle=model.allow_pickle, base_url=server.base_url, model=server.model,
        api_key_env=server.api_key_env)


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling flags; each one given replaces the model's default (``generation_config``)."""

    temperature: Annotated[Optional[float], typer.Option(
        "--temperature", help="0 is greedy (default: the model's).")] = None
    top_k: Annotated[Optional[int], typer.Option(
        "--top-k", help="Keep the k most likely tokens; 0 = off.")] = None
    top_p: Annotated[Optional[float], typer.Option(
        "--top-p", help="Nucleus sampling in (0, 1]; 1 = off.")] = None
    min_p: Annotated[Optional[float], typer.Option(
        "--min-p", help="Min-p in [0, 1); 0 = off.")] = None
    repetition_penalty: Annotated[Optional[float], typer.Option(
        "--repetition-penalty", help="In (0, 10]; 1 = off.")] = None
    seed: Annotated[Optional[int], typer.Option(
        "--seed", help="Seed for reproducible sampling.")] = None
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", help="Most new tokens.")] = None
    stop: Annotated[Optional[list[str]], typer.Option(
        "--stop", help="A string that ends the reply (repeatable, one string each; \\n "
                       "escapes allowed).")] = None
    reasoning_budget: Annotated[Optional[int], typer.Option(
        "--reasoning-budget", help="A reasoning model's most tokens of reasoning: then its "
                                   "closing marker (</think>) is inserted.")] = None

    def __post_init__(self) -> None:
        SamplingParams().with_values(**self.overrides())  # raises SettingsError with the range

    def overrides(self) -> dict[str, Any]:
        """The flags the user gave, by setting name (``{"temperature": 0.2}``)."""
        given: dict[str, Any] = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name != "stop" and getattr(self, f.name) is not None}
        if self.stop is not None:
            # one string per flag, commas included (the settings' own text form splits at commas)
            given["stop"] = tuple(unescape(s) for s in self.stop)
        return given


@dataclass(frozen=True)
class PromptOptions:
    """One user message, typed (``chatui generate "TEXT"`` or ``-p TEXT``) or read from a
    file or standard input (``--prompt-file -``, or nothing given while text is piped in:
    ``echo TEXT | chatui generate``), and an optional system prompt."""

    words: Annotated[Optional[str], typer.Argument(
        metavar="PROMPT", help="The user message (as -p gives it).", show_default=False)] = None
    prompt: Annotated[Optional[str], typer.Option(
        "-p", "--prompt", help="The user message.")] = None
    prompt_file: Annotated[Optional[Path], typer.Option(
        "--prompt-file", help="Read the user message from a UTF-8 file (- reads standard "
                              "input).")] = None
    system: SystemPrompt = None

    def __post_init__(self) -> None:
        given = [self.words is not None, self.prompt is not None, self.prompt_file is not None]
        if sum(given) > 1:
            raise UserError("give the prompt one way, not both: PROMPT, -p TEXT or "
                            "--prompt-file FILE")
        if not any(given):
            if not piped_input():
                raise UserError('give a prompt: "TEXT", -p TEXT or --prompt-file FILE (- reads '
                                "standard input), or pipe it in")
            object.__setattr__(self, "prompt_file", Path("-"))
        if self.prompt is not None and not self.prompt.strip():
            raise UserError("the prompt given with -p is empty; give some text")
        if self.words is not None and not self.words.strip():
            raise UserError("the prompt given is empty; give some text")

    def text(self) -> str:
        """The user message (reads the file, or standard input for ``-``)."""
        if self.prompt_file is None:
            typed = self.prompt if self.prompt is not None else self.words
            assert typed is not None
            return typed
        stdin = str(self.prompt_file) == "-"
        try:
            text = (decode_text(sys.stdin.buffer.read(), "standard input") if stdin
                    else read_text_file(self.prompt_file, "the prompt file"))
        except TextFileError as exc:
            raise UserError(str(exc)) from None
        if not text.strip():
            raise UserError("standard input is empty" if stdin
                            else f"the prompt file {self.prompt_file} is empty")
        # the file's last line break (echo's, an editor's) is not the prompt's: with it, the
        # same words got another reply than typed ones (temperature 0, the default model)
        return text.rstrip("\r\n")


# ---- typer glue ----

OPTION_GROUPS = (ModelOptions, ServerOptions, SamplingOptions, PromptOptions)
F = TypeVar("F", bound=Callable[..., Any])


def _flag(group: type, name: str) -> str:
    """The flag a field is spelled as (``--top-k`` for ``top_k``)."""
    info = get_type_hints(group, include_extras=True)[name].__metadata__[0]
    decls = [d for d in (info.default, *(info.param_decls or ())) if isinstance(d, str)]
    return next((d for d in decls if d.startswith("--")), f"--{name.replace('_', '-')}")


def with_options(fn: F) -> F:
    """Make a command's option-group parameters (``checkpoint: ModelOptions``) into typer
    flags.

    Typer sees every field of each group as a flag; the command receives the group built
    from them. A group that refuses its values (:class:`UserError`, ``SettingsError``) ends
    the command with one sentence and exit code 2 before its body runs.
    """
    hints = get_type_hints(fn, include_extras=True)
    params: list[inspect.Parameter] = []
    groups: dict[str, tuple[type, list[str]]] = {}
    for p in inspect.signature(fn).parameters.values():
        group = hints.get(p.name)
        if group in OPTION_GROUPS:
            assert isinstance(group, type)
            field_hints = get_type_hints(group, include_extras=True)
            names = [f.name for f in dataclasses.fields(group)]
            for f in dataclasses.fields(group):
                params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY,
                                                default=f.default,
                                                annotation=field_hints[f.name]))
            groups[p.name] = (group, names)
        else:
            params.append(p.replace(kind=inspect.Parameter.KEYWORD_ONLY,
                                    annotation=hints.get(p.name, p.annotation)))
    names_seen = [p.name for p in params] + list(groups)
    assert len(names_seen) == len(set(names_seen)), f"a name is used twice in {fn.__name__}"

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        try:
            for name, (group, fields) in groups.items():
                kwargs[name] = group(**{f: kwargs.pop(f) for f in fields})
        except (UserError, SettingsError) as exc:
            fail(exc)
        return fn(**kwargs)

    del command.__wrapped__  # typer must read the flags below, not the grouped signature
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command  # type: ignore[return-value]
