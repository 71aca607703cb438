"""Write random-weight GGUF files of real models' shapes for the load and speed benchmarks.

    python benchmarks/make_checkpoints.py --out /tmp/ckpts [--shape llama-3.2-1b] [--types Q8_0 Q4_K_M]

Keep them out of the repository (a 1B model is 1.3 GB in Q8_0, 0.8 GB in Q4_K_M). Weights are
random (normal, std 0.02; norms near 1): speed and memory depend on shapes and block types, not
on values. The tokenizer is the default model's (SmolLM2's 49k-token BPE, the only one here
without a download); the vocabulary size, and so the embedding, is the real model's.

Q4_K_M follows llama.cpp's mix: Q4_K, with Q6_K for the embedding (tied, it is the output
layer too) and for attn_v and ffn_down in the layers llama.cpp gives more bits (the first and
last eighth and every third in between). Tensors are written a block of rows at a time
(``gguf_write``), so a file of any size is written in a few hundred MB.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inference.checkpoint import default_gguf_path  # noqa: E402
from inference.checkpoint.gguf_write import tokenizer_fields, write_gguf  # noqa: E402


@dataclass(frozen=True)
class Shape:
    hidden: int
    inter: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    context: int = 131072
    rope_theta: float = 500000.0


SHAPES = {
    # meta-llama/Llama-3.2-1B(-Instruct): tied embeddings
    "llama-3.2-1b": Shape(hidden=2048, inter=8192, layers=16, heads=32, kv_heads=8, vocab=128256),
    # meta-llama/Llama-3.2-3B
    "llama-3.2-3b": Shape(hidden=3072, inter=8192, layers=28, heads=24, kv_heads=8, vocab=128256),
}


def _more_bits(layer: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits``: the layers Q4_K_M gives Q6_K attn_v and ffn_down."""
    return layer < n // 8 or layer >= 7 * n // 8 or (layer - n // 8) % 3 == 2


def block_type(kind: str, name: str, layer: int | None, n_layers: int) -> str:
    if kind != "Q4_K_M":
        return kind
    if name == "token_embd.weight":
        return "Q6_K"
    if layer is not None and name.endswith(("attn_v.weight", "ffn_down.weight")) \
            and _more_bits(layer, n_layers):
        return "Q6_K"
    return "Q4_K"


def tensors(shape: Shape, kind: str, seed: int = 0):
    """(name, numpy shape, block type, rows) of a tied llama-architecture model."""
    s = shape
    d = s.hidden // s.heads

    def normal(r0: int, r1: int, k: int, i: int) -> np.ndarray:
        rng = np.random.default_rng([seed, i, r0])
        return rng.standard_normal((r1 - r0, k), dtype=np.float32) * 0.02

    def norm(i: int):
        def rows(r0: int, r1: int) -> np.ndarray:
            rng = np.random.default_rng([seed, i])
            return 1.0 + 0.1 * rng.standard_normal((s.hidden,), dtype=np.float32)
        return rows

    out = []
    idx = 0

    def add(name: str, dims: tuple[int, ...], layer: int | None = None) -> None:
        nonlocal idx
        idx += 1
        if len(dims) == 1:
            out.append((name, dims, "F32", norm(idx)))
        else:
            out.append((name, dims, block_type(kind, name, layer, s.layers),
                        lambda r0, r1, k=dims[1], i=idx: normal(r0, r1, k, i)))

    add("token_embd.weight", (s.vocab, s.hidden))
    for i in range(s.layers):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (s.hidden,))
        add(b + "attn_q.weight", (s.heads * d, s.hidden), i)
        add(b + "attn_k.weight", (s.kv_heads * d, s.hidden), i)
        add(b + "attn_v.weight", (s.kv_heads * d, s.hidden), i)
        add(b + "attn_output.weight", (s.hidden, s.heads * d), i)
        add(b + "ffn_norm.weight", (s.hidden,))
        add(b + "ffn_gate.weight", (s.inter, s.hidden), i)
        add(b + "ffn_up.weight", (s.inter, s.hidden), i)
        add(b + "ffn_down.weight", (s.hidden, s.inter), i)
    add("output_norm.weight", (s.hidden,))
    return out


def metadata(shape: Shape, name: str) -> dict[str, object]:
    s = shape
    return {"general.name": name, "llama.context_length": s.context,
            "llama.embedding_length": s.hidden, "llama.block_count": s.layers,
            "llama.feed_forward_length": s.inter, "llama.attention.head_count": s.heads,
            "llama.attention.head_count_kv": s.kv_heads,
            "llama.rope.dimension_count": s.hidden // s.heads,
            "llama.rope.freq_base": s.rope_theta,
            "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": s.vocab}


def make(out: Path, shape_name: str, kind: str) -> Path:
    path = out / f"{shape_name}-random.{kind}.gguf"
    if path.is_file():
        return path
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    shape = SHAPES[shape_name]
    write_gguf(tmp, "llama", metadata(shape, f"{shape_name} random"),
               tokenizer_fields(default_gguf_path()), tensors(shape, kind))
    tmp.replace(path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/ckpts"))
    ap.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--types", nargs="+", default=["Q8_0", "Q4_K_M"])
    args = ap.parse_args()
    for kind in args.types:
        t0 = time.perf_counter()
        path = make(args.out, args.shape, kind)
        print(f"{path} {path.stat().st_size / 1e9:.2f} GB ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
