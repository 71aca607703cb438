"""What the headless commands print: JSON lines, logprob lines, the compare table, the bench
report. Pure formatting of the engine's plain data types; nothing here runs a model."""

from __future__ import annotations

import sys
from typing import Any

from inference.settings import SamplingParams
from inference.types import Progress, RowDone, Scored, Started, Token


def progress_line(p: Progress) -> None:
    total = f"/{p.total:g}" if p.total else ""
    print(f"\r{p.stage}: {p.done:g}{total}   ", end="", file=sys.stderr, flush=True)


def token_json(t: Token, column: int | None = None) -> dict[str, Any]:
    """One token as ``generate --json`` prints it (``column`` tags ``compare --json``)."""
    d: dict[str, Any] = {"type": "token"}
    if column is not None:
        d["column"] = column
    d.update({"id": t.id, "text": t.text, "logprob": t.logprob, "entropy": t.entropy,
              "top": [{"id": a.id, "text": a.text, "logprob": a.logprob} for a in t.top]})
    if t.special:
        d["special"] = True
    return d


def done_json(d: RowDone, started: Started | None, column: int | None = None) -> dict[str, Any]:
    """The end of one reply: finish reason and usage."""
    out: dict[str, Any] = {"type": "done"}
    if column is not None:
        out["column"] = column
    out.update({"finish_reason": d.finish_reason, "prompt_tokens": d.usage.prompt_tokens,
                "completion_tokens": d.usage.completion_tokens,
                "cached_tokens": d.usage.cached_tokens, "ttft_s": round(d.usage.ttft_s, 4),
                "decode_tokens_per_s": round(d.usage.decode_tokens_per_s, 2)})
    if started is not None and started.dropped_messages:
        out["dropped_messages"] = started.dropped_messages
    return out


def print_logprob_token(t: Token) -> None:
    if t.logprob is None:
        print(f"{'':>9}  {t.text!r}")
        return
    alts = "  ".join(f"{a.text!r} {a.logprob:.2f}" for a in t.top if a.id != t.id)
    print(f"{t.logprob:9.4f}  {t.prob:7.2%}  {t.text or t.raw!r:<20}  {alts}")


def score_json(scored: Scored) -> list[dict[str, Any]]:
    """``score --json``: one object per token (``generate --json``'s fields with its position
    and rank; logprob, entropy and rank are null for a token with nothing before it), then
    ``{"type": "score", ...}`` with the perplexity."""
    out: list[dict[str, Any]] = []
    for t, rank in zip(scored.tokens, scored.ranks):
        d = token_json(t)
        d["index"] = t.index
        d["rank"] = rank
        out.append(d)
    lps = [t.logprob for t in scored.tokens if t.logprob is not None]
    out.append({"type": "score", "tokens": len(scored.tokens), "scored_tokens": len(lps),
                "sum_logprob": sum(lps), "perplexity": scored.perplexity})
    return out


def print_score(scored: Scored) -> None:
    """``score``'s table: position, logprob, probability, rank, entropy, the token and the
    model's alternatives; then the perplexity."""
    print(f"{'#':>5}  {'logprob':>9}  {'prob':>7}  {'rank':>6}  {'entropy':>7}  "
          f"{'token':<20}  alternatives")
    for t, rank in zip(scored.tokens, scored.ranks):
        shown = repr(t.text or t.raw)
        if t.logprob is None:
            print(f"{t.index:5d}  {'-':>9}  {'-':>7}  {'-':>6}  {'-':>7}  {shown:<20}")
            continue
        alts = "  ".join(f"{a.text!r} {a.logprob:.2f}" for a in t.top if a.id != t.id
                         or a.id is None and a.text != t.text)
        print(f"{t.index:5d}  {t.logprob:9.4f}  {t.prob:7.2%}  {rank:6d}  {t.entropy or 0:7.3f}  "
              f"{shown:<20}  {alts}")
    print(f"perplexity {scored.perplexity:.4g} over {scored.scored} scored tokens")


def print_compare_table(rows: tuple[SamplingParams, ...], done: list[RowDone],
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


def print_bench(d: dict[str, Any]) -> None:
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


def print_bench_compare(d: dict[str, Any]) -> None:
    what = "branch" if d.get("mode") == "fan-out" else "setting"
    print(f"model {d['model']} on {d['device']} ({d['dtype']}, quantization "
          f"{d['quantization']}, {d['threads']} threads), prompt {d['prompt_tokens']} tokens, "
          f"{d['new_tokens']} new tokens per {what}, top-{d['top_logprobs']} logprobs")
    if d.get("mode") == "fan-out":
        print("  fan-out: the N most likely tokens at token 8 of a greedy reply, continued "
              "greedily")
    print("  N  batched: s  tok/s (decode)   sequential: s  tok/s (decode)   speedup")
    for r in d["rows"]:
        print(f"  {r['n']}  {r['batched_s']:10.2f}  {r['batched_tokens_per_s']:6.1f} "
              f"({r['batched_decode_tokens_per_s']:6.1f})   {r['sequential_s']:13.2f}  "
              f"{r['sequential_tokens_per_s']:6.1f} ({r['sequential_decode_tokens_per_s']:6.1f})"
              f"   {r['speedup']:.2f}x")
