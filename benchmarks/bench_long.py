"""Benchmark: a long chat session (issue 21). Does a day of replies stay light, smooth and
instant to clear?

The app runs in-process under Textual's pilot with the scripted engine; each reply is ~330
tokens of Markdown (a heading, paragraphs with bold and inline code, a bullet list, a fenced
code block, a quote, a numbered list), as in the issue. Replies stream unpaced except the last
one, paced like a local model (``--delay-ms``, 20 ms = 50 tok/s), while a key is pressed every
200 ms and the time until the prompt box shows it is recorded. Printed:

- every ``--every`` replies: resident memory (RSS), the objects the garbage collector tracks
  (``gc.get_objects()`` after a full collection) and those frozen (``gc.get_freeze_count()``,
  which the collector never walks again), and their sum per reply;
- the keystroke echo percentiles while the last reply streams, and the longest garbage
  collector pass (timed with ``gc.callbacks``) during it and over the whole run;
- the CPU the autosave after the last reply costs: the snapshot on the event loop and the
  journal append on the writer's thread (and, for comparison, writing the whole document);
- how long drawing each page takes while PageUp scrolls from the bottom to the top: from the
  key to the first screen update written after it (a full-screen update with the new page),
  in wall-clock time and in CPU time of the app's thread (which the load of other processes
  on a shared machine does not inflate);
- how long ``/load`` of another, short conversation takes after the long one (its first
  exchange: the long one goes, the short one is drawn), then ``/load`` of the session's own
  transcript (the old conversation goes, the loaded one is drawn), then ``/clear``, and the
  memory after it;
- with ``--types``: the types that grew most between two samples (what a reply keeps alive).

``--gc-policy off`` switches :mod:`chatui.gcpolicy` off (its functions become no-ops), to see
what a reply keeps alive without freezing.

    .venv/bin/python benchmarks/bench_long.py [--replies 200] [--every 10] [--gc-policy on|off] [--held MS]
        [--delay-ms 20] [--types] [--no-terminal]

Targets (issue 21): at most 0.5 MB of RSS and 3,000 tracked objects per reply; echo p99 at most
50 ms, max 100 ms; no collector pass over 20 ms; ``/clear`` and ``/load`` at most 300 ms (a
200-reply transcript's last screen within 1 s); every PageUp page within 30 ms; a save after
the 200th reply at most 20 ms of CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tui import _press_keys_while, emulate_terminal  # noqa: E402

SIZE = (110, 40)

_TOPICS = ["lighthouse", "compiler", "garden", "protocol", "orchestra", "glacier", "market",
           "telescope", "archive", "bakery"]


def markdown_reply(i: int) -> str:
    """Reply ``i`` of the session: ~330 scripted tokens of Markdown, different per ``i``."""
    t = _TOPICS[i % len(_TOPICS)]
    return f"""## Notes on the {t} ({i})

The **{t}** is a small system with a few moving parts, and this answer walks through them in
order. Each part is described with its `{t}_state` and the `step_{i}()` call that advances it,
so that you can follow along **without** running anything yourself. The short version is that
the design favours *plain data* over clever tricks, and that every step can be tested alone.

A second paragraph adds detail: the `config.{t}` value sets how often the loop runs, and the
**defaults** were chosen after measuring a few hundred runs on an ordinary laptop. Nothing here
needs a network, a database or a special terminal.

- The first part reads the input and checks it with `validate()`.
- The second part keeps a **running total** and the last {i % 7 + 3} values.
- The third part writes a report that a person can read in a minute.
- Errors become one clear sentence, never a traceback.

```python
def step_{i}(state, value):
    total = state.total + value
    recent = (state.recent + [value])[-5:]
    if total > LIMIT:
        raise ValueError("the {t} overflowed; lower the input")
    return State(total=total, recent=recent)
```

> A design that is easy to test is usually easy to change, and the {t} is no exception.
> Keep the state small and the steps pure.

1. Write the smallest test that fails.
2. Make it pass with the **simplest** change.
3. Measure before optimising, and keep the numbers in the commit message.
4. Repeat until the report reads well.

A last word on naming: call the **{t}** what it is, keep `helpers_{i}.py` short, and write
the docstring before the code, because a reader who knows *why* a step exists can fix it when
it breaks, and a reader who does not will copy it somewhere else. That is all there is to it;
ask again if a step is unclear, or if the numbers above do not match what you see yourself.
"""


def rss_mb() -> float:
    """Resident memory of this process, MB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def tracked_objects() -> tuple[int, int]:
    """(tracked, frozen) after a full collection: what the session keeps alive."""
    gc.collect()
    return len(gc.get_objects()), gc.get_freeze_count()


def type_counts() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(f"{type(o).__module__}.{type(o).__qualname__}"
                               for o in gc.get_objects())


class GcTimer:
    """Times every collector pass (``gc.callbacks``); passes we start ourselves are skipped."""

    def __init__(self) -> None:
        self.passes: list[tuple[float, int]] = []
        """(seconds, generation) of each pass."""
        self.ends: list[float] = []
        """When each pass ended (``time.perf_counter``)."""
        self.streaming: list[bool] = []
        """Whether a reply was streaming when each pass began (the stream's own window: a
        pass right after the reply ended, before the benchmark looked, is not one of its)."""
        self.ours = False
        self._t0 = 0.0
        self._streaming = False

    def __call__(self, phase: str, info: dict) -> None:
        from chatui import gcpolicy

        if phase == "start":
            self._t0 = time.perf_counter()
            self._streaming = gcpolicy.streaming()
        elif not self.ours:
            now = time.perf_counter()
            self.passes.append((now - self._t0, info.get("generation", -1)))
            self.ends.append(now)
            self.streaming.append(self._streaming)

    def longest(self, since: int = 0, *, streaming_only: bool = False) -> tuple[float, int]:
        return max((p for p, s in zip(self.passes[since:], self.streaming[since:])
                    if s or not streaming_only), default=(0.0, -1))


@dataclass
class Sample:
    replies: int
    rss_mb: float
    tracked: int
    frozen: int

    @property
    def alive(self) -> int:
        return self.tracked + self.frozen


@dataclass
class SessionReport:
    samples: list[Sample] = field(default_factory=list)
    echo_ms: list[float] = field(default_factory=list)
    gc_longest_stream: tuple[float, int] = (0.0, -1)
    gc_longest_all: tuple[float, int] = (0.0, -1)
    gc_passes_stream: int = 0
    shown_ms: list[float] = field(default_factory=list)
    """Each PageUp: from the key to the first screen update written after it (what a
    terminal shows first; the window draws the messages further up after that)."""
    shown_cpu_ms: list[float] = field(default_factory=list)
    """The same in CPU time of the app's thread (what the page cost, whatever else runs on
    the machine: the pilot, the app and the terminal emulation share that thread)."""
    save_cpu_ms: float = 0.0
    save_gc_ms: float = 0.0
    """Of which garbage collector passes (a collection that an allocation in the save
    happened to trigger: the process's cost, not the save's)."""
    snapshot_gc_ms: float = 0.0
    """The autosave's journal append after the last reply (the writer's thread)."""
    snapshot_cpu_ms: float = 0.0
    """The autosave's snapshot of the conversation (the event loop)."""
    document_cpu_ms: float = 0.0
    """Writing the whole document (``/save``, and compaction on quit)."""
    page_ms: list[float] = field(default_factory=list)
    shown_gc: list[tuple[float, int]] = field(default_factory=list)
    shown_gc_before: list[tuple[float, int]] = field(default_factory=list)
    """Each PageUp: (seconds, passes) of the collector's passes that ended before its first
    screen was written, i.e. inside what ``shown_ms`` times."""
    """Each PageUp until the window has drawn what is around the new page."""
    painted_ms: list[float] = field(default_factory=list)
    """Each PageUp until the new page is on screen (the pilot's press returns)."""
    held_ms: list[float] = field(default_factory=list)
    """PageUp held down (``held``: a key every so many ms, not waiting for the page): each
    key to the first screen written after it."""
    load_ms: float = 0.0
    load_other_ms: float = 0.0
    clear_ms: float = 0.0
    after_clear: Sample | None = None
    type_growth: list[tuple[str, int]] = field(default_factory=list)

    def per_reply(self, a: Sample, b: Sample) -> tuple[float, float]:
        """(MB, objects) kept alive per reply between two samples."""
        n = max(1, b.replies - a.replies)
        return (b.rss_mb - a.rss_mb) / n, (b.alive - a.alive) / n


def gc_policy_off() -> Callable[[], None]:
    """Make :mod:`chatui.gcpolicy` do nothing; returns a function that restores it."""
    from chatui import gcpolicy

    names = ("stream_started", "stream_ended", "release", "freeze_imports", "scrolled",
             "scroll_settled", "page_drawn")
    saved = {n: getattr(gcpolicy, n) for n in names}
    for n in names:
        setattr(gcpolicy, n, lambda *args, **kwargs: 0)

    def restore() -> None:
        for n, f in saved.items():
            setattr(gcpolicy, n, f)

    return restore


async def _wait_idle(app, pilot) -> None:
    chat = app.chat
    await asyncio.sleep(0)
    while True:
        worker = chat._gen_worker
        if not chat.generating and (worker is None or worker.is_finished):
            break
        await asyncio.sleep(0.002)
    await pilot.pause()


async def run_session(replies: int, *, every: int = 10, delay_ms: float = 20.0,
                      terminal: bool = True, types_between: tuple[int, int] | None = None,
                      measure_last: bool = True, clear: bool = True, scroll: bool = True,
                      on_sample: Callable[[Sample], None] | None = None,
                      inspect: Callable[[object], None] | None = None,
                      after_reply: Callable[[object], Awaitable[None]] | None = None,
                      held_ms: float | None = None,
                      ) -> SessionReport:
    """Run ``replies`` scripted replies in one app and measure (see the module docstring).

    ``inspect(app)`` runs after the last reply; ``after_reply(app)`` after each one (to try
    a change to finished replies before it is wired in); ``held_ms``: then hold PageUp
    down from the bottom, a key every ``held_ms`` ms."""
    from textual import events

    from chatui import gcpolicy, transcript
    from chatui.app import ChatApp
    from chatui.config import AppConfig
    from chatui.conversation import Reply
    from chatui.transcript.writer import AutosaveWriter
    from inference.scripted import ScriptedBackend
    from inference.settings import SamplingParams

    count = {"n": 0}

    def script(request, row) -> str:
        count["n"] += 1
        return markdown_reply(count["n"])

    holder: dict[str, ScriptedBackend] = {}

    def factory(progress):
        holder["backend"] = ScriptedBackend(script)
        return holder["backend"]

    gcpolicy.freeze_imports()  # as run_chat does before it builds the app
    app = ChatApp(factory, config=AppConfig(stable_timings=True, autosave=False,
                                            settings=SamplingParams(max_new_tokens=2000)))
    paints: list[float] = []
    paints_cpu: list[float] = []
    if terminal:
        from chatui.textual_compat.testing import paint_times

        emulate_terminal(app)
        paints = paint_times(app)
        paints_cpu = paint_times(app, time.thread_time)
    report = SessionReport()
    timer = GcTimer()
    gc.callbacks.append(timer)
    types_before: collections.Counter[str] | None = None

    def sample(n: int) -> Sample:
        timer.ours = True
        try:
            s = Sample(n, rss_mb(), *tracked_objects())
        finally:
            timer.ours = False
        report.samples.append(s)
        if on_sample is not None:
            on_sample(s)
        return s

    try:
        async with app.run_test(size=SIZE) as pilot:
            while app.chat.info is None:
                await pilot.pause(0.01)
            chat = app.chat
            sample(0)
            for n in range(1, replies + 1):
                last = n == replies and measure_last
                if last:
                    holder["backend"].delay_s = delay_ms / 1000
                    since = len(timer.passes)
                chat.prompt.text = f"Tell me about topic {n}."
                chat.prompt.action_submit()
                if last:
                    while not chat.generating:
                        await asyncio.sleep(0.001)
                    chat.prompt.focus()
                    await _press_keys_while(app, chat, report.echo_ms, [])
                    report.gc_longest_stream = timer.longest(since, streaming_only=True)
                    report.gc_passes_stream = sum(timer.streaming[since:])
                await _wait_idle(app, pilot)
                if after_reply is not None:
                    await after_reply(app)
                if types_between is not None and n == types_between[0]:
                    timer.ours = True
                    types_before = type_counts()
                    timer.ours = False
                if types_between is not None and n == types_between[1] and types_before:
                    timer.ours = True
                    growth = type_counts() - types_before
                    timer.ours = False
                    report.type_growth = growth.most_common(40)
                if n % every == 0 or n == replies:
                    sample(n)
            report.echo_ms = [x * 1000 for x in report.echo_ms]
            if inspect is not None:
                inspect(app)
            report.gc_longest_all = timer.longest()
            if scroll:  # bottom to top, a page at a time, each until it is drawn
                log_view = chat.log_view
                while log_view.scroll_y > 0 and len(report.page_ms) < 10_000:
                    t0, c0 = time.perf_counter(), time.thread_time()
                    first, g0 = len(paints), len(timer.passes)
                    await pilot.press("pageup")  # the prompt has the focus, as in the app
                    if len(paints) > first:  # the first screen written after the key
                        report.shown_ms.append((paints[first] - t0) * 1000)
                        report.shown_cpu_ms.append((paints_cpu[first] - c0) * 1000)
                        # the collector's passes between the key and that screen (or soon after)
                        report.shown_gc.append(max(timer.passes[g0:], default=(0.0, -1)))
                        inside = [p for (p, _), end in zip(timer.passes[g0:], timer.ends[g0:])
                                  if end <= paints[first]]
                        report.shown_gc_before.append((sum(inside), len(inside)))
                    report.painted_ms.append((time.perf_counter() - t0) * 1000)
                    while chat.window.busy:  # the messages a screen further up are drawn
                        await asyncio.sleep(0.001)
                    await pilot.pause()
                    report.page_ms.append((time.perf_counter() - t0) * 1000)
            if held_ms is not None and paints:  # PageUp held: keys at the key-repeat rate
                chat.log_view.scroll_end(animate=False)
                await pilot.pause()
                while chat.window.busy:
                    await asyncio.sleep(0.001)
                gap = held_ms / 1000
                while chat.log_view.scroll_y > 0 and len(report.held_ms) < 10_000:
                    t0, first = time.perf_counter(), len(paints)
                    app.post_message(events.Key("pageup", None))  # no wait for the page
                    while len(paints) == first and time.perf_counter() - t0 < 2.0:
                        await asyncio.sleep(0.001)
                    if len(paints) > first:
                        report.held_ms.append((paints[first] - t0) * 1000)
                    rest = gap - (time.perf_counter() - t0)
                    if rest > 0:
                        await asyncio.sleep(rest)
                while chat.window.busy:
                    await asyncio.sleep(0.001)
                await pilot.pause()
            # the key let go: the full pass that waited for the scrolling runs once it has
            # been quiet (chatui.gcpolicy.SCROLL_QUIET_S), long before a person has typed
            # the next command
            while gcpolicy.scrolling():
                await asyncio.sleep(0.01)
            with tempfile.TemporaryDirectory() as tmp:
                # the autosave after the last reply, as the app makes it: a snapshot on the
                # loop, then the writer's journal append on its thread (the document was
                # written by an earlier save of the session, and the prompt with the reply
                # not yet begun was journaled when the reply started)
                before = chat.conversation.snapshot()
                before.truncate(len(before.entries) - 2)
                writer = AutosaveWriter()
                writer.write(before, Path(tmp))
                started = chat.conversation.snapshot()
                last = started.entries[-1]
                last.replies = [Reply(r.settings) for r in last.replies]
                writer.write(started, Path(tmp))
                n0, t0 = len(timer.passes), time.thread_time()
                conv = chat.conversation.snapshot()
                report.snapshot_cpu_ms = (time.thread_time() - t0) * 1000
                n1, t0 = len(timer.passes), time.thread_time()
                writer.write(conv, Path(tmp))
                report.save_cpu_ms = (time.thread_time() - t0) * 1000
                report.snapshot_gc_ms = sum(p for p, _ in timer.passes[n0:n1]) * 1000
                report.save_gc_ms = sum(p for p, _ in timer.passes[n1:]) * 1000
                saved = Path(tmp) / "t.json"
                t0 = time.thread_time()
                transcript.save_transcript(conv, saved)
                report.document_cpu_ms = (time.thread_time() - t0) * 1000
                if clear:
                    # another, short conversation (its first exchange): the 200 replies go,
                    # two come; then the long one back, untimed
                    short = conv.snapshot()
                    short.truncate(2)
                    small = Path(tmp) / "short.json"
                    transcript.save_transcript(short, small)
                    for path, timed in ((small, True), (saved, False)):
                        t0 = time.perf_counter()
                        await chat.run_command(f"/load {path}")
                        await pilot.pause()
                        while chat.window.busy:
                            await asyncio.sleep(0.001)
                        await pilot.pause()
                        if timed:
                            report.load_other_ms = (time.perf_counter() - t0) * 1000
                    # the same conversation again: the old one goes, all of it comes
                    t0 = time.perf_counter()
                    await chat.run_command(f"/load {saved}")
                    await pilot.pause()
                    while chat.window.busy:  # its last screen is drawn
                        await asyncio.sleep(0.001)
                    await pilot.pause()
                    report.load_ms = (time.perf_counter() - t0) * 1000
            if clear:
                t0 = time.perf_counter()
                await chat.run_command("/clear")
                await pilot.pause()
                report.clear_ms = (time.perf_counter() - t0) * 1000
                timer.ours = True
                report.after_clear = Sample(replies, rss_mb(), *tracked_objects())
                timer.ours = False
    finally:
        gc.callbacks.remove(timer)
    return report


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def print_report(report: SessionReport) -> None:
    s = report.samples
    if len(s) >= 2:
        first = next((x for x in s[:-1] if x.replies >= 10), s[0])
        mb, objs = report.per_reply(first, s[-1])
        print(f"per reply after reply {first.replies}: {mb:.2f} MB, {objs:,.0f} objects kept "
              f"alive (target <= 0.5 MB, <= 3,000)")
    if report.echo_ms:
        ms = report.echo_ms
        print(f"keystroke echo while the last reply streamed: median "
              f"{statistics.median(ms):.1f} ms, p99 {_pct(ms, 0.99):.1f} ms, max "
              f"{max(ms):.1f} ms over {len(ms)} keys (target p99 <= 50, max <= 100)")
    lon, gen = report.gc_longest_stream
    print(f"longest gc pass while it streamed: {lon * 1000:.1f} ms (generation {gen}, "
          f"{report.gc_passes_stream} passes); over the whole run: "
          f"{report.gc_longest_all[0] * 1000:.1f} ms (generation {report.gc_longest_all[1]}) "
          f"(target <= 20 ms)")
    print(f"autosave after the last reply: {report.snapshot_cpu_ms:.1f} ms of CPU on the loop "
          f"(snapshot) + {report.save_cpu_ms:.1f} ms on the writer's thread (journal) "
          f"(target <= 20 ms each; garbage collector passes in them: "
          f"{report.snapshot_gc_ms:.1f} + {report.save_gc_ms:.1f} ms); the whole document "
          f"(/save): "
          f"{report.document_cpu_ms:.0f} ms")
    if report.shown_ms:
        ms = report.shown_ms
        print(f"PageUp, from the key to the new page written to the terminal: median "
              f"{statistics.median(ms):.1f} ms, p95 {_pct(ms, 0.95):.1f}, max {max(ms):.1f} ms "
              f"over {len(ms)} pages (target <= 30 ms)")
    if report.shown_cpu_ms:
        ms = report.shown_cpu_ms
        print(f"  the same in CPU time of the app's thread: median {statistics.median(ms):.1f} "
              f"ms, p95 {_pct(ms, 0.95):.1f}, max {max(ms):.1f} ms")
    if report.shown_gc and report.shown_ms:
        worst = max(range(len(report.shown_ms)), key=report.shown_ms.__getitem__)
        held = [g for g in report.shown_gc if g[1] == 2]
        p, gen = report.shown_gc[worst]
        print(f"  the slowest page (#{worst + 1}): its longest collector pass {p * 1000:.1f} ms "
              f"(generation {gen}); full passes during pages: {len(held)}")
        if report.shown_gc_before:
            slow = sorted(range(len(report.shown_ms)), key=report.shown_ms.__getitem__)[-3:]
            if report.shown_cpu_ms:
                slow.append(max(range(len(report.shown_cpu_ms)),
                                key=report.shown_cpu_ms.__getitem__))
            for i in dict.fromkeys(reversed(slow)):
                g, n = report.shown_gc_before[i]
                cpu = report.shown_cpu_ms[i] if i < len(report.shown_cpu_ms) else float("nan")
                print(f"  page #{i + 1}: {report.shown_ms[i]:.1f} ms ({cpu:.1f} ms CPU), of "
                      f"which {g * 1000:.1f} ms in {n} collector passes before it was shown")
    if report.page_ms:
        ms, painted = report.page_ms, report.painted_ms
        print(f"PageUp from the bottom to the top: {len(ms)} pages; until the app is idle (pilot): median "
              f"{statistics.median(painted):.1f} ms, p95 {_pct(painted, 0.95):.1f}, max "
              f"{max(painted):.1f} ms (target <= 30 ms); until the messages a screen further "
              f"up are drawn too: median {statistics.median(ms):.1f} ms, max {max(ms):.1f} ms")
    if report.held_ms:
        ms = report.held_ms
        print(f"PageUp held down: {len(ms)} pages; from each key to the next screen: median "
              f"{statistics.median(ms):.1f} ms, p95 {_pct(ms, 0.95):.1f}, max {max(ms):.1f} ms")
    if report.load_other_ms:
        print(f"/load of another conversation (one exchange) after "
              f"{report.samples[-1].replies} replies: {report.load_other_ms:.0f} ms "
              f"(target <= 300 ms)")
    if report.load_ms:
        print(f"/load of the {report.samples[-1].replies}-reply transcript over itself: "
              f"{report.load_ms:.0f} ms (target: last screen within 1 s)")
    if report.after_clear is not None:
        a = report.after_clear
        print(f"/clear: {report.clear_ms:.0f} ms (target <= 300 ms); after it {a.rss_mb:.0f} MB,"
              f" {a.tracked:,} tracked + {a.frozen:,} frozen objects")
    if report.type_growth:
        print("types that grew most between the two samples (count):")
        for name, n in report.type_growth:
            print(f"  {n:>9,}  {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=200)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--gc-policy", choices=("on", "off"), default="on")
    parser.add_argument("--delay-ms", type=float, default=20.0,
                        help="scripted time per token of the last reply (20 ms = 50 tok/s)")
    parser.add_argument("--types", action="store_true",
                        help="print the types that grew most from reply 10 to reply 20")
    parser.add_argument("--no-terminal", action="store_true",
                        help="do not turn screen updates into escape sequences")
    parser.add_argument("--held", type=float, metavar="MS",
                        help="then hold PageUp down from the bottom: a key every MS ms "
                             "(33: a terminal's key repeat), not waiting for each page")
    args = parser.parse_args()
    os.environ.setdefault("CHATUI_CONFIG_DIR", tempfile.mkdtemp())
    os.environ.setdefault("CHATUI_DATA_DIR", tempfile.mkdtemp())
    if args.gc_policy == "off":
        gc_policy_off()
    print(f"long session: {args.replies} replies of ~330 tokens of Markdown, gc policy "
          f"{args.gc_policy}; load {os.getloadavg()[0]:.2f}")

    def show(s: Sample) -> None:
        print(f"after {s.replies:>4} replies: {s.rss_mb:7.1f} MB, {s.tracked:>10,} tracked + "
              f"{s.frozen:>10,} frozen objects", flush=True)

    types = (10, 20) if args.types and args.replies >= 20 else None
    report = asyncio.run(run_session(args.replies, every=args.every, delay_ms=args.delay_ms,
                                     terminal=not args.no_terminal, types_between=types,
                                     on_sample=show, held_ms=args.held))
    print_report(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
