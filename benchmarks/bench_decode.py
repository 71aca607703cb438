"""Decode speed of every chatui precision against its peers, side by side in one process.

Round-robin over the systems (so a busy shared CPU hurts them alike), best of ``--rounds``:
transformers ``generate`` fp32; chatui on the transformers runner; chatui's fast runner in
fp32 (chatui's fp32 kernel where it builds), in bf16 (torch's bf16 matmuls), with int8 (the CPU default: chatui's group-wise kernel
where it builds) and int4 weights (eager, and with the decode step compiled by ``torch.compile``
with inductor's C++ wrapper), each with
top-5 logprobs and without; llama.cpp on the Q4_1 GGUF with and without logprobs (when
llama-cpp-python is installed). Then quality (top-1 agreement with fp32 and perplexity on
``inference.quality.SAMPLE_TEXT``), 1,000-token prefill against transformers' forward, and the
time to first token of a follow-up turn as the conversation grows.

    .venv/bin/python benchmarks/bench_decode.py [--new-tokens 128] [--prompt-tokens 128]
        [--rounds 3] [--threads N] [--no-llamacpp] [--json out.json]

``--shapes`` measures instead the models people run, at their real sizes (random weights,
``benchmarks/shapes.py``, built once into ``--shapes-dir``, never the repository): per shape,
transformers fp32 ``generate``, chatui int8 and int4 (fast runner, top-5 logprobs on, through
the engine as ``chatui bench``), and llama.cpp on GGUFs of the same weights quantized by
llama.cpp to Q8_0 and Q4_K_M (its lowest-overhead loop: ``Llama.eval`` one token at a time, no
sampling, no logprobs). It prints a Markdown table of tokens/s and of the weights each decode
step reads (GB/s), next to this machine's measured read bandwidth and the load average.

    .venv/bin/python benchmarks/bench_decode.py --shapes [--quick] [--only NAME,...]
        [--new-tokens 32] [--prompt-tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inference.bench import hf_generate_speed, make_prompt, run_bench  # noqa: E402
from inference.checkpoint import load_checkpoint  # noqa: E402
from inference.engine import LocalBackend  # noqa: E402
from inference.settings import SamplingParams  # noqa: E402
from inference.types import GenerationRequest, Message, RowDone, Started  # noqa: E402

CONFIGS = {
    "chatui transformers runner fp32": dict(runner="hf"),
    "chatui fast fp32": dict(runner="fast", precision="model"),
    "chatui fast bf16": dict(runner="fast", quantize="none", precision="bfloat16"),
    "chatui fast int8 (default)": dict(runner="fast", quantize="int8", precision="auto"),
    "chatui fast int4": dict(runner="fast", quantize="int4", precision="auto"),
    "chatui fast int8 compiled": dict(runner="fast", quantize="int8", precision="auto",
                                      compile="on"),
    "chatui fast int4 compiled": dict(runner="fast", quantize="int4", precision="auto",
                                      compile="on"),
}


def followup_ttft(backend: LocalBackend, turns: int, k: int = 5) -> list[tuple[int, float]]:
    """A conversation grows turn by turn; returns (prompt tokens, ttft s) per turn."""
    messages: list[Message] = []
    out = []
    backend.reset()
    for i in range(turns):
        messages.append(Message("user", f"Question {i}: " + "tell me more about rivers. " * 8))
        req = GenerationRequest(tuple(messages), (SamplingParams(temperature=0,
                                                                 max_new_tokens=48),), k)
        ev = list(backend.generate(req, threading.Event()))
        started = next(e for e in ev if isinstance(e, Started))
        done = next(e for e in ev if isinstance(e, RowDone))
        out.append((started.prompt_tokens, done.usage.ttft_s))
        messages.append(Message("assistant", done.text))
    return out


@torch.inference_mode()
def prefill_speed(backend: LocalBackend, model, tokenizer, n: int = 1000) -> tuple[float, float]:
    """(chatui prefill tokens/s, transformers forward tokens/s) on the same n tokens."""
    ids = tokenizer.encode(("The history of printing is long and varied. " * (n // 8 + 2)))[:n]
    x = torch.tensor([ids])
    best_c = best_h = 0.0
    for _ in range(2):
        backend.reset()
        t = time.perf_counter()
        backend._prefill(ids, 0, threading.Event())
        best_c = max(best_c, n / (time.perf_counter() - t))
        t = time.perf_counter()
        model(x, logits_to_keep=1)
        best_h = max(best_h, n / (time.perf_counter() - t))
    backend.reset()
    return best_c, best_h


def llamacpp_decode(llm, *, prompt_tokens: int, new_tokens: int) -> float:
    """llama.cpp's decode tokens/s: a prompt of token ids, then ``new_tokens`` steps of one
    token each through ``Llama.eval`` (the logits are computed and copied out, nothing is
    sampled), timed from the first step to the last."""
    llm.reset()
    llm.eval([(7 * i + 3) % 1000 + 300 for i in range(prompt_tokens)])
    t = time.perf_counter()
    for i in range(new_tokens):
        llm.eval([(11 * i + 5) % 1000 + 300])
    return new_tokens / (time.perf_counter() - t)


def free_weights(model) -> None:
    """Drop the fp32 transformers weights once transformers was measured (a 3B model's are
    12.8 GB); tensors the fast runner shares with them (norms, routers) stay alive through it."""
    import gc

    for p in model.parameters():
        p.data = torch.empty(0, dtype=p.dtype)
    gc.collect()


def shape_rows(a: argparse.Namespace) -> list[dict]:
    """Measure every selected shape (see the module docstring); one dict per shape."""
    import bench_llamacpp as lc
    import shapes

    from inference.checkpoint import default_model_path

    selected = [s for s in shapes.SHAPES if (not a.quick or s.quick)
                and (not a.only or s.name in a.only.split(","))]
    threads = torch.get_num_threads()
    tokenizer_dir = default_model_path()  # the default model's (converted in the user's cache)
    os.environ["CHATUI_CACHE_DIR"] = str(a.shapes_dir / "cache")  # quantized weights, reused
    rows = []
    for shape in selected:
        print(f"{shape.name} ({shape.about}), load {os.getloadavg()[0]:.2f}", flush=True)
        built = shapes.build(shape, a.shapes_dir, tokenizer_dir, threads)
        ckpt = load_checkpoint(str(built.hf_dir), device="cpu", dtype="float32")
        messages = make_prompt(ckpt.tokenizer, a.prompt_tokens)
        row = {"shape": shape.name, "about": shape.about, "params": built.params,
               "active_params": built.active_params, "load": [os.getloadavg()[0]]}
        hf = []
        for _ in range(min(a.rounds, 2)):
            hf.append(hf_generate_speed(ckpt.model, ckpt.tokenizer, messages,
                                        a.new_tokens)[0])
            print(f"  {'transformers generate fp32':32s} {hf[-1]:7.2f} tokens/s", flush=True)
        row["hf_fp32"] = max(hf)
        backends = {q: LocalBackend.from_checkpoint(ckpt, runner="fast", quantize=q,
                                                    precision="auto") for q in ("int8", "int4")}
        free_weights(ckpt.model)
        cfg = ckpt.model.config
        experts, top_k = getattr(cfg, "num_experts", 0) or 0, getattr(cfg, "num_experts_per_tok", 0)
        llms = {}
        for t, p in (built.ggufs.items() if lc.available() else ()):
            try:
                llms[t] = lc.load(p, logits_all=False, threads=threads, n_ctx=512)
            except ValueError as exc:  # e.g. Phi-3's loader wants vocabulary entries the
                # shape's placeholder one lacks: that row's llama.cpp cells stay empty
                print(f"  llama.cpp {t}: not loaded ({exc})", flush=True)
        row["gguf_bytes"] = {t: shapes.gguf_bytes_per_token(p, top_k, experts)
                             for t, p in built.ggufs.items()}
        speeds: dict[str, list[float]] = {}
        for r in range(a.rounds):
            row["load"].append(os.getloadavg()[0])
            for q, b in backends.items():
                res = run_bench(b, prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens,
                                top_logprobs=5)
                speeds.setdefault(q, []).append(res.decode_tokens_per_s)
                row[f"{q}_bytes"] = res.weight_bytes
                row[f"{q}_runner"] = res.runner
                print(f"  {'chatui ' + q + ' top-5':32s} {res.decode_tokens_per_s:7.2f} tokens/s",
                      flush=True)
            for t, llm in llms.items():
                llamacpp_decode(llm, prompt_tokens=a.prompt_tokens, new_tokens=2)  # warm-up
                v = llamacpp_decode(llm, prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens)
                speeds.setdefault(t, []).append(v)
                print(f"  {'llama.cpp ' + t:32s} {v:7.2f} tokens/s", flush=True)
        row.update({k: max(v) for k, v in speeds.items()})
        row["load"].append(os.getloadavg()[0])
        rows.append(row)
        del backends, llms, ckpt
    return rows


def shape_table(rows: list[dict], bandwidth: float) -> str:
    """The Markdown table of ``shape_rows`` (GB/s: weight bytes one decode step reads x
    tokens/s; % of the measured read bandwidth)."""
    def gbs(nbytes: float, tps: float) -> str:
        return f"{nbytes * tps / 1e9:.1f} ({100 * nbytes * tps / 1e9 / bandwidth:.0f} %)"

    def ratio(x: float | None, y: float | None) -> str:
        return f"{x / y:.2f}x" if x and y else "-"

    out = ["| shape | params (active) | transformers fp32 tok/s | chatui int8 tok/s | "
           "int8 GB/s (% of read bw) | llama.cpp Q8_0 tok/s | Q8_0 GB/s | int8 / fp32 | "
           "int8 / Q8_0 | chatui int4 tok/s | int4 GB/s (% of read bw) | llama.cpp Q4_K_M "
           "tok/s | Q4_K_M GB/s | int4 / Q4_K_M | load |",
           "|" + " --- |" * 15]
    for r in rows:
        q8, q4 = r.get("Q8_0"), r.get("Q4_K_M")
        gb = r.get("gguf_bytes", {})
        params = f"{r['params'] / 1e9:.2f}B"
        if r["active_params"] != r["params"]:
            params += f" ({r['active_params'] / 1e9:.2f}B)"
        out.append(" | ".join([
            f"| {r['shape']}", params, f"{r['hf_fp32']:.2f}", f"{r['int8']:.1f}",
            gbs(r["int8_bytes"], r["int8"]), f"{q8:.1f}" if q8 else "-",
            gbs(gb["Q8_0"], q8) if q8 else "-", ratio(r["int8"], r["hf_fp32"]),
            ratio(r["int8"], q8), f"{r['int4']:.1f}", gbs(r["int4_bytes"], r["int4"]),
            f"{q4:.1f}" if q4 else "-", gbs(gb["Q4_K_M"], q4) if q4 else "-",
            ratio(r["int4"], q4),
            f"{min(r['load']):.1f}-{max(r['load']):.1f} |"]))
    return "\n".join(out)


def main_shapes(a: argparse.Namespace) -> None:
    import shapes

    print(f"load average {os.getloadavg()}, torch threads {torch.get_num_threads()}")
    read, copy = shapes.read_bandwidth()
    print(f"measured read bandwidth {read:.1f} GB/s (sum of 1 GiB), copy {copy:.1f} GB/s "
          "(read + write)")
    rows = shape_rows(a)
    read2, _ = shapes.read_bandwidth()
    bandwidth = max(read, read2)
    print(f"\nread bandwidth {bandwidth:.1f} GB/s (best of before and after); load average at "
          f"the end {os.getloadavg()}")
    print(f"command: benchmarks/bench_decode.py {' '.join(sys.argv[1:])}\n")
    print(shape_table(rows, bandwidth))
    if a.json:
        a.json.write_text(json.dumps({"bandwidth_gb_s": bandwidth, "rows": rows}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--skip-extras", action="store_true", help="decode speeds only")
    ap.add_argument("--threads", type=int, default=0, help="torch and llama.cpp threads "
                    "(default: torch's)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--shapes", action="store_true",
                    help="real-size random-weight models against transformers and llama.cpp")
    ap.add_argument("--quick", action="store_true", help="with --shapes: the 0.5B and 1B only")
    ap.add_argument("--only", default="", help="with --shapes: these shapes (comma-separated)")
    ap.add_argument("--shapes-dir", type=Path, default=Path("/tmp/chatui-bench-ckpts"))
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    # the same threads throughout, as the peers get (the engine's tuner, inference/threads.py,
    # would time a few steps with half of them at the first reply)
    os.environ.setdefault("CHATUI_THREADS", str(torch.get_num_threads()))
    if a.shapes:
        main_shapes(a)
        return

    ckpt = load_checkpoint(None, device="cpu", dtype="float32")
    backends = {name: LocalBackend.from_checkpoint(ckpt, **kw) for name, kw in CONFIGS.items()}
    llms = {}
    if not a.no_llamacpp:
        import bench_llamacpp as lc

        if lc.available():
            path = lc.default_gguf()
            llms = {"llama.cpp Q4_1": (lc.load(path, logits_all=False, threads=torch.get_num_threads()), None),
                    "llama.cpp Q4_1 top-5": (lc.load(path, logits_all=True, threads=torch.get_num_threads()), 5)}
    messages = make_prompt(ckpt.tokenizer, a.prompt_tokens)
    speeds: dict[str, list[float]] = {}

    def add(name: str, v: float) -> None:
        speeds.setdefault(name, []).append(v)
        print(f"  {name:45s} {v:7.1f} tokens/s", flush=True)

    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}, load {os.getloadavg()[0]:.2f}", flush=True)
        add("transformers generate fp32",
            hf_generate_speed(ckpt.model, ckpt.tokenizer, messages, a.new_tokens)[0])
        for name, b in backends.items():
            for k in (5, 0):
                res = run_bench(b, prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens,
                                top_logprobs=k)
                add(f"{name}{' top-5' if k else ' no top-k'}", res.decode_tokens_per_s)
        for name, (llm, lp) in llms.items():
            lc.decode_speed(llm, prompt_tokens=a.prompt_tokens, new_tokens=4, logprobs=lp)
            add(name, lc.decode_speed(llm, prompt_tokens=a.prompt_tokens,
                                      new_tokens=a.new_tokens, logprobs=lp)["decode_tokens_per_s"])

    report: dict = {"load_avg": os.getloadavg(), "threads": torch.get_num_threads(),
                    "decode_best": {k: max(v) for k, v in speeds.items()},
                    "decode_median": {k: statistics.median(v) for k, v in speeds.items()}}
    hf = report["decode_best"]["transformers generate fp32"]
    print("\nbest of rounds (tokens/s, x transformers generate fp32):")
    for k, v in report["decode_best"].items():
        print(f"  {k:45s} {v:7.1f}  {v / hf:5.2f}x")

    if not a.skip_extras:
        from inference import quality

        report["quality"] = {}
        for name, b in backends.items():
            if getattr(b.runner, "fast", None) is not None and "compiled" not in name:
                q = quality.measure(ckpt.model, ckpt.tokenizer, b.runner)
                report["quality"][name] = {"top1_agreement": q.top1_agreement,
                                           "perplexity": q.perplexity,
                                           "perplexity_increase": q.perplexity_increase,
                                           "tokens": q.tokens}
                print(f"quality {name:35s} top-1 {q.top1_agreement:.2%}  ppl {q.perplexity:.3f} "
                      f"({q.perplexity_increase:+.2%} vs fp32 {q.reference_perplexity:.3f})")
        for name in ("chatui fast bf16", "chatui fast int8 (default)", "chatui fast int4"):
            c, h = prefill_speed(backends[name], ckpt.model, ckpt.tokenizer)
            report.setdefault("prefill_1000", {})[name] = {"chatui": c, "transformers": h}
            print(f"prefill 1000 tokens {name}: {c:.0f} tokens/s, transformers forward fp32 "
                  f"{h:.0f} tokens/s")
            ttft = followup_ttft(backends[name], 8)
            report.setdefault("followup_ttft", {})[name] = ttft
            print(f"follow-up ttft {name}: " + ", ".join(f"{n} tok: {t * 1000:.0f} ms"
                                                         for n, t in ttft))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
