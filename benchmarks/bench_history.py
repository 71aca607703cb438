"""How fast ``/history WORDS`` (and ``chatui history search``) answers over many transcripts.

    python benchmarks/bench_history.py [--transcripts 1000] [--dir DIR]

Writes N transcripts of 6 messages (~120 words each, drawn from a 5,000-word vocabulary) into a
temporary folder (or DIR), then times, each in a fresh ``search_transcripts`` call as the app
makes it: the first search (which builds the index from every file), searches on an
up-to-date index (median and worst of 20 queries of 1-3 words), and a search after one file
changed. The issue's target: under 100 ms over 1,000 transcripts, up to date.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chatui.conversation import Conversation  # noqa: E402
from chatui.transcript import save_transcript  # noqa: E402
from chatui.transcript.search import search_transcripts  # noqa: E402
from inference.settings import SamplingParams  # noqa: E402


def words(rng: random.Random, vocab: list[str], n: int) -> str:
    return " ".join(rng.choice(vocab) for _ in range(n))


def write_transcripts(folder: Path, n: int, rng: random.Random, vocab: list[str]) -> None:
    for i in range(n):
        conv = Conversation(title=words(rng, vocab, 4))
        for _ in range(3):
            conv.add_user(words(rng, vocab, 120))
            entry = conv.add_assistant([SamplingParams()])
            entry.replies[0].text, entry.replies[0].finish_reason = words(rng, vocab, 120), "stop"
        save_transcript(conv, folder / f"chat-{i:05d}.json")


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1000, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transcripts", type=int, default=1000)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    rng = random.Random(0)
    vocab = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                    for _ in range(5000)})
    folder = args.dir or Path(tempfile.mkdtemp(prefix="chatui-history-"))
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    write_transcripts(folder, args.transcripts, rng, vocab)
    print(f"wrote {args.transcripts} transcripts into {folder} in {time.perf_counter() - t0:.1f} s")
    first, hits = timed(lambda: search_transcripts(vocab[7], folder))
    print(f"first search (builds the index): {first:.0f} ms, {len(hits)} hits")
    times = []
    for q in range(20):
        query = " ".join(rng.choice(vocab)[:rng.randint(3, 6)] for _ in range(rng.randint(1, 3)))
        ms, _ = timed(lambda: search_transcripts(query, folder))
        times.append(ms)
    print(f"up-to-date search: median {statistics.median(times):.1f} ms, "
          f"worst {max(times):.1f} ms (20 queries of 1-3 words)")
    conv = Conversation(title="changed")
    conv.add_user("a brand new message about zyzzyva")
    save_transcript(conv, folder / "chat-new.json")
    ms, hits = timed(lambda: search_transcripts("zyzzyva", folder))
    print(f"search after one new file: {ms:.1f} ms ({len(hits)} hit)")


if __name__ == "__main__":
    main()
