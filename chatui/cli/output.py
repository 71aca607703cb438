"""What the headless commands print: JSON lines, logprob lines, the compare table, the bench
report. Pure formatting of the engine's plain data types; nothing here runs a model."""

from __future__ import annotations

import sys
from typing import Any

from inference.settings import SamplingParams
from inference.types import Progress, RowDone, Scored, Started, Token, finish_words


def progress_line(p: Progress) -> None:
    total = f"/{p.total:g}" if p.total else ""
    print(f"\r{p.stage}: {p.done:g}{total}   ", end="", file=sys.stderr, flush=True)


def token_json(t: Token, column: int | None = None) -> dict[str, Any]:
    """One token as ``generate --json`` prints it (``column`` tags ``compare --json``)."""
    d: dict[str, Any] = {"type": "token"}
    if column is not None:
        d["column"] = column
    d.update({"id": t.id, "text": t.text, "logprob": t.logprob, "entropy": t.entropy,
              "top": [{"id": a.id, "text": a.text, "logprob": a.logprob} for a in t.top],
              "channel": t.channel})
    cut = t.sampler
    if cut is not None:  # what the sampler did (local engine): after the chain, per alternative
        d["sampled_prob"] = cut.prob
        d["nucleus"] = cut.nucleus
        for a, p, c in zip(d["top"], cut.top_probs, cut.top_cuts):
            a["sampled_prob"] = p
            a["cut"] = c or None
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


class ChannelPrinter:
    """Plain text of a reply whose model reasons: the reasoning under a "Reasoning:" header
    (dim on a terminal), then a blank line and "Answer:" before the answer; a reply without
    reasoning prints as before. ``hide`` leaves the reasoning out. The blank lines a model
    writes between its reasoning and its answer (``</think>\n\n``) are not printed."""

    DIM, RESET = "\x1b[2m", "\x1b[0m"

    def __init__(self, *, hide: bool = False, tty: bool = False) -> None:
        self.hide = hide
        self.tty = tty
        self.channel = "answer"
        self.reasoned = False
        self._trim = False
        """Leading newlines of the answer after reasoning are left out."""

    def text(self, t: Token) -> str:
        """What to print for token ``t``."""
        out = ""
        if t.channel != self.channel:
            if t.channel == "reasoning" and not self.hide:
                out += (self.DIM if self.tty else "") + "Reasoning:\n"
                self.reasoned = True
            elif t.channel == "answer" and self.reasoned:
                out += (self.RESET if self.tty else "") + "\n\nAnswer:\n"
            self._trim = t.channel == "answer"
            self.channel = t.channel
        if t.channel == "reasoning" and self.hide:
            return out
        text = t.text
        if self._trim:
            text = text.lstrip("\n")
            self._trim = not text
        return out + text

    def end(self) -> str:
        """What closes the output (the terminal's style back to normal)."""
        return self.RESET if self.tty and self.channel == "reasoning" and self.reasoned else ""


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
        ent = "-" if t.entropy is None else f"{t.entropy:.3f}"  # (none over the OpenAI API)
        shown_rank = "-" if rank is None else str(rank)
        print(f"{t.index:5d}  {t.logprob:9.4f}  {t.prob:7.2%}  {shown_rank:>6}  {ent:>7}  "
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
        rate = d.usage.decode_rate
        stats = "\n".join([f"{d.usage.completion_tokens} tokens",
                           *([f"{rate:.1f} tok/s"] if rate is not None else []),
                           finish_words(d.finish_reason, d.usage)])
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
