"""How much CPU an autosave costs as a conversation grows: ``python -m chatui.transcript.bench``.

Builds a conversation of replies of ~330 tokens, each with its 5 top alternatives (what the
app records by default), and autosaves it as the app does: when a reply starts (the prompt and
an empty reply) and when it ends. At 10, 100 and 200 replies it prints the CPU time of the
save after the reply ended, on each thread: the event loop's snapshot, the writer thread's
journal append (CPU time: an fsync's wait is not counted), and for comparison a whole-document
write of the same conversation, which is what every autosave cost before the journal.
Measured 2026-11-26 00:38 UTC (a shared 2-core machine, load 5.3), replies of 330 tokens,
the code before issue 21's last change and after it, one run after the other:

                  before (tokens compared column by column)   after (columns shared)
    replies  loop: snapshot  writer: journal          loop: snapshot  writer: journal
         10          0.3 ms           2.6 ms                  0.1 ms           2.2 ms
        100          2.6 ms           6.9 ms                  0.7 ms           2.7 ms
        200          6.0 ms          16.5 ms                  1.7 ms           3.4 ms
    whole document after 200 replies: ~300 ms (19.4 MiB); a new session's first save
    after 200 replies (reads the files once): ~260 ms

Before, every save copied every reply's token columns into the snapshot and compared them
byte by byte with the saved ones; now a snapshot shares them (copy on write,
``TokenRecords.copy``) and an unchanged message compares by identity, so what grows with
the conversation is a few microseconds per message. (Until then this benchmark gave each
reply a list of tokens, which the app never does, and measured converting it.)
(The last is avoided when the app opens the conversation through ``Autosaver.open``, which
hands what it read to the writer.)
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time
from pathlib import Path

from ..conversation import Conversation
from ..token_records import TokenRecords
from .store import write_document
from .writer import AutosaveWriter

from inference.settings import SamplingParams  # noqa: E402  (grouped with the first party)
from inference.types import Alternative, Token, Usage  # noqa: E402

WORDS = ("the model", " **bold**", " `code`", " and", " a list:\n- item", " quote\n> ", " 42",
         " tokens", " é", " 中文")


def _reply_tokens(n: int, count: int) -> list[Token]:
    return [Token(i, 1000 + (i * 7 + n) % 30000, WORDS[(i + n) % len(WORDS)],
                  -0.25 - (i % 5) * 0.5, 1.5,
                  tuple(Alternative(2000 + j, WORDS[(i + j) % len(WORDS)], -1.0 - j)
                        for j in range(5)))
            for i in range(count)]


def _cpu(fn) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """CPU time of ``fn()`` on this thread, with the garbage collector paused: a full
    collection walks every object of the process (here ~400,000 tokens and alternatives after
    200 replies, 0.1-0.5 s) and lands in whichever call allocates at the wrong moment, so it is
    the GC policy's cost (chatui.gcpolicy), not the save's."""
    gc.collect()
    gc.disable()
    try:
        t = time.thread_time()
        out = fn()
        return time.thread_time() - t, out
    finally:
        gc.enable()


def run(checkpoints: tuple[int, ...] = (10, 100, 200), tokens: int = 330) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as d:
        directory = Path(d)
        writer = AutosaveWriter()
        conv = Conversation(id="bench")
        for n in range(1, max(checkpoints) + 1):
            conv.add_user(f"Prompt {n}: write about Markdown, ~300 words.")
            entry = conv.add_assistant([SamplingParams()])
            writer.write(conv.snapshot(), directory)  # the reply starts
            reply = entry.replies[0]
            reply.tokens = TokenRecords(_reply_tokens(n, tokens))  # columns, as the app's
            reply.text = entry.text = "".join(t.text for t in reply.tokens)
            reply.finish_reason, reply.usage = "stop", Usage(400 * n, tokens, 0, 0.1, 46.0)
            if n not in checkpoints:
                writer.write(conv.snapshot(), directory)
                continue
            snap_cpu, snap = _cpu(conv.snapshot)  # on the event loop
            write_cpu, _ = _cpu(lambda: writer.write(snap, directory))  # on the writer thread
            full_cpu, size = _cpu(lambda: write_document(snap, directory / "full.json"))
            rows.append({"replies": n, "snapshot_ms": snap_cpu * 1e3,
                         "journal_ms": write_cpu * 1e3, "full_ms": full_cpu * 1e3,
                         "document_mib": size / 2**20})
        # The next session: its first save reads the files back once (to check them and to go
        # on with the journal).
        conv.add_user("One more")
        conv.add_assistant([SamplingParams()])
        first_cpu, _ = _cpu(lambda: AutosaveWriter().write(conv.snapshot(), directory))
        rows.append({"replies": max(checkpoints), "first_save_ms": first_cpu * 1e3})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=330, help="tokens per reply")
    args = ap.parse_args()
    print(f"autosave CPU after a reply of {args.tokens} tokens with 5 alternatives each")
    print(f"{'replies':>8} {'loop: snapshot':>15} {'writer: journal':>16} "
          f"{'whole document':>15} {'document':>9}")
    rows = run(tokens=args.tokens)
    for r in rows[:-1]:
        print(f"{r['replies']:>8} {r['snapshot_ms']:>12.1f} ms {r['journal_ms']:>13.1f} ms "
              f"{r['full_ms']:>12.1f} ms {r['document_mib']:>5.1f} MiB")
    print(f"a new session's first save after {rows[-1]['replies']} replies (reads the files "
          f"once): {rows[-1]['first_save_ms']:.0f} ms")


if __name__ == "__main__":
    main()
