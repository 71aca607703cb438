"""Running the engine without the UI: load a worker with a progress line, stream a request to
stdout, and turn every user mistake into one sentence and exit code 2."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from typing import Any, Coroutine

from inference.settings import SamplingParams, SettingsError
from inference.types import (Failed, GenerationRequest, Progress, PromptProgress, RowDone,
                             Scored, ScoreRequest, Started, TokenBatch, finish_words)
from inference.worker import InferenceWorker

from ..backends import BackendOptions, make_factory
from .options import UserError, fail
from .output import (ChannelPrinter, done_json, print_logprob_token, print_score, progress_line,
                     score_json, token_json)


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a command's coroutine; a :class:`UserError` or ``SettingsError`` becomes one
    sentence on stderr and exit code 2."""
    try:
        return asyncio.run(coro)
    except (UserError, SettingsError) as exc:
        fail(exc)


def check_local_spec(opts: BackendOptions) -> None:
    """Refuse a ``--ckpt``, ``--device`` or ``--dtype`` that cannot load, without loading
    anything (``inference.checkpoint.check_spec``). The chat opens its window before the
    model loads, so it must refuse these first; the headless commands run the same check
    before they load.

    The UI process stays free of torch (importing it costs about 1.3 s and 180 MB of RSS here,
    kept for the app's lifetime; the model itself loads in the engine's process): the check
    needs it only for a GPU ``--device``.
    """
    if opts.backend != "local":
        return
    if opts.ckpt is not None and not opts.ckpt.strip():
        raise UserError("--ckpt is empty; give a checkpoint path or leave the flag out for the "
                        "default model")
    if opts.ckpt is None and opts.device is None and opts.dtype is None:
        return
    from inference.checkpoint import CheckpointError, check_spec

    try:
        check_spec(opts.ckpt, opts.device, opts.dtype)
    except CheckpointError as exc:
        raise UserError(str(exc)) from None


async def load(opts: BackendOptions, *, quiet: bool = False) -> InferenceWorker:
    """A worker with the model loaded (progress on a terminal's stderr)."""
    check_local_spec(opts)
    try:
        factory = make_factory(opts)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    # headless: no UI to keep away from, and the process is the engine's
    worker = InferenceWorker(factory, isolate=False, settle_heap=True)
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
                progress_line(ev)
    if shown:
        print("\r" + " " * 60 + "\r", end="", file=sys.stderr, flush=True)
    info = worker.info
    if info is not None and info.chat_template_warning:
        print(f"warning: {info.chat_template_warning}", file=sys.stderr)
    return worker


def settings(worker: InferenceWorker, given: dict[str, Any]) -> SamplingParams:
    """The model's default settings with the flags the user gave on top."""
    base = worker.info.default_settings if worker.info else SamplingParams()
    return base.with_values(**given)


async def stream(worker: InferenceWorker, request: GenerationRequest, *, as_json: bool,
                 show_logprobs: bool, tag_columns: bool,
                 hide_reasoning: bool = False) -> list[RowDone]:
    """Stream a request to stdout; Ctrl+C stops it (the partial reply is kept). A reasoning
    model's reasoning prints under its own header (:class:`ChannelPrinter`), or not at all
    with ``hide_reasoning``."""
    plain = ChannelPrinter(hide=hide_reasoning, tty=sys.stdout.isatty())
    events = worker.generate(request)
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGINT, events.cancel)
    except (NotImplementedError, RuntimeError):
        pass
    started: Started | None = None
    done: list[RowDone] = []
    failed: Failed | None = None
    erase = False  # a prompt-progress line is on stderr
    try:
        async for group in events:
            for ev in group:
                if erase and not isinstance(ev, PromptProgress):
                    print("\r" + " " * 72 + "\r", end="", file=sys.stderr, flush=True)
                    erase = False
                if isinstance(ev, Started):
                    started = ev
                    if ev.dropped_messages:
                        print(f"note: the {ev.dropped_messages} oldest messages were left out to "
                              f"fit the context of {ev.context_limit} tokens", file=sys.stderr)
                elif isinstance(ev, TokenBatch):
                    for t in ev.tokens:
                        if hide_reasoning and t.channel == "reasoning" and (as_json
                                                                          or show_logprobs):
                            continue
                        if as_json:
                            print(json.dumps(token_json(t, ev.row if tag_columns else None),
                                             ensure_ascii=False))
                        elif show_logprobs:
                            print_logprob_token(t)
                        elif not tag_columns:
                            print(plain.text(t), end="", flush=True)
                elif isinstance(ev, RowDone):
                    done.append(ev)
                    if as_json:
                        print(json.dumps(done_json(ev, started, ev.row if tag_columns else None)))
                elif isinstance(ev, Failed):
                    failed = ev
                elif isinstance(ev, PromptProgress) and sys.stderr.isatty():
                    print(f"\r{ev.describe()}   ", end="", file=sys.stderr, flush=True)
                    erase = True
    finally:
        try:
            loop.remove_signal_handler(signal.SIGINT)
        except (NotImplementedError, RuntimeError):
            pass
    if not as_json and not show_logprobs and not tag_columns:
        print(plain.end())
        if done and done[0].finish_reason != "stop":
            print(f"[{finish_words(done[0].finish_reason, done[0].usage)}]", file=sys.stderr)
    if failed is not None:
        raise UserError(failed.message)
    return sorted(done, key=lambda d: d.row)


async def score_text(worker: InferenceWorker, request: ScoreRequest, *, as_json: bool) -> Scored:
    """Score a text and print it: a table (or JSON lines) and the perplexity."""
    scored: Scored | None = None
    erase = False
    async for group in worker.score(request):
        for ev in group:
            if isinstance(ev, PromptProgress) and sys.stderr.isatty():
                print(f"\r{ev.describe()}   ", end="", file=sys.stderr, flush=True)
                erase = True
                continue
            if erase:
                print("\r" + " " * 72 + "\r", end="", file=sys.stderr, flush=True)
                erase = False
            if isinstance(ev, Failed):
                raise UserError(ev.message)
            if isinstance(ev, Scored):
                scored = ev
    if scored is None:
        raise UserError("scoring was cancelled")
    if as_json:
        for line in score_json(scored):
            print(json.dumps(line, ensure_ascii=False))
    else:
        print_score(scored)
    return scored
