"""Benchmark: what the chat UI costs the engine, and how fast it answers a key while streaming.

Streams a 2,000-token reply from the scripted engine (paced like a fast local model) through
the real app with the token view on, and compares the tokens/s the screen shows with the
engine alone (the same backend drained without a UI). While it streams, it presses a key every
200 ms and measures the time until the prompt box shows the character.

    .venv/bin/python benchmarks/bench_tui.py [--tokens 2000] [--delay-ms 2]

Targets: UI overhead under 5%, keypress latency under 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
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
from inference.types import GenerationRequest, Message, TokenBatch  # noqa: E402


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
        else:
            words.append(f" w{i}")
    return "".join(words)


def engine_alone(text: str, delay: float, n: int) -> float:
    backend = ScriptedBackend(lambda r, row: text, delay_s=delay)
    req = GenerationRequest((Message("user", "go"),), (SamplingParams(max_new_tokens=n * 2),))
    t0 = time.perf_counter()
    count = 0
    first = None
    for ev in backend.generate(req, threading.Event()):
        if isinstance(ev, TokenBatch):
            count += len(ev.tokens)
            first = first or time.perf_counter()
    return (count - 1) / (time.perf_counter() - first)


async def through_app(text: str, delay: float, n: int) -> tuple[float, int, list[float]]:
    app = ChatApp(lambda p: ScriptedBackend(lambda r, row: text, delay_s=delay),
                  config=AppConfig(token_view=True, settings=SamplingParams(max_new_tokens=n * 2)))
    from textual import events

    latencies: list[float] = []
    async with app.run_test(size=(120, 40)) as pilot:
        while app.chat.info is None:
            await pilot.pause(0.01)
        chat = app.chat
        chat.prompt.text = "go"
        chat.prompt.action_submit()
        while not chat.conversation.entries or chat.conversation.entries[-1].reply is None \
                or not chat.conversation.entries[-1].reply.tokens:
            await asyncio.sleep(0.001)
        reply = chat.conversation.entries[-1].reply
        t_first = time.perf_counter()
        first_count = len(reply.tokens)
        typed = ""
        while chat.generating:
            await asyncio.sleep(0.2)
            if not chat.generating:
                break
            typed += "x"
            ev = events.Key("x", "x")
            ev.set_sender(app)
            t0 = time.perf_counter()
            app._driver.send_message(ev)
            while chat.prompt.text != typed and chat.generating:
                await asyncio.sleep(0.0005)
            latencies.append(time.perf_counter() - t0)
        t_end = time.perf_counter()
        count = len(reply.tokens)
        view = chat.query("ReplyView").last()
        shown = len(view.token_view.units)
        await pilot.pause(0.2)
        assert view.markdown.source == reply.text, "the screen lost text"
    rate = (count - first_count) / (t_end - t_first)
    return rate, shown, latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--delay-ms", type=float, default=2.0,
                        help="engine time per token (2 ms = 500 tok/s)")
    args = parser.parse_args()
    os.environ.setdefault("CHATUI_CONFIG_DIR", tempfile.mkdtemp())
    os.environ.setdefault("CHATUI_DATA_DIR", tempfile.mkdtemp())
    text = reply_text(args.tokens)
    if os.environ.get("SWITCH"): sys.setswitchinterval(float(os.environ["SWITCH"]))
    delay = args.delay_ms / 1000
    alone = engine_alone(text, delay, args.tokens)
    rate, shown, lat = asyncio.run(through_app(text, delay, args.tokens))
    overhead = 1 - rate / alone
    print(f"tokens: {args.tokens} (token view on, {shown} units on screen)")
    print(f"engine alone:     {alone:8.1f} tok/s")
    print(f"through the app:  {rate:8.1f} tok/s   (UI overhead {overhead:+.1%}; target < 5%)")
    if lat:
        lat_ms = sorted(x * 1000 for x in lat)
        p95 = lat_ms[min(len(lat_ms) - 1, int(0.95 * len(lat_ms)))]
        print(f"keypress latency: median {statistics.median(lat_ms):.1f} ms, p95 {p95:.1f} ms, "
              f"max {lat_ms[-1]:.1f} ms over {len(lat_ms)} keys (target < 50 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
