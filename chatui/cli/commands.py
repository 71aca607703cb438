"""The ``chatui`` commands: the chat TUI (no command), and headless generate / batch / compare /
bench / export. Their shared flags live in :mod:`chatui.cli.options`, defined once."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import typer

from inference.settings import parse_assignments
from inference.types import (Failed, GenerationRequest, Message, RowDone, ScoreRequest, Token,
                             TokenBatch)
from inference.worker import InferenceWorker

from .. import __version__, tty_flow
from ..backends import make_factory
from ..textfile import TextFileError, read_text_file
from .headless import check_local_spec, load, run, settings, stream
from .options import (ModelOptions, PromptOptions, SamplingOptions, ServerOptions, SystemPrompt,
                      TopLogprobs, UserError, backend_options, check_top_logprobs, fail,
                      with_options)
from .output import done_json, print_bench, print_bench_compare, print_compare_table, token_json
from .terminal import no_terminal, piped_input

app = typer.Typer(add_completion=False, rich_markup_mode=None,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="A terminal chat app for local LLM checkpoints, with live per-token "
                       "logprobs. With no command, opens the chat; the chat's options go before "
                       "a command's name only when there is no command.")


# ---- the chat (no command) ----


def theme_names() -> list[str]:
    """The themes the app can show: chatui's own and Textual's built-in ones."""
    from textual.theme import BUILTIN_THEMES

    from themes import THEMES

    return sorted({t.name for t in THEMES} | set(BUILTIN_THEMES))


@app.callback(invoke_without_command=True)
@with_options
def main_command(
    ctx: typer.Context,
    checkpoint: ModelOptions, server: ServerOptions, sampling: SamplingOptions,
    theme: Annotated[Optional[str], typer.Option(
        "--theme", help="Colour theme (remembered); chatui-dark, chatui-light or one of "
                        "Textual's.")] = None,
    load_path: Annotated[Optional[Path], typer.Option(
        "--load", help="Resume a saved transcript: its file, or its number in chatui "
                       "history (1: the newest).")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="Reopen the conversation saved last (as --load with its file).")] = False,
    system: Annotated[Optional[str], typer.Option(
        "--system", help="System prompt for a new conversation (not with --load: a saved "
                         "conversation keeps its own).")] = None,
    top_logprobs: TopLogprobs = None,
    raw_mode: Annotated[bool, typer.Option(
        "--raw", help="Open raw mode: a notebook whose text the model continues as plain text "
                      "(no chat template), for base models.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    """Open the chat (the default command)."""
    if version:
        print(f"chatui {__version__}")
        raise typer.Exit()
    if ctx.invoked_subcommand is not None:
        given = _given_flags(ctx)
        if given:
            fail(f"{', '.join(given)} before the command name would be ignored; put options "
                 f"after it (chatui {ctx.invoked_subcommand} {given[0]} ...)")
        return
    try:
        opts = backend_options(checkpoint, server)
        alternatives = check_top_logprobs(top_logprobs, 5)
        check_local_spec(opts)
        if theme is not None and theme not in theme_names():
            raise UserError(f"unknown theme {theme!r}; choose one of: "
                            f"{', '.join(theme_names())}")
        if resume:
            load_path = _resume_path(load_path)
        elif load_path is not None:
            load_path = _listed_path(load_path)
        if load_path is not None:
            if system is not None:
                raise UserError("--system applies to a new conversation; a conversation opened "
                                "with --load keeps its own system prompt (/system changes it)")
            _check_transcript(load_path)
        if raw_mode and system is not None:
            raise UserError("--raw opens a notebook of plain text, which has no system prompt; "
                            "leave out --system")
        piped = piped_input()
        if piped:  # echo TEXT | chatui: answered as chatui generate answers it
            given = [flag for flag, used in (("--resume", resume),
                                             ("--load", load_path is not None),
                                             ("--theme", theme is not None),
                                             ("--top-logprobs", top_logprobs is not None))
                     if used]
            if given:
                raise UserError(f"{given[0]} is for the chat's window, and text piped in is "
                                "answered without one; leave it out")
        elif (problem := no_terminal()) is not None:
            raise UserError(f"the chat opens in a terminal, and {problem}; chatui generate "
                            '"TEXT" prints one reply (or pipe the prompt in: echo TEXT | '
                            "chatui)")
        factory = make_factory(opts)
    except (UserError, ValueError) as exc:
        fail(exc)
    if piped:
        answer(PromptOptions(prompt_file=Path("-"), system=system), sampling, checkpoint,
               server, raw=raw_mode)
        return
    from ..app import run_chat
    from ..config import AppConfig

    config = AppConfig(theme=theme, load_path=load_path, system_prompt=system or "",
                       settings_overrides=sampling.overrides(), top_logprobs=alternatives,
                       raw_mode=raw_mode)
    raise typer.Exit(run_chat(factory, config))


def _given_flags(ctx: typer.Context) -> list[str]:
    """The flags typed on the command line (not left at their defaults)."""
    given = []
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name) if param.name else None
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            given.append(max(param.opts, key=len))
    return given


def _resume_path(load_path: Path | None) -> Path:
    """``--resume``: the conversation saved last, or a sentence why there is none."""
    from ..transcript.history import data_dir, newest_transcript

    if load_path is not None:
        raise UserError("--resume opens the conversation saved last and --load the one "
                        "named; give one of them")
    path = newest_transcript()
    if path is None:
        raise UserError(f"there is no saved conversation to resume in {data_dir()}; plain "
                        "chatui starts one")
    return path


def _listed_path(load_path: Path) -> Path:
    """``--load N``: the N-th conversation as ``/history`` and ``chatui history list`` number
    them (newest first), where N is a number and no file of that name is here; any other
    value is the transcript's path. (Seen in tmux: ``chatui --load 1`` after ``/history``
    said only "no such transcript: 1".)"""
    from ..transcript import list_transcripts
    from ..transcript.history import data_dir

    text = str(load_path)
    if not text.isdigit() or load_path.exists():
        return load_path
    listed = list_transcripts()
    n = int(text)
    if not 1 <= n <= len(listed):
        raise UserError(f"there is no conversation {n} in the history ({len(listed)} saved in "
                        f"{data_dir()}; chatui history lists them), and no file named {text}")
    return Path(listed[n - 1].path)


def _check_transcript(path: Path) -> None:
    """Refuse a transcript that does not load, before the window opens."""
    from ..transcript import TranscriptError, load_transcript

    if not path.exists():
        raise UserError(f"no such transcript: {path}")
    try:
        load_transcript(path)
    except TranscriptError as exc:
        raise UserError(str(exc)) from None


# ---- headless commands ----


@app.command()
@with_options
def generate(
    message: PromptOptions, sampling: SamplingOptions, checkpoint: ModelOptions, server: ServerOptions,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    show_logprobs: Annotated[bool, typer.Option(
        "--show-logprobs", help="Print each token with its logprob.")] = False,
    top_logprobs: TopLogprobs = None,
    fork_at: Annotated[Optional[int], typer.Option(
        "--fork-at", help="Then branch at this token of the reply (0-based): its most likely "
                          "alternatives decoded as branches in one batch.")] = None,
    fork_k: Annotated[Optional[int], typer.Option(
        "--fork-k", help="How many branches --fork-at decodes (2-8, default 3).")] = None,
    raw: Annotated[bool, typer.Option(
        "--raw", help="Raw completion: continue the prompt as plain text (no chat template; "
                      "BOS as the tokenizer adds it), for base models.")] = False,
    hide_reasoning: Annotated[bool, typer.Option(
        "--hide-reasoning", help="Leave a reasoning model's reasoning out of the output.")
    ] = False,
    think: Annotated[Optional[str], typer.Option(
        "--think", help="on or off: the chat template's reasoning switch (enable_thinking); "
                        "default: the template's.")] = None,
) -> None:
    """Stream one reply to a prompt (with --raw, a continuation of it)."""
    answer(message, sampling, checkpoint, server, as_json=as_json, show_logprobs=show_logprobs,
           top_logprobs=top_logprobs, fork_at=fork_at, fork_k=fork_k, raw=raw,
           hide_reasoning=hide_reasoning, think=think)


def answer(message: PromptOptions, sampling: SamplingOptions, checkpoint: ModelOptions,
           server: ServerOptions, *, as_json: bool = False, show_logprobs: bool = False,
           top_logprobs: int | None = None, fork_at: int | None = None,
           fork_k: int | None = None, raw: bool = False, hide_reasoning: bool = False,
           think: str | None = None) -> None:
    """``chatui generate``'s work (also the chat's, given text through a pipe)."""
    from .fork import check_fork, fan_out

    async def go() -> None:
        if as_json and show_logprobs:
            raise UserError("give --json or --show-logprobs, not both (--json lines carry the "
                            "logprobs)")
        alternatives = check_top_logprobs(
            top_logprobs, 5, unused=None if as_json or show_logprobs or fork_at is not None
            else "--top-logprobs shows only with --json or --show-logprobs; add one of them")
        fork = check_fork(fork_at, fork_k, alternatives)
        if raw and message.system:
            raise UserError("--raw continues a plain text, which has no system prompt; leave "
                            "out --system (or put its text in the prompt)")
        if fork is not None and show_logprobs:
            raise UserError("--fork-at prints text or --json lines; leave out --show-logprobs")
        if think is not None and think.strip().lower() not in ("on", "off"):
            raise UserError(f"--think takes on or off, not {think!r}")
        thinking = None if think is None else think.strip().lower() == "on"
        opts = backend_options(checkpoint, server)
        text = message.text()
        worker = await load(opts)
        try:
            system = (Message("system", message.system),) if message.system else ()
            req = GenerationRequest(system + (Message("user", text),),
                                    (settings(worker, sampling.overrides()),), alternatives,
                                    raw=raw, thinking=thinking)
            info = worker.info
            if thinking is not None and info is not None and not info.thinking_switch:
                print("note: this model's chat template has no reasoning switch "
                      "(enable_thinking), so --think changes nothing", file=sys.stderr)
            if fork is not None:
                await fan_out(worker, req, *fork, as_json=as_json)
                return
            await stream(worker, req, as_json=as_json, show_logprobs=show_logprobs,
                         tag_columns=False, hide_reasoning=hide_reasoning)
        finally:
            await worker.aclose()

    run(go())


@app.command()
@with_options
def score(
    checkpoint: ModelOptions, server: ServerOptions,
    text_file: Annotated[Optional[Path], typer.Argument(
        metavar="[FILE]", help="A UTF-8 file whose text to score.", show_default=False)] = None,
    prompt: Annotated[Optional[str], typer.Option(
        "-p", "--prompt", help="The text to score (instead of FILE).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="One JSON object per token, then one with the perplexity.")] = False,
    top_logprobs: TopLogprobs = None,
) -> None:
    """Score a text under the model: each token's logprob, rank, entropy and alternatives,
    and the text's perplexity, from one prefill (no chat template; BOS as the tokenizer adds
    it)."""
    from .headless import score_text

    async def go() -> None:
        if (text_file is None) == (prompt is None):
            raise UserError("give the text to score as FILE or with -p TEXT (one of them)")
        if prompt is not None and not prompt.strip():
            raise UserError("the text given with -p is empty; give some text")
        alternatives = check_top_logprobs(top_logprobs, 5)
        opts = backend_options(checkpoint, server)
        if prompt is not None:
            text = prompt
        else:
            assert text_file is not None
            try:
                text = read_text_file(text_file, "the text file")
            except TextFileError as exc:
                raise UserError(str(exc)) from None
            if not text.strip():
                raise UserError(f"the text file {text_file} is empty")
        worker = await load(opts, quiet=as_json)
        try:
            await score_text(worker, ScoreRequest(text, alternatives), as_json=as_json)
        finally:
            await worker.aclose()

    run(go())


BATCH_ROWS = 32
"""``chatui batch``'s lines decoded together by default. A whole file was one batch: 1,000
lines of the default model with 512 new tokens a row would have held ~18 GB of KV cache; on
two cores 8 rows already keep the int8 kernel's arithmetic busy (issue 18)."""


@app.command()
@with_options
def batch(
    input_file: Annotated[Path, typer.Option(
        "--input-file", help="One prompt per line (UTF-8); blank lines are skipped but "
                             "counted, so a reply's index is its line's.")],
    sampling: SamplingOptions, checkpoint: ModelOptions, server: ServerOptions,
    output: Annotated[Optional[Path], typer.Option(
        "--output", help="Write JSON lines here (default: stdout).")] = None,
    system: SystemPrompt = None,
    top_logprobs: TopLogprobs = None,
    raw: Annotated[bool, typer.Option(
        "--raw", help="Raw completion: continue each line as plain text (no chat template; "
                      "BOS as the tokenizer adds it), for base models.")] = False,
    rows: Annotated[int, typer.Option(
        "--batch", help="Lines decoded together (1-256); the file is answered this many "
                        "lines at a time, each group's replies written as it ends.")] = BATCH_ROWS,
) -> None:
    """Answer every line of a file in batches; JSON lines in input order, each with its
    line's 0-based index and 1-based line number."""

    async def go() -> None:
        alternatives = check_top_logprobs(top_logprobs, 0)
        if raw and system:
            raise UserError("--raw continues plain texts, which have no system prompt; leave "
                            "out --system")
        if not 1 <= rows <= 256:
            raise UserError("--batch takes 1 to 256 lines at a time")
        opts = backend_options(checkpoint, server)
        try:
            lines = read_text_file(input_file, "the input file").splitlines()
        except TextFileError as exc:
            raise UserError(str(exc)) from None
        prompts = [(i, ln) for i, ln in enumerate(lines) if ln.strip()]
        if not prompts:
            raise UserError(f"{input_file} has no prompts (one per line)")
        if output is not None:
            _check_output_file(output, input_file)
        worker = await load(opts)
        failed: list[str] = []
        written, given = 0, sampling.overrides()
        try:
            with _json_lines_sink(output) as sink:
                for first in range(0, len(prompts), rows):
                    group = prompts[first:first + rows]
                    try:
                        replies = await _answer_all(worker, [p for _, p in group], system,
                                                    given, alternatives, raw=raw)
                    except UserError as exc:
                        if written and output is not None:
                            raise UserError(f"{exc} (the replies to the first {written} "
                                            f"lines are in {output})") from None
                        raise
                    sink([_batch_record(index, text, done, tokens, alternatives, failed)
                          for (index, text), (done, tokens) in zip(group, replies)])
                    written += len(group)
        finally:
            await worker.aclose()
        if output is not None:
            print(f"wrote {len(prompts) - len(failed)} replies to {output}"
                  + (f"; {len(failed)} line{'s' * (len(failed) > 1)} failed" if failed else ""),
                  file=sys.stderr)
        if failed:  # (written first: the answered lines are kept)
            print("\n".join(failed), file=sys.stderr)
            raise typer.Exit(1)

    run(go())


@contextlib.contextmanager
def _json_lines_sink(output: Path | None) -> Iterator[Callable[[list[str]], None]]:
    """A writer of groups of JSON lines to ``output`` (stdout when None), each group flushed
    as it comes, so that what was answered is kept if a later group fails."""
    if output is None:
        def to_stdout(lines: list[str]) -> None:
            sys.stdout.write("".join(line + "\n" for line in lines))
            sys.stdout.flush()
        yield to_stdout
        return
    try:
        f = output.open("w", encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror}") from None
    with f:
        def to_file(lines: list[str]) -> None:
            try:
                f.write("".join(line + "\n" for line in lines))
                f.flush()
            except OSError as exc:
                raise UserError(f"cannot write {output}: {exc.strerror}") from None
        yield to_file


def _batch_record(index: int, text: str, done: RowDone, tokens: list[Token],
                  alternatives: int, failed: list[str]) -> str:
    """One line's JSON record of ``chatui batch`` (a failed line's sentence added to
    ``failed``)."""
    rec = {"index": index, "line": index + 1, "prompt": text, "text": done.text,
           **done_json(done, None)}
    rec.pop("type")
    if done.error:  # (this line alone: the others are answered)
        rec["error"] = done.error
        failed.append(f"line {index + 1}: {done.error}")
    reasoning = "".join(t.text for t in tokens if t.channel == "reasoning" and not t.special)
    if reasoning:  # a reasoning model's: "text" is its answer
        rec["reasoning"] = reasoning
    if alternatives:
        rec["tokens"] = [token_json(t) for t in tokens]
    return json.dumps(rec, ensure_ascii=False)


def _check_output_file(output: Path, source: Path) -> None:
    """Refuse an output the command could not write, or one that is its own input, before
    any work that would then be lost."""
    if output.is_dir():
        raise UserError(f"--output {output} is a folder; give a file name")
    if not output.parent.is_dir():
        raise UserError(f"cannot write {output}: the folder {output.parent} does not exist")
    if output.exists() and output.resolve() == source.resolve():
        raise UserError(f"--output {output} is the input file itself; writing it would "
                        "destroy the input")


async def _answer_all(worker: InferenceWorker, prompts: list[str], system: str | None,
                      given: dict[str, Any], top_logprobs: int, *, raw: bool = False
                      ) -> list[tuple[RowDone, list[Token]]]:
    """Every prompt answered in one batch (continued as plain text with ``raw``); (done,
    tokens) in input order."""
    s = settings(worker, given)
    sys_msg = (Message("system", system),) if system else ()
    reqs = [GenerationRequest(sys_msg + (Message("user", p),), (s,), top_logprobs, raw=raw)
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
    return [(done[i], tokens[i]) for i in range(len(prompts))]


@app.command()
@with_options
def compare(
    message: PromptOptions, sampling: SamplingOptions, checkpoint: ModelOptions, server: ServerOptions,
    setting: Annotated[Optional[list[str]], typer.Option(
        "--setting", help='One column\'s settings on top of the sampling flags, e.g. '
                          '"temperature=1.0,top_p=0.9" (repeat, up to 6).')] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines tagged by column.")] = False,
    top_logprobs: TopLogprobs = None,
) -> None:
    """Answer one prompt with several sampling settings in one batched decode."""

    async def go() -> None:
        specs = setting or []
        if not 1 <= len(specs) <= 6:
            raise UserError("give between 1 and 6 --setting values")
        for spec in specs:
            parse_assignments(spec)  # validate before loading
        alternatives = check_top_logprobs(
            top_logprobs, 5, unused=None if as_json else
            "--top-logprobs shows only with --json (the table has no alternatives); add --json")
        opts = backend_options(checkpoint, server)
        text = message.text()
        worker = await load(opts)
        try:
            base = settings(worker, sampling.overrides())
            rows = tuple(parse_assignments(spec, base) for spec in specs)
            system = (Message("system", message.system),) if message.system else ()
            req = GenerationRequest(system + (Message("user", text),), rows, alternatives)
            done = await stream(worker, req, as_json=as_json, show_logprobs=False,
                                tag_columns=True)
        finally:
            await worker.aclose()
        if not as_json:
            print_compare_table(rows, done, base)

    run(go())


@app.command()
@with_options
def bench(
    checkpoint: ModelOptions, server: ServerOptions,
    prompt_tokens: Annotated[int, typer.Option("--prompt-tokens", help="Prompt length.")] = 128,
    new_tokens: Annotated[int, typer.Option("--new-tokens", help="Tokens to decode.")] = 128,
    batch_size: Annotated[int, typer.Option("--batch", help="Rows decoded together.")] = 1,
    top_logprobs: TopLogprobs = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Runs; the best is reported.")] = 1,
    vs_hf: Annotated[bool, typer.Option("--vs-hf", help="Also time transformers' generate on the "
                                                        "same model and prompt.")] = False,
    compare_mode: Annotated[bool, typer.Option(
        "--compare", help="Compare mode: aggregate tokens/s of N = 1, 2, 4, 8 settings decoded "
                          "as one batch against N sequential runs.")] = False,
    fan_out_mode: Annotated[bool, typer.Option(
        "--fan-out", help="Fan-out (generate --fork-at): aggregate tokens/s of the K = 1, 2, "
                          "4, 8 most likely tokens at one token of a reply, continued as one "
                          "batch against K sequential runs.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Measure decode and prefill speed, time to first token, bandwidth and peak memory of the
    local engine (--backend local only: a server's engine is measured by its own tools)."""

    async def go() -> None:
        if server.backend != "local":
            raise UserError(f"bench measures chatui's own engine, so it runs with --backend "
                            f"local only (got {server.backend}); measure a server with its "
                            "own benchmark")
        if prompt_tokens < 8 or new_tokens < 2 or not 1 <= batch_size <= 64:
            raise UserError("--prompt-tokens must be >= 8, --new-tokens >= 2, --batch 1-64")
        if repeats < 1:
            raise UserError(f"--repeats must be at least 1; got {repeats}")
        if compare_mode and fan_out_mode:
            raise UserError("--compare and --fan-out are two benchmarks; run one at a time")
        if compare_mode and (batch_size != 1 or vs_hf):
            raise UserError("--compare runs its own batches of 1, 2, 4 and 8 settings; leave "
                            "out --batch and --vs-hf")
        if fan_out_mode and (batch_size != 1 or vs_hf):
            raise UserError("--fan-out runs its own batches of 1, 2, 4 and 8 branches; leave "
                            "out --batch and --vs-hf")
        alternatives = check_top_logprobs(top_logprobs, 5)
        opts = backend_options(checkpoint, server)
        worker = await load(opts, quiet=as_json)
        try:
            limit = worker.info.context_limit if worker.info else 0
            if limit and prompt_tokens + new_tokens > limit:
                raise UserError(
                    f"--prompt-tokens {prompt_tokens} plus --new-tokens {new_tokens} exceed the "
                    f"model's context of {limit} tokens; use at most "
                    f"{max(limit - new_tokens, 0)} prompt tokens")
            mode = "compare" if compare_mode else "fan-out" if fan_out_mode else "decode"
            result = await _bench_call(worker, mode, prompt_tokens=prompt_tokens,
                                       new_tokens=new_tokens, batch=batch_size,
                                       top_logprobs=alternatives, vs_hf=vs_hf, repeats=repeats)
        finally:
            await worker.aclose()
        d = result.to_dict()
        if as_json:
            print(json.dumps(d))
        elif compare_mode or fan_out_mode:
            print_bench_compare(d)
        else:
            print_bench(d)

    run(go())


async def _bench_call(worker: InferenceWorker, mode: str, *, prompt_tokens: int,
                      new_tokens: int, batch: int, top_logprobs: int, vs_hf: bool,
                      repeats: int) -> Any:
    """Run the benchmark where the backend lives; an error that inference.bench raises for
    the user (a class named ``...Error`` defined there) becomes one sentence."""
    from functools import partial

    from inference import bench as bench_module

    if mode in ("compare", "fan-out"):
        run_rows = (bench_module.run_compare_bench if mode == "compare"
                    else bench_module.run_fan_out_bench)
        fn = partial(run_rows, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                     top_logprobs=top_logprobs, repeats=repeats)
    else:
        fn = partial(bench_module.run_bench, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                     batch=batch, top_logprobs=top_logprobs, vs_hf=vs_hf, repeats=repeats)
    try:
        return await worker.call(fn)
    except Exception as exc:
        kind = type(exc)
        if kind.__module__.startswith(bench_module.__name__) and kind.__name__.endswith("Error"):
            raise UserError(str(exc)) from None
        raise


@app.command()
def export(
    transcript: Annotated[Path, typer.Argument(
        help="A saved transcript (.json), or its number in `chatui history` (1: the newest).")],
    fmt: Annotated[str, typer.Option("--format", help="md or messages.")] = "md",
    output: Annotated[Optional[Path], typer.Option(
        "--output", help="Output file, or a folder to write it into under the conversation's "
                         "name (default: stdout).")] = None,
    all_branches: Annotated[bool, typer.Option(
        "--all", help="Markdown with every branch of the conversation's tree after the chosen "
                      "path (default: the chosen path only).")] = False,
) -> None:
    """Export a transcript as Markdown or as plain role/content messages JSON."""
    from ..transcript import (TranscriptError, export_markdown, export_messages, export_to_file,
                              load_transcript)

    if fmt not in ("md", "messages"):
        fail(f"unknown format {fmt!r}; choose md or messages")
    if all_branches and fmt != "md":
        fail("--all writes every branch as Markdown only; use --format md")
    try:
        transcript = _listed_path(transcript)  # as `--load N` takes it
        conv = load_transcript(transcript)
    except (TranscriptError, UserError) as exc:
        fail(exc)
    if output is not None and not output.is_dir():
        try:
            _check_output_file(output, transcript)
        except UserError as exc:
            fail(exc)
    if output is None:
        if fmt == "md":
            sys.stdout.write(export_markdown(conv, all_branches=all_branches))
        else:
            sys.stdout.write(json.dumps(export_messages(conv), ensure_ascii=False, indent=2) + "\n")
        return
    try:
        written = export_to_file(conv, fmt, output, all_branches=all_branches)
    except (TranscriptError, OSError) as exc:
        fail(exc)
    print(f"wrote {written}", file=sys.stderr)


history_app = typer.Typer(help="List (the default) and search the saved conversations.",
                          add_completion=False, rich_markup_mode=None,
                          context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(history_app, name="history")
_HistoryDir = Annotated[Optional[Path], typer.Option(
    "--dir", help="The transcripts' folder (default: where the chat autosaves).")]


@history_app.callback(invoke_without_command=True)
def history_default(ctx: typer.Context, directory: _HistoryDir = None,
                    as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Plain ``chatui history [--dir D] [--json]`` lists them (it printed its help)."""
    if ctx.invoked_subcommand is None:
        history_list(directory, as_json)
    elif directory is not None or as_json:
        fail(f"put --dir and --json after the command: chatui history "
             f"{ctx.invoked_subcommand} --dir D")


@history_app.command("search")
def history_search(
    words: Annotated[list[str], typer.Argument(
        help="Words that must all appear (each as a prefix); quoting them is not needed.")],
    directory: _HistoryDir = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per match.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many.")] = 30,
) -> None:
    """Full-text search over every saved conversation (titles, messages, every reply)."""
    from ..transcript.search import fts_query, search_transcripts

    text = " ".join(words)

    if not fts_query(text):
        fail("give at least one word to search for")
    if directory is not None and not directory.is_dir():
        fail(f"{directory} is not a folder")
    hits = search_transcripts(text, directory, limit)
    if not hits:
        print(f"no saved conversation holds {text!r}", file=sys.stderr)
    for hit in hits:
        if as_json:
            print(json.dumps({"path": str(hit.path), "id": hit.id, "title": hit.title,
                              "updated": hit.updated, "messages": hit.messages,
                              "where": hit.where, "snippet": hit.snippet}, ensure_ascii=False))
        else:
            print(f"{hit.path}\n  {hit.title or '(untitled)'} — {hit.where}: {hit.snippet}")


@history_app.command("list")
def history_list(directory: _HistoryDir = None,
                 as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The saved conversations, newest first, numbered as /history and --load N number
    them."""
    from ..transcript import list_transcripts

    if directory is not None and not directory.is_dir():
        fail(f"{directory} is not a folder")
    listed = list_transcripts(directory)
    if not listed:  # (it printed nothing at all: seen in a shell)
        from ..transcript import data_dir

        print(f"no saved conversations in {directory or data_dir()}", file=sys.stderr)
    for n, s in enumerate(listed, 1):
        if as_json:
            print(json.dumps({"path": str(s.path), "id": s.id, "title": s.title,
                              "updated": s.updated, "messages": s.messages, "error": s.error,
                              "parent": s.parent}, ensure_ascii=False))
        else:
            branch = f", a branch of {s.parent}" if s.parent and not s.error else ""
            plural = "" if s.messages == 1 else "s"
            print(f"{n}. {s.path}\n   {s.error or (s.title or '(untitled)')}"
                  f"{'' if s.error else f' — {s.messages} message{plural}{branch}'}")


@app.command("build-kernels")
def build_kernels(
    force: Annotated[bool, typer.Option("--force", help="Rebuild even if built already.")] = False,
) -> None:
    """Build chatui's C kernels ahead of time (otherwise the first model load builds them)."""
    from inference.kernel_build import KernelBuildError, build_all

    try:
        paths = build_all(force=force)
    except KernelBuildError as exc:
        fail(exc)
    for path in paths:
        print(path)


def command_names() -> frozenset[str]:
    """The subcommands' names, as typer gives them (``build_kernels`` -> ``build-kernels``)."""
    return frozenset([c.name or c.callback.__name__.replace("_", "-")  # type: ignore[union-attr]
                      for c in app.registered_commands]
                     + [g.name for g in app.registered_groups if g.name])


def opens_the_chat(args: list[str]) -> bool:
    """Whether a command line opens the chat's window: it names no subcommand (a value that
    happens to spell one, ``--ckpt generate``, counts as one: the chat then only starts as it
    did before ``tty_flow``), and asks for no help or version."""
    names = command_names()
    return not any(a in names or a in ("--help", "--version") for a in args)


def main() -> None:
    """Console-script entry point."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if opens_the_chat(sys.argv[1:]):
        tty_flow.keep_flow_keys()  # Ctrl+Q typed before the window is up must reach it
    app()

