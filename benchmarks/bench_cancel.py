"""How soon Esc stops a reply while its long prompt is still being read (the prefill).

    python benchmarks/bench_cancel.py [--ckpt PATH] [--words 600] [--at 2 5]

A prompt of ``--words`` repetitions of a nine-word sentence (600: about 6,000 tokens of the
default model) goes to the engine through the isolated worker, as the app sends it, and
``stream.cancel()`` (what Esc calls) runs at each of the ``--at`` seconds, one request each;
printed: the prefill's progress reports, then how long after the cancel the reply ended and how
many tokens it had. The second request reuses the first's cached prefix (what a cancelled
prefill kept), so its prefill starts deeper in the context, where a 512-token chunk is slower.
Before issue 18's session of 2026-11-27 a cancel waited for the chunk being read (up to 1.3 s at
5,000 tokens of context here); the fast runner now stops before its next layer.
"""

from __future__ import annotations

import argparse
import asyncio
import time

SENTENCE = "The quick brown fox jumps over the lazy dog."


async def run(ckpt: str | None, words: int, cancel_at: list[float]) -> None:
    from chatui.backends import BackendOptions, make_factory
    from inference.settings import SamplingParams
    from inference.types import GenerationRequest, Message, PromptProgress, RowDone
    from inference.worker import InferenceWorker

    worker = InferenceWorker(make_factory(BackendOptions(ckpt=ckpt)), isolate=True)
    await worker.load().collect()
    text = " ".join([SENTENCE] * words) + " Summarize the text above."
    try:
        for at in cancel_at:
            request = GenerationRequest((Message("user", text),),
                                        (SamplingParams(temperature=0, max_new_tokens=20),), 5)
            stream = worker.generate(request)
            t0 = time.perf_counter()
            asked: list[float] = []

            async def cancel_later() -> None:
                await asyncio.sleep(at)
                asked.append(time.perf_counter() - t0)
                stream.cancel()

            task = asyncio.create_task(cancel_later())
            async for group in stream:
                for event in group:
                    now = time.perf_counter() - t0
                    if isinstance(event, PromptProgress):
                        print(f"  {now:6.2f} s  read {event.done:,} of {event.total:,} tokens")
                    elif isinstance(event, RowDone):
                        after = f"{(now - asked[0]) * 1000:.0f} ms after it" if asked else \
                            "before it"
                        print(f"cancel at {at:.1f} s: ended at {now:.2f} s ({after}), "
                              f"{event.finish_reason}, {event.usage.completion_tokens} tokens")
            task.cancel()
    finally:
        await worker.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ckpt", default=None, help="checkpoint (default: the default model)")
    parser.add_argument("--words", type=int, default=600, help="sentences in the prompt")
    parser.add_argument("--at", type=float, nargs="+", default=[2.0, 5.0],
                        help="seconds after sending at which to cancel, one request each")
    args = parser.parse_args()
    asyncio.run(run(args.ckpt, args.words, args.at))


if __name__ == "__main__":
    main()
