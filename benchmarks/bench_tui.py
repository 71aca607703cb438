"""Benchmark: what the chat UI costs the engine, and how fast it answers a key while streaming.

Two engines, each measured side by side in one run (engine alone and through the app,
alternating, so both see the same machine load; the load average is printed):

- ``scripted`` (default): a model-free engine in the app's own process (a thread), paced like a
  fast local model (``--delay-ms 2`` = 500 tok/s). The UI competes with it for Python's GIL, so
  this is the harsh case. Rate = tokens that reached the reply / wall time.
- ``real`` (``--engine real``): the default model (``chatui.backends.make_factory``) in the
  isolated worker process, as ``chatui`` runs it. Rate = the engine's own decode tokens/s
  (``Usage.decode_tokens_per_s``, what ``chatui bench`` reports), greedy, same prompt.

Both views are measured (``--view tokens|markdown|both``). While a reply streams a key is
pressed every 200 ms and the time until the prompt box shows it is recorded. The app runs
headless, but each screen update is still turned into terminal escape sequences (true colour,
thrown away), the work a terminal would cost. Rounds alternate their order (engine alone
first, then app first...); the overhead is the median over rounds of 1 - app/alone within a
round, with its range. The CPU the UI spends per second of streaming is printed too: its event
loop thread, and the whole UI process (with the thread that reads the engine's events).

    .venv/bin/python benchmarks/bench_tui.py [--engine scripted|real] [--view both]
        [--tokens 2000] [--delay-ms 2] [--rounds 3]

Targets: UI overhead under 5%, keypress latency under 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from chatui.app import ChatApp  # noqa: E402
from chatui.config import AppConfig  # noqa: E402
from inference.scripted import ScriptedBackend  # noqa: E402
from inference.settings import SamplingParams  # noqa: E402
from inference.types import GenerationRequest, Message, RowDone, TokenBatch  # noqa: E402

REAL_PROMPT = ("Write a long, detailed story about a lighthouse keeper, with dialogue, a list of "
               "supplies and a short Python script that counts the waves.")


def reply_text(n: int) -> str:
    """About ``n`` word tokens of Markdown: paragraphs, a list and a long code fence."""
    words = []
    for i in range(n):
        if i % 400 == 100:
            words.append("\n\n```python\n")
        elif i % 400 == 300:
            words.append("\n```\n\n")
        elif i % 40 == 0:
            words.append("\n\n- item")
        elif i % 12 == 0 and 100 < i % 400 < 300:
            words.append("\n    x")  # code lines
        else:
            words.append(f" w{i}")
    return "".join(words)


def load() -> str:
    return "load {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def emulate_terminal(app: ChatApp) -> None:
    """Headless Textual skips turning each screen update into escape sequences; a terminal
    does not. Do that work here too (into a true-colour console, thrown away)."""
    from rich.console import Console

    from chatui.textual_compat.testing import watch_updates

    console = Console(file=io.StringIO(), force_terminal=True, color_system="truecolor",
                      width=120, height=40)
    watch_updates(app, lambda update: update.render_segments(console))


class CpuMeter:
    """CPU seconds of the UI's event loop thread and of its whole process, and wall seconds."""

    def __init__(self) -> None:
        self.thread, self.process = time.thread_time(), time.process_time()
        self.wall = time.perf_counter()

    def read(self) -> tuple[float, float, float]:
        return (time.thread_time() - self.thread, time.process_time() - self.process,
                max(1e-9, time.perf_counter() - self.wall))


# ---- scripted engine, in-process ----


def scripted_alone(text: str, delay: float, n: int) -> float:
    backend = ScriptedBackend(lambda r, row: text, delay_s=delay)
    req = GenerationRequest((Message("user", "go"),), (SamplingParams(max_new_tokens=n * 2),))
    count = 0
    first = None
    for ev in backend.generate(req, threading.Event()):
        if isinstance(ev, TokenBatch):
            count += len(ev.tokens)
            first = first or time.perf_counter()
    return (count - 1) / (time.perf_counter() - first)


async def _press_keys_while(app, chat, latencies: list[float],
                            cpu: list[tuple[float, float, float]]) -> None:
    """Press 'x' every 200 ms while a reply streams; record until the prompt shows it.

    Appends to ``cpu`` the UI's CPU seconds over the stream (:class:`CpuMeter`; an in-process
    engine runs on another thread of the same process)."""
    from textual import events

    from chatui.textual_compat.testing import deliver

    typed = chat.prompt.text
    meter = CpuMeter()
    while chat.generating:
        await asyncio.sleep(0.2)
        if not chat.generating:
            break
        typed += "x"
        t0 = time.perf_counter()
        deliver(app, events.Key("x", "x"))
        while chat.prompt.text != typed and chat.generating:
            await asyncio.sleep(0.0005)
        if chat.prompt.text == typed:
            latencies.append(time.perf_counter() - t0)
    cpu.append(meter.read())
    chat.prompt.text = ""


async def _wait_loaded(pilot, app) -> None:
    while app.chat.info is None:
        if app.chat.load_error:
            raise SystemExit(f"the model did not load: {app.chat.load_error}")
        await pilot.pause(0.05)


async def scripted_app(text: str, delay: float, n: int, token_view: bool,
                       cpu: list[tuple[float, float, float]]) -> tuple[float, list[float]]:
    app = ChatApp(lambda p: ScriptedBackend(lambda r, row: text, delay_s=delay),
                  config=AppConfig(token_view=token_view,
                                   settings=SamplingParams(max_new_tokens=n * 2)))
    emulate_terminal(app)
    latencies: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        await _wait_loaded(pilot, app)
        chat = app.chat
        chat.prompt.text = "go"
        chat.prompt.action_submit()
        while not chat.conversation.entries or chat.conversation.entries[-1].reply is None \
                or not chat.conversation.entries[-1].reply.tokens:
            await asyncio.sleep(0.001)
        reply = chat.conversation.entries[-1].reply
        t_first = time.perf_counter()
        first_count = len(reply.tokens)
        await _press_keys_while(app, chat, latencies, cpu)
        t_end = time.perf_counter()
        count = len(reply.tokens)
        await pilot.pause(0.3)
        view = chat.query("ReplyView").last()
        assert view.markdown.source == reply.text, "the screen lost text"
    return (count - first_count) / (t_end - t_first), latencies


def run_scripted(args, views: list[str]) -> None:
    text = reply_text(args.tokens)
    delay = args.delay_ms / 1000
    print(f"engine: scripted, in-process, {args.tokens} tokens, {args.delay_ms} ms/token; "
          f"{args.rounds} round(s), alternating; {load()}")
    for view in views:
        alone, through, lat, cpu = [], [], [], []
        for r in range(args.rounds):
            for step in (("alone", "app") if r % 2 == 0 else ("app", "alone")):
                if step == "alone":
                    alone.append(scripted_alone(text, delay, args.tokens))
                else:
                    rate, keys = asyncio.run(scripted_app(text, delay, args.tokens,
                                                          view == "tokens", cpu))
                    through.append(rate)
                    lat += keys
        report(view, alone, through, lat, cpu)
    print(load())


# ---- the real default model, isolated worker ----


def _real_settings(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n)


async def real_alone(worker, n: int) -> tuple[float, int]:
    request = GenerationRequest((Message("user", REAL_PROMPT),), (_real_settings(n),),
                                top_logprobs=5)
    done = None
    async for events in worker.generate(request):
        for ev in events:
            if isinstance(ev, RowDone):
                done = ev
    await worker.reset()
    assert done is not None and done.usage is not None
    return done.usage.decode_tokens_per_s, done.usage.completion_tokens


async def real_run(args, views: list[str]) -> None:
    from chatui.backends import BackendOptions, make_factory
    from inference.worker import InferenceWorker

    factory = make_factory(BackendOptions())
    alone_worker = InferenceWorker(factory, isolate=True)
    async for _ in alone_worker.load():
        pass
    app = ChatApp(factory, config=AppConfig(settings=_real_settings(args.tokens)))
    emulate_terminal(app)
    async with app.run_test(size=(120, 40)) as pilot:
        await _wait_loaded(pilot, app)
        chat = app.chat
        info = alone_worker.info
        print(f"engine: {info.name if info else '?'} ({info.device if info else ''}), isolated "
              f"worker process, greedy, up to {args.tokens} tokens, top-5 logprobs; "
              f"{args.rounds} round(s), alternating; {load()}")
        await real_alone(alone_worker, 8)  # warm both engines up
        chat.prompt.text = "hi"
        chat.prompt.action_submit()
        while chat.generating or not chat.conversation.entries:
            await pilot.pause(0.05)
        for view in views:
            chat.token_mode = view == "tokens"
            await pilot.pause(0.1)
            chat.prompt.focus()  # the keys are typed into the prompt, as a user would
            alone, through, lat, cpu = [], [], [], []
            counts: dict[str, list[int]] = {"alone": [], "app": []}
            for r in range(args.rounds):
                for step in (("alone", "app") if r % 2 == 0 else ("app", "alone")):
                    if step == "alone":
                        rate, count = await real_alone(alone_worker, args.tokens)
                        alone.append(rate)
                        counts["alone"].append(count)
                        continue
                    await chat.run_command("/clear")
                    await pilot.pause(0.2)
                    chat.prompt.text = REAL_PROMPT
                    chat.prompt.action_submit()
                    while not chat.generating:
                        await asyncio.sleep(0.001)
                    await _press_keys_while(app, chat, lat, cpu)
                    while chat.generating:
                        await asyncio.sleep(0.01)
                    await pilot.pause(0.3)
                    reply = chat.conversation.entries[-1].reply
                    assert reply.usage is not None, reply.finish_reason
                    through.append(reply.usage.decode_tokens_per_s)
                    counts["app"].append(reply.usage.completion_tokens)
                    view_widget = chat.query("ReplyView").last()
                    assert view_widget.markdown.source == reply.text, "the screen lost text"
            report(view, alone, through, lat, cpu,
                   extra=f"tokens per reply: alone {counts['alone']}, app {counts['app']}",
                   tokens=counts["app"])
        chat.token_mode = False
    alone_worker.close()
    print(load())


def report(view: str, alone: list[float], through: list[float], lat: list[float],
           cpu: list[tuple[float, float, float]], extra: str = "",
           tokens: list[int] | None = None) -> None:
    costs = [1 - t / a for a, t in zip(alone, through)]  # paired within each round
    print(f"[{view} view] engine alone {statistics.median(alone):7.1f} tok/s "
          f"{[round(x, 1) for x in alone]}; through the app {statistics.median(through):7.1f} "
          f"tok/s {[round(x, 1) for x in through]}; {extra}")
    print(f"[{view} view] UI overhead {statistics.median(costs):+.1%} (median of "
          f"{len(costs)} rounds, range {min(costs):+.1%} .. {max(costs):+.1%}; target < 5%)")
    thread = [c[0] / c[2] for c in cpu]
    process = [c[1] / c[2] for c in cpu]
    print(f"[{view} view] UI CPU while streaming, share of one core: event loop thread "
          f"{statistics.median(thread):.1%} {[f'{x:.1%}' for x in thread]}, whole UI process "
          f"{statistics.median(process):.1%} {[f'{x:.1%}' for x in process]}")
    if tokens:  # per token: the same whatever the engine's speed in that round
        per = [c[1] / n * 1000 for c, n in zip(cpu, tokens)]
        share = statistics.median(per) / 1000 * statistics.median(alone)
        print(f"[{view} view] UI process CPU per streamed token: median "
              f"{statistics.median(per):.2f} ms {[round(x, 2) for x in per]}; at the engine's "
              f"median speed alone that is {share:.1%} of a core")
    if lat:
        ms = sorted(x * 1000 for x in lat)
        p95 = ms[min(len(ms) - 1, int(0.95 * len(ms)))]
        print(f"[{view} view] keypress latency: median {statistics.median(ms):.1f} ms, "
              f"p95 {p95:.1f} ms, max {ms[-1]:.1f} ms over {len(ms)} keys (target < 50 ms)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("scripted", "real"), default="scripted")
    parser.add_argument("--view", choices=("tokens", "markdown", "both"), default="both")
    parser.add_argument("--tokens", type=int, default=None,
                        help="reply length (default 2000 scripted, 400 real)")
    parser.add_argument("--delay-ms", type=float, default=2.0,
                        help="scripted engine time per token (2 ms = 500 tok/s)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("CHATUI_CONFIG_DIR", tempfile.mkdtemp())
    os.environ.setdefault("CHATUI_DATA_DIR", tempfile.mkdtemp())
    views = ["tokens", "markdown"] if args.view == "both" else [args.view]
    if args.engine == "scripted":
        args.tokens = args.tokens or 2000
        run_scripted(args, views)
    else:
        args.tokens = args.tokens or 400
        asyncio.run(real_run(args, views))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
