"""Batch-1 decode on a CUDA GPU: achieved weight bandwidth of each decode-step variant on a
1B-parameter Llama (random weights with the default model's tokenizer, so no download is
needed; speed does not depend on the values), against the GPU's measured copy bandwidth.

Variants (all through the engine, top-5 logprobs on unless said, greedy, EOS ignored):
transformers ``generate`` bf16 (reference); the fast runner eager (no graph); eager step in a
CUDA graph; compiled step in a CUDA graph (the default on CUDA), bf16 and int8; logprobs off;
and the compiled step without the engine's pipelining. Correctness first: the compiled and
graph variants must produce the eager variant's greedy tokens.

    python benchmarks/bench_gpu.py [--new-tokens 256] [--layers 16] [--json out.json]
        [--tokenizer DIR]   (default: the converted default model)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from inference.bench import hf_generate_speed, make_prompt, run_bench  # noqa: E402
from inference.checkpoint import load_checkpoint  # noqa: E402
from inference.decode_graph import DecodeStep  # noqa: E402
from inference.engine import LocalBackend  # noqa: E402
from inference.settings import SamplingParams  # noqa: E402
from inference.types import GenerationRequest, TokenBatch  # noqa: E402


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (the practical ceiling)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).normal_()
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n = 20
    for _ in range(n):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    return 2 * a.numel() * a.element_size() * n / (start.elapsed_time(end) / 1000)


def _time_us(fn, *args, n: int = 200) -> float:
    for _ in range(5):
        fn(*args)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(10):
            fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n // 10):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / n


def int8_micro(device: torch.device) -> dict:
    """One token through the 1B model's largest shapes: bf16 against int8 weight-only (the
    compiled dequantising linear the step uses, and aten's int8 kernel where it exists)."""
    import torch.nn.functional as F

    from inference.quant import Int8Weight, int8_linear

    out = {}
    lin = torch.compile(int8_linear, fullgraph=True)
    for n, k in ((16384, 2048), (2048, 8192), (49152, 2048)):
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        x = torch.randn(1, k, device=device, dtype=torch.bfloat16)
        q = Int8Weight.quantize(w, torch.bfloat16)
        row = {"bf16": _time_us(F.linear, x, w), "int8 compiled": _time_us(lin, x, q)}
        try:
            row["int8 aten"] = _time_us(torch.ops.aten._weight_int8pack_mm, x, q.q, q.scales)
        except Exception as exc:  # noqa: BLE001
            row["int8 aten"] = f"n/a ({type(exc).__name__})"
        out[f"{n}x{k}"] = row
        mb = n * k * 2 / 1e6
        print(f"  matvec {n}x{k} ({mb:.0f} MB bf16): " + ", ".join(
            f"{key} {v:.1f} us" if isinstance(v, float) else f"{key} {v}" for key, v in row.items()),
            flush=True)
    return out


def make_checkpoint(out: Path, tokenizer_dir: Path, layers: int) -> None:
    """Llama-3.2-1B's shape (hidden 2048, 32 heads, 8 KV heads, MLP 8192, tied embeddings)
    over the default model's tokenizer: 16 layers give 1.07 B parameters."""
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=2048, intermediate_size=8192,
                      num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                      max_position_embeddings=8192, rope_theta=500000.0,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(eos_token_id=tok.eos_token_id).save_pretrained(out)
    del model
    torch.cuda.empty_cache()


def greedy_ids(backend: LocalBackend, n: int = 48) -> list[int]:
    messages = make_prompt(backend.tokenizer, 64)
    eos, backend.eos_ids = backend.eos_ids, frozenset()
    try:
        backend.reset()
        req = GenerationRequest(messages, (SamplingParams(temperature=0, max_new_tokens=n),), 5)
        ev = list(backend.generate(req, threading.Event()))
    finally:
        backend.eos_ids = eos
    return [t.id for e in ev if isinstance(e, TokenBatch) for t in e.tokens]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tokenizer", type=Path)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_gpu needs a CUDA GPU")
    dev = torch.device("cuda")
    tok_dir = a.tokenizer
    if tok_dir is None:
        from inference.checkpoint import default_model_path

        tok_dir = default_model_path()
    ceiling = copy_bandwidth(dev)
    print(f"{torch.cuda.get_device_name(dev)}; torch {torch.__version__}; "
          f"copy bandwidth {ceiling / 1e9:.0f} GB/s", flush=True)

    report_micro = int8_micro(dev)
    tmp = Path(tempfile.mkdtemp(prefix="chatui-1b-"))
    report: dict = {"device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
                    "copy_gb_s": ceiling / 1e9, "runs": {}, "int8_matvec_us": report_micro}
    try:
        make_checkpoint(tmp, tok_dir, a.layers)
        ckpt = load_checkpoint(str(tmp), device="cuda", dtype="bfloat16")
        params = sum(p.numel() for p in ckpt.model.parameters())
        print(f"model: {params / 1e9:.2f} B parameters, bf16", flush=True)
        messages = make_prompt(ckpt.tokenizer, a.prompt_tokens)
        hf_tps, _ = hf_generate_speed(ckpt.model, ckpt.tokenizer, messages, a.new_tokens)
        report["runs"]["transformers generate bf16"] = {"tokens_per_s": hf_tps}
        print(f"  {'transformers generate bf16':42s} {hf_tps:8.1f} tok/s", flush=True)

        def backend(quantize: str, compile: str, graph_eager: bool = False) -> LocalBackend:
            t = time.perf_counter()
            b = LocalBackend.from_checkpoint(ckpt, quantize=quantize, compile=compile,
                                             precision="model")
            if graph_eager:
                b.runner.decode = DecodeStep(b.runner.fast, compile=False, graphs=True)
            print(f"  (built {quantize}/{compile}{'/graph' if graph_eager else ''} in "
                  f"{time.perf_counter() - t:.1f} s)", flush=True)
            return b

        variants = {
            "fast eager bf16": (backend("none", "off"), 5, True),
            "fast eager step in CUDA graph bf16": (backend("none", "off", True), 5, True),
            "fast compiled+graph bf16": (backend("none", "auto"), 5, True),
        }
        ref = greedy_ids(variants["fast eager bf16"][0])
        for name, (b, _, _) in variants.items():
            ids = greedy_ids(b)
            same = next((i for i, (x, y) in enumerate(zip(ids, ref)) if x != y), len(ref))
            report.setdefault("same_greedy_tokens_as_eager", {})[name] = same
            # random weights give near-uniform logits, where any rounding difference flips a
            # near-tie: tests/test_cuda.py checks correctness teacher-forced, with margins
            print(f"  greedy tokens equal eager's: {name}: the first {same} of {len(ref)}",
                  flush=True)
        base = variants["fast compiled+graph bf16"][0]
        variants["fast compiled+graph bf16 no logprobs"] = (base, 0, True)
        variants["fast compiled+graph bf16 not pipelined"] = (base, 5, False)
        variants["fast compiled+graph int8"] = (backend("int8", "auto"), 5, True)
        for name, (b, k, pipe) in variants.items():
            b.pipeline = pipe
            r = run_bench(b, prompt_tokens=a.prompt_tokens, new_tokens=a.new_tokens,
                          top_logprobs=k, repeats=a.repeats)
            b.pipeline = None
            frac = r.bandwidth_gb_s * 1e9 / ceiling
            report["runs"][name] = {"tokens_per_s": r.decode_tokens_per_s,
                                    "weight_bytes": r.weight_bytes,
                                    "gb_s": r.bandwidth_gb_s, "of_copy_bandwidth": frac,
                                    "ttft_s": r.ttft_s, "runner": r.runner}
            print(f"  {name:42s} {r.decode_tokens_per_s:8.1f} tok/s  {r.bandwidth_gb_s:7.0f} GB/s"
                  f"  {frac:6.1%} of copy  ({r.weight_bytes / 1e9:.2f} GB/token)", flush=True)
        bf = report["runs"]["fast compiled+graph bf16"]["tokens_per_s"]
        i8 = report["runs"]["fast compiled+graph int8"]["tokens_per_s"]
        print(f"int8 / bf16: {i8 / bf:.2f}x; compiled bf16 / transformers: {bf / hf_tps:.2f}x")
        report["int8_over_bf16"] = i8 / bf
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
