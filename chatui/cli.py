"""The ``chatui`` command line: the chat TUI, and headless generate / batch / compare / bench /
export commands. Every command takes the same model flags."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from inference.settings import SamplingParams, SettingsError, parse_assignments
from inference.types import (Failed, GenerationRequest, Message, Progress, RowDone, Started,
                             Token, TokenBatch)
from inference.worker import InferenceWorker

from . import __version__
from .backends import BackendOptions, make_factory

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="A terminal chat app for local LLM checkpoints, with live per-token "
                       "logprobs. With no command, opens the chat.")


class UserError(Exception):
    """A mistake in the command line or its inputs: printed as one sentence, exit code 2."""


# ---- shared options ----

Ckpt = Annotated[Optional[str], typer.Option(
    "--ckpt", help="Checkpoint: a Hugging Face directory, a .gguf file, or a model name in the "
                   "local Hugging Face cache. Default: SmolLM2-135M-Instruct.")]
Device = Annotated[Optional[str], typer.Option(help="cpu, cuda, cuda:N or mps (default: CUDA when "
                                                    "available, else CPU).")]
Dtype = Annotated[Optional[str], typer.Option(help="float32, bfloat16, float16 or auto (default: "
                                                   "bf16/fp16 on GPU, fp32 on CPU).")]
DeviceMap = Annotated[Optional[str], typer.Option(
    "--device-map", help="'auto' shards a model that does not fit one GPU over several.")]
Quantize = Annotated[str, typer.Option(help="Weight-only quantization at load time: auto (int8 on "
                                             "a CPU where chatui's kernel builds, unless --dtype "
                                             "is given), none, int8 or int4 (CPU; output layer "
                                             "int8).")]
CompileStep = Annotated[str, typer.Option(
    "--compile", help="The fast runner's decode step through torch.compile (and a CUDA graph on "
                      "CUDA): auto (CUDA only), on or off.")]
TrustRemote = Annotated[bool, typer.Option("--trust-remote-code",
                                           help="Allow checkpoints that ship their own Python code.")]
AllowPickle = Annotated[bool, typer.Option("--allow-pickle",
                                           help="Allow pickle weights (pytorch_model.bin); pickle "
                                                "can run code, use only for trusted files.")]
BackendName = Annotated[str, typer.Option(
    "--backend", help="local (a checkpoint in this process), openai (an OpenAI-compatible server) "
                      "or scripted (no model; for trying the interface).")]
BaseUrl = Annotated[Optional[str], typer.Option("--base-url",
                                                help="Server URL for --backend openai.")]
ModelName = Annotated[Optional[str], typer.Option(
    "--model", help="Model name on the server (default: the first one it lists).")]
ApiKeyEnv = Annotated[Optional[str], typer.Option(
    "--api-key-env", help="Name of the environment variable that holds the server's API key.")]

Temperature = Annotated[Optional[float], typer.Option(help="0 is greedy (default: the model's).")]
TopK = Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens; 0 = off.")]
TopP = Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling in (0, 1]; 1 = off.")]
MinP = Annotated[Optional[float], typer.Option("--min-p", help="Min-p in [0, 1); 0 = off.")]
RepPenalty = Annotated[Optional[float], typer.Option("--repetition-penalty",
                                                     help="In (0, 10]; 1 = off.")]
Seed = Annotated[Optional[int], typer.Option(help="Seed for reproducible sampling.")]
MaxTokens = Annotated[Optional[int], typer.Option("--max-tokens", help="Most new tokens.")]
Stop = Annotated[Optional[list[str]], typer.Option(
    "--stop", help="A string that ends the reply (repeatable; \\n escapes allowed).")]
TopLogprobs = Annotated[int, typer.Option("--top-logprobs", help="Alternatives per token (0-20).")]


def _options(backend: str, ckpt: str | None, device: str | None, dtype: str | None,
             device_map: str | None, quantize: str, trust_remote_code: bool, allow_pickle: bool,
             base_url: str | None, model: str | None, api_key_env: str | None) -> BackendOptions:
    if backend not in ("local", "openai", "scripted"):
        raise UserError(f"unknown backend {backend!r}; choose local, openai or scripted")
    if quantize not in ("auto", "none", "int8", "int4"):
        raise UserError(f"unknown quantization {quantize!r}; choose auto, none, int8 or int4")
    if backend == "openai" and not base_url:
        raise UserError("--backend openai needs --base-url, e.g. http://127.0.0.1:8000/v1")
    return BackendOptions(backend=backend, ckpt=ckpt, device=device, dtype=dtype,  # type: ignore[arg-type]
                          device_map=device_map, quantize=quantize,
                          trust_remote_code=trust_remote_code, allow_pickle=allow_pickle,
                          base_url=base_url, model=model, api_key_env=api_key_env)


def _overrides(temperature: float | None, top_k: int | None, top_p: float | None,
               min_p: float | None, repetition_penalty: float | None, seed: int | None,
               max_tokens: int | None, stop: list[str] | None) -> dict[str, Any]:
    """Sampling flags the user gave, validated now (before any model loads)."""
    given = {k: v for k, v in dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                   min_p=min_p, repetition_penalty=repetition_penalty, seed=seed,
                                   max_tokens=max_tokens).items() if v is not None}
    if stop:
        given["stop"] = ",".join(stop)
    SamplingParams().with_values(**given)  # raises SettingsError with the valid range
    return given


def _progress_line(p: Progress) -> None:
    total = f"/{p.total:g}" if p.total else ""
    print(f"\r{p.stage}: {p.done:g}{total}   ", end="", file=sys.stderr, flush=True)


async def _load(opts: BackendOptions, *, quiet: bool = False) -> InferenceWorker:
    try:
        factory = make_factory(opts)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    worker = InferenceWorker(factory, isolate=False)  # headless: no UI to keep away from
    shown = False
    async for group in worker.load():
        for ev in group:
            if isinstance(ev, Failed):
                await worker.aclose()
                if shown:
                    print(file=sys.stderr)
                raise UserError(ev.message)
            if isinstance(ev, Progress) and not quiet and sys.stderr.isatty():
                shown = True
                _progress_line(ev)
    if shown:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr, flush=True)
    info = worker.info
    if info is not None and info.chat_template_warning:
        print(f"warning: {info.chat_template_warning}", file=sys.stderr)
    return worker


def _token_json(t: Token, row: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "token"}
    if row is not None:
        d["row"] = row
    d.update({"id": t.id, "text": t.text, "logprob": t.logprob, "entropy": t.entropy,
              "top": [{"id": a.id, "text": a.text, "logprob": a.logprob} for a in t.top]})
    if t.special:
        d["special"] = True
    return d


def _done_json(d: RowDone, started: Started | None, row: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "done"}
    if row is not None:
        out["row"] = row
    out.update({"finish_reason": d.finish_reason, "prompt_tokens": d.usage.prompt_tokens,
                "completion_tokens": d.usage.completion_tokens,
                "cached_tokens": d.usage.cached_tokens, "ttft_s": round(d.usage.ttft_s, 4),
                "decode_tokens_per_s": round(d.usage.decode_tokens_per_s, 2)})
    if started is not None and started.dropped_messages:
        out["dropped_messages"] = started.dropped_messages
    return out


def _print_logprob_token(t: Token) -> None:
    if t.logprob is None:
        print(f"{'':>9}  {t.text!r}")
        return
    alts = "  ".join(f"{a.text!r} {a.logprob:.2f}" for a in t.top if a.id != t.id)
    print(f"{t.logprob:9.4f}  {t.prob:7.2%}  {t.text or t.raw!r:<20}  {alts}")


def _run(coro: Any) -> Any:
    try:
        return asyncio.run(coro)
    except UserError as exc:
        print(f"chatui: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    except SettingsError as exc:
        print(f"chatui: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None


async def _stream(worker: InferenceWorker, request: GenerationRequest, *, as_json: bool,
                  show_logprobs: bool, tag_rows: bool) -> list[RowDone]:
    """Stream a request to stdout; Ctrl+C stops it (the partial reply is kept)."""
    stream = worker.generate(request)
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, stream.cancel)
    except (NotImplementedError, RuntimeError):
        pass
    started: Started | None = None
    done: list[RowDone] = []
    failed: Failed | None = None
    try:
        async for group in stream:
            for ev in group:
                if isinstance(ev, Started):
                    started = ev
                    if ev.dropped_messages:
                        print(f"note: the {ev.dropped_messages} oldest messages were left out to "
                              f"fit the context of {ev.context_limit} tokens", file=sys.stderr)
                elif isinstance(ev, TokenBatch):
                    for t in ev.tokens:
                        if as_json:
                            print(json.dumps(_token_json(t, ev.row if tag_rows else None),
                                             ensure_ascii=False))
                        elif show_logprobs:
                            _print_logprob_token(t)
                        elif not tag_rows:
                            print(t.text, end="", flush=True)
                elif isinstance(ev, RowDone):
                    done.append(ev)
                    if as_json:
                        print(json.dumps(_done_json(ev, started, ev.row if tag_rows else None)))
                elif isinstance(ev, Failed):
                    failed = ev
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError):
            pass
    if not as_json and not show_logprobs and not tag_rows:
        print()
        if done and done[0].finish_reason != "stop":
            print(f"[{done[0].finish_reason}]", file=sys.stderr)
    if failed is not None:
        raise UserError(failed.message)
    return sorted(done, key=lambda d: d.row)


def _settings(worker: InferenceWorker, given: dict[str, Any]) -> SamplingParams:
    base = worker.info.default_settings if worker.info else SamplingParams()
    return base.with_values(**given)


# ---- the chat (no command) ----


@app.callback(invoke_without_command=True)
def main_command(
    ctx: typer.Context,
    ckpt: Ckpt = None, device: Device = None, dtype: Dtype = None, device_map: DeviceMap = None,
    quantize: Quantize = "auto", compile_step: CompileStep = "auto",
    trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False, backend: BackendName = "local", base_url: BaseUrl = None,
    model: ModelName = None, api_key_env: ApiKeyEnv = None,
    theme: Annotated[Optional[str], typer.Option(help="Colour theme (remembered).")] = None,
    load: Annotated[Optional[Path], typer.Option(help="Resume a saved transcript.")] = None,
    system: Annotated[str, typer.Option(help="System prompt for a new conversation.")] = "",
    temperature: Temperature = None, top_k: TopK = None, top_p: TopP = None, min_p: MinP = None,
    repetition_penalty: RepPenalty = None, seed: Seed = None, max_tokens: MaxTokens = None,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """Open the chat (the default command)."""
    if version:
        print(f"chatui {__version__}")
        raise typer.Exit()
    if ctx.invoked_subcommand is not None:
        return
    try:
        opts = _options(backend, ckpt, device, dtype, device_map, quantize, trust_remote_code,
                        allow_pickle, base_url, model, api_key_env)
        if compile_step not in ("auto", "on", "off"):
            raise UserError(f"unknown compile mode {compile_step!r}; choose auto, on or off")
        from dataclasses import replace

        opts = replace(opts, compile=compile_step)
        given = _overrides(temperature, top_k, top_p, min_p, repetition_penalty, seed,
                           max_tokens, None)
        factory = make_factory(opts)
    except (UserError, SettingsError, ValueError) as exc:
        print(f"chatui: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    if load is not None and not load.exists():
        print(f"chatui: no such transcript: {load}", file=sys.stderr)
        raise typer.Exit(2)
    from .app import run_chat
    from .config import AppConfig

    config = AppConfig(theme=theme, load_path=load, system_prompt=system,
                       settings_overrides=given)
    raise typer.Exit(run_chat(factory, config))


# ---- headless commands ----


@app.command()
def generate(
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="The user message.")] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file",
                                                        help="Read the user message from a file.")] = None,
    system: Annotated[Optional[str], typer.Option(help="System prompt.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    show_logprobs: Annotated[bool, typer.Option("--show-logprobs",
                                                help="Print each token with its logprob.")] = False,
    top_logprobs: TopLogprobs = 5,
    temperature: Temperature = None, top_k: TopK = None, top_p: TopP = None, min_p: MinP = None,
    repetition_penalty: RepPenalty = None, seed: Seed = None, max_tokens: MaxTokens = None,
    stop: Stop = None,
    ckpt: Ckpt = None, device: Device = None, dtype: Dtype = None, device_map: DeviceMap = None,
    quantize: Quantize = "auto", trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False, backend: BackendName = "local", base_url: BaseUrl = None,
    model: ModelName = None, api_key_env: ApiKeyEnv = None,
) -> None:
    """Stream one reply to a prompt."""

    async def go() -> None:
        text = _read_prompt(prompt, prompt_file)
        given = _overrides(temperature, top_k, top_p, min_p, repetition_penalty, seed,
                           max_tokens, stop)
        _check_top(top_logprobs)
        opts = _options(backend, ckpt, device, dtype, device_map, quantize, trust_remote_code,
                        allow_pickle, base_url, model, api_key_env)
        worker = await _load(opts)
        try:
            messages = ((Message("system", system),) if system else ()) + (Message("user", text),)
            req = GenerationRequest(messages, (_settings(worker, given),), top_logprobs)
            await _stream(worker, req, as_json=as_json, show_logprobs=show_logprobs,
                          tag_rows=False)
        finally:
            await worker.aclose()

    _run(go())


def _check_top(k: int) -> None:
    if not 0 <= k <= 20:
        raise UserError(f"--top-logprobs must be between 0 and 20; got {k}")


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt_file is not None:
        try:
            text = prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserError(f"cannot read the prompt file {prompt_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise UserError(f"the prompt file {prompt_file} is not UTF-8 text") from None
        return text
    if prompt is None:
        raise UserError("give a prompt with -p TEXT or --prompt-file FILE")
    return prompt


@app.command()
def batch(
    input_file: Annotated[Path, typer.Option("--input-file", help="One prompt per line.")],
    output: Annotated[Optional[Path], typer.Option(help="Write JSON lines here (default: stdout).")] = None,
    system: Annotated[Optional[str], typer.Option(help="System prompt for every prompt.")] = None,
    top_logprobs: TopLogprobs = 0,
    temperature: Temperature = None, top_k: TopK = None, top_p: TopP = None, min_p: MinP = None,
    repetition_penalty: RepPenalty = None, seed: Seed = None, max_tokens: MaxTokens = None,
    stop: Stop = None,
    ckpt: Ckpt = None, device: Device = None, dtype: Dtype = None, device_map: DeviceMap = None,
    quantize: Quantize = "auto", trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False, backend: BackendName = "local", base_url: BaseUrl = None,
    model: ModelName = None, api_key_env: ApiKeyEnv = None,
) -> None:
    """Answer every line of a file as one batch; results in input order as JSON lines."""

    async def go() -> None:
        try:
            lines = input_file.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UserError(f"cannot read {input_file}: {exc.strerror}") from None
        prompts = [ln for ln in lines if ln.strip()]
        if not prompts:
            raise UserError(f"{input_file} has no prompts (one per line)")
        given = _overrides(temperature, top_k, top_p, min_p, repetition_penalty, seed,
                           max_tokens, stop)
        _check_top(top_logprobs)
        opts = _options(backend, ckpt, device, dtype, device_map, quantize, trust_remote_code,
                        allow_pickle, base_url, model, api_key_env)
        worker = await _load(opts)
        try:
            s = _settings(worker, given)
            sys_msg = (Message("system", system),) if system else ()
            reqs = [GenerationRequest(sys_msg + (Message("user", p),), (s,), top_logprobs)
                    for p in prompts]
            tokens: dict[int, list[Token]] = {i: [] for i in range(len(prompts))}
            done: dict[int, RowDone] = {}
            async for group in worker.generate_batch(reqs):
                for ev in group:
                    if isinstance(ev, TokenBatch):
                        tokens[ev.row].extend(ev.tokens)
                    elif isinstance(ev, RowDone):
                        done[ev.row] = ev
                    elif isinstance(ev, Failed):
                        raise UserError(ev.message)
        finally:
            await worker.aclose()
        out_lines = []
        for i, p in enumerate(prompts):
            d = done[i]
            rec = {"index": i, "prompt": p, "text": d.text, **_done_json(d, None)}
            rec.pop("type")
            if top_logprobs:
                rec["tokens"] = [_token_json(t) for t in tokens[i]]
            out_lines.append(json.dumps(rec, ensure_ascii=False))
        data = "\n".join(out_lines) + "\n"
        if output is None:
            sys.stdout.write(data)
        else:
            try:
                output.write_text(data, encoding="utf-8")
            except OSError as exc:
                raise UserError(f"cannot write {output}: {exc.strerror}") from None
            print(f"wrote {len(prompts)} replies to {output}", file=sys.stderr)

    _run(go())


@app.command()
def compare(
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="The user message.")] = None,
    setting: Annotated[Optional[list[str]], typer.Option(
        "--setting", help='One column\'s settings, e.g. "temperature=1.0,top_p=0.9" (repeat, up to 6).')] = None,
    prompt_file: Annotated[Optional[Path], typer.Option("--prompt-file")] = None,
    system: Annotated[Optional[str], typer.Option(help="System prompt.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines tagged by column.")] = False,
    top_logprobs: TopLogprobs = 5,
    max_tokens: MaxTokens = None,
    ckpt: Ckpt = None, device: Device = None, dtype: Dtype = None, device_map: DeviceMap = None,
    quantize: Quantize = "auto", trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False, backend: BackendName = "local", base_url: BaseUrl = None,
    model: ModelName = None, api_key_env: ApiKeyEnv = None,
) -> None:
    """Answer one prompt with several sampling settings in one batched decode."""

    async def go() -> None:
        text = _read_prompt(prompt, prompt_file)
        specs = setting or []
        if not 1 <= len(specs) <= 6:
            raise UserError("give between 1 and 6 --setting values")
        given = _overrides(None, None, None, None, None, None, max_tokens, None)
        for spec in specs:
            parse_assignments(spec)  # validate before loading
        _check_top(top_logprobs)
        opts = _options(backend, ckpt, device, dtype, device_map, quantize, trust_remote_code,
                        allow_pickle, base_url, model, api_key_env)
        worker = await _load(opts)
        try:
            base = _settings(worker, given)
            rows = tuple(parse_assignments(spec, base) for spec in specs)
            messages = ((Message("system", system),) if system else ()) + (Message("user", text),)
            req = GenerationRequest(messages, rows, top_logprobs)
            done = await _stream(worker, req, as_json=as_json, show_logprobs=False, tag_rows=True)
        finally:
            await worker.aclose()
        if not as_json:
            _print_compare_table(rows, done, base)

    _run(go())


def _print_compare_table(rows: tuple[SamplingParams, ...], done: list[RowDone],
                         base: SamplingParams) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(show_lines=True)
    table.add_column("#")
    table.add_column("settings")
    table.add_column("reply")
    table.add_column("stats")
    for d in done:
        s = rows[d.row]
        label = s.describe(against=base) + (" (deterministic)" if s.greedy else "")
        stats = (f"{d.usage.completion_tokens} tokens\n{d.usage.decode_tokens_per_s:.1f} tok/s\n"
                 f"{d.finish_reason}")
        table.add_row(str(d.row + 1), Text(label), Text(d.text), Text(stats))
    Console().print(table)


@app.command()
def bench(
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length.")] = 128,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Tokens to decode.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch", help="Rows decoded together.")] = 1,
    top_logprobs: TopLogprobs = 5,
    repeats: Annotated[int, typer.Option(help="Runs; the best is reported.")] = 1,
    vs_hf: Annotated[bool, typer.Option("--vs-hf", help="Also time transformers' generate on the "
                                                        "same model and prompt.")] = False,
    compare_mode: Annotated[bool, typer.Option(
        "--compare", help="Compare mode: aggregate tokens/s of N = 1, 2, 4 settings decoded as "
                          "one batch against N sequential runs.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    runner: Annotated[str, typer.Option(
        "--runner", help="auto (the fast runner where the model supports it), fast, or hf "
                         "(transformers' modules, for comparison).")] = "auto",
    compile_step: CompileStep = "auto",
    ckpt: Ckpt = None, device: Device = None, dtype: Dtype = None, device_map: DeviceMap = None,
    quantize: Quantize = "auto", trust_remote_code: TrustRemote = False,
    allow_pickle: AllowPickle = False,
) -> None:
    """Measure decode and prefill speed, time to first token, bandwidth and peak memory."""

    async def go() -> None:
        if prompt_tokens < 8 or new_tokens < 2 or not 1 <= batch_size <= 64:
            raise UserError("--prompt-tokens must be >= 8, --new-tokens >= 2, --batch 1-64")
        _check_top(top_logprobs)
        if runner not in ("auto", "fast", "hf"):
            raise UserError(f"unknown runner {runner!r}; choose auto, fast or hf")
        if compile_step not in ("auto", "on", "off"):
            raise UserError(f"unknown compile mode {compile_step!r}; choose auto, on or off")
        opts = _options("local", ckpt, device, dtype, device_map, quantize, trust_remote_code,
                        allow_pickle, None, None, None)
        from dataclasses import replace

        opts = replace(opts, runner=runner, compile=compile_step)
        worker = await _load(opts, quiet=as_json)
        if compare_mode:
            await _bench_compare(worker, prompt_tokens, new_tokens, top_logprobs, repeats,
                                 as_json)
            return
        from inference.bench import run_bench

        try:
            result = await worker.call(lambda b: run_bench(
                b, prompt_tokens=prompt_tokens, new_tokens=new_tokens, batch=batch_size,
                top_logprobs=top_logprobs, vs_hf=vs_hf, repeats=repeats))
        finally:
            await worker.aclose()
        d = result.to_dict()  # type: ignore[attr-defined]
        if as_json:
            print(json.dumps(d))
            return
        print(f"model {d['model']} on {d['device']} ({d['dtype']}, quantization "
              f"{d['quantization']}, {d['threads']} threads), batch {d['batch']}, "
              f"top-{d['top_logprobs']} logprobs")
        if d.get("runner"):
            print(f"  picked: {d['runner']}")
        print(f"  prompt {d['prompt_tokens']} tokens: time to first token {d['ttft_s'] * 1000:.0f} ms, "
              f"prefill {d['prefill_tokens_per_s']:.0f} tokens/s")
        print(f"  decode {d['new_tokens']} tokens: {d['decode_tokens_per_s']:.1f} tokens/s per row, "
              f"{d['aggregate_tokens_per_s']:.1f} aggregate")
        print(f"  weights {d['weight_bytes'] / 1e6:.0f} MB -> {d['bandwidth_gb_s']:.2f} GB/s achieved")
        print(f"  peak memory {d['peak_memory_mb']:.0f} MB")
        if d["hf_decode_tokens_per_s"]:
            print(f"  transformers generate: {d['hf_decode_tokens_per_s']:.1f} tokens/s -> "
                  f"chatui is {d['speedup_vs_hf']:.2f}x")

    _run(go())


async def _bench_compare(worker: InferenceWorker, prompt_tokens: int, new_tokens: int,
                         top_logprobs: int, repeats: int, as_json: bool) -> None:
    """``bench --compare``: N settings in one batch against N sequential runs."""
    from functools import partial

    from inference.bench import run_compare_bench

    try:
        result: Any = await worker.call(partial(
            run_compare_bench, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
            top_logprobs=top_logprobs, repeats=repeats))
    finally:
        await worker.aclose()
    d = result.to_dict()
    if as_json:
        print(json.dumps(d))
        return
    print(f"model {d['model']} on {d['device']} ({d['dtype']}, quantization "
          f"{d['quantization']}, {d['threads']} threads), prompt {d['prompt_tokens']} tokens, "
          f"{d['new_tokens']} new tokens per setting, top-{d['top_logprobs']} logprobs")
    print("  N  batched: s  tok/s (decode)   sequential: s  tok/s (decode)   speedup")
    for r in d["rows"]:
        print(f"  {r['n']}  {r['batched_s']:10.2f}  {r['batched_tokens_per_s']:6.1f} "
              f"({r['batched_decode_tokens_per_s']:6.1f})   {r['sequential_s']:13.2f}  "
              f"{r['sequential_tokens_per_s']:6.1f} ({r['sequential_decode_tokens_per_s']:6.1f})"
              f"   {r['speedup']:.2f}x")


@app.command()
def export(
    transcript: Annotated[Path, typer.Argument(help="A saved transcript (.json).")],
    fmt: Annotated[str, typer.Option("--format", help="md or messages.")] = "md",
    output: Annotated[Optional[Path], typer.Option(help="Output file (default: stdout).")] = None,
) -> None:
    """Export a transcript as Markdown or as plain role/content messages JSON."""
    from .transcript import TranscriptError, export_markdown, export_messages, load_transcript

    if fmt not in ("md", "messages"):
        print(f"chatui: unknown format {fmt!r}; choose md or messages", file=sys.stderr)
        raise typer.Exit(2)
    try:
        conv = load_transcript(transcript)
    except TranscriptError as exc:
        print(f"chatui: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    if fmt == "md":
        text = export_markdown(conv)
    else:
        text = json.dumps(export_messages(conv), ensure_ascii=False, indent=2) + "\n"
    if output is None:
        sys.stdout.write(text)
        return
    from .transcript import export_to_file

    try:
        export_to_file(conv, fmt, output)
    except (TranscriptError, OSError) as exc:
        print(f"chatui: {exc}", file=sys.stderr)
        raise typer.Exit(2) from None
    print(f"wrote {output}", file=sys.stderr)


def main() -> None:
    """Console-script entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
