"""Random-weight checkpoints of the shapes people run, for ``bench_decode.py --shapes``.

Speed depends on the shapes and the bytes read per token, not on the weights' values, so each
shape is built from its config with seeded random weights (rounded to fp16, so the transformers
checkpoint and the GGUF hold the same numbers) and written twice, outside the repository:

- a transformers directory (config, fp16 safetensors, the default model's tokenizer, whose ids
  are the first rows of the larger vocabularies; the output rows past it are zero, so greedy
  decoding never picks a token the tokenizer cannot write);
- a GGUF of the same tensors (the ``gguf`` package, with llama.cpp's tensor names, metadata and
  q/k row order per architecture, and a placeholder SentencePiece vocabulary of the model's
  size), quantized by llama.cpp itself (``llama_model_quantize``, as its ``llama-quantize``) to
  Q8_0 and Q4_K_M; the fp16 GGUF is deleted after.

Everything is cached in ``--shapes-dir`` (default /tmp/chatui-bench-ckpts) by shape name.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

SHAPES_DIR = Path("/tmp/chatui-bench-ckpts")
BUILD_VERSION = 1
ARCH_BUILD_VERSION = {"phi3": 2}
"""A shape whose files changed for its architecture alone is rebuilt alone: Phi-3's GGUFs
gained its special tokens (version 2; llama.cpp's loader looks up ``<|end|>`` in a Phi-3
model's vocabulary and refused the placeholder one without it)."""


def _version(shape: Shape) -> object:
    return ARCH_BUILD_VERSION.get(shape.gguf_arch, BUILD_VERSION)
"""Bump when what is written changes (cached shapes of older versions are rebuilt)."""


@dataclass(frozen=True)
class Shape:
    """One benchmark model: a transformers config and how llama.cpp names its architecture."""

    name: str
    about: str
    config: Callable[[], Any]
    gguf_arch: str
    quick: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _smollm2_135m() -> Any:
    """The default model's own shape (SmolLM2-135M-Instruct), for its row of issue 16's table:
    the shipped GGUF is Q4_1, so llama.cpp's Q8_0 and Q4_K_M of it are built like the others'."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                       num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                       vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=True)


def _llama32_1b() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                       vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=True,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192})


def _llama32_3b() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                       num_attention_heads=24, num_key_value_heads=8, head_dim=128,
                       vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0,
                       rms_norm_eps=1e-5, tie_word_embeddings=True,
                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0,
                                     "original_max_position_embeddings": 8192})


def _qwen25_05b() -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                       max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                       tie_word_embeddings=True)


def _qwen3_06b() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                       rms_norm_eps=1e-6, tie_word_embeddings=True)


def _gemma3_1b() -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                            num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                            vocab_size=262144, max_position_embeddings=32768,
                            query_pre_attn_scalar=256, sliding_window=512,
                            rope_theta=1000000.0, rope_local_base_freq=10000.0,
                            rms_norm_eps=1e-6, tie_word_embeddings=True)


def _phi3_mini_8l() -> Any:
    from transformers import Phi3Config

    return Phi3Config(hidden_size=3072, intermediate_size=8192, num_hidden_layers=8,
                      num_attention_heads=32, num_key_value_heads=32, vocab_size=32064,
                      max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
                      sliding_window=2047, tie_word_embeddings=False)


def _mistral_7b_4l() -> Any:
    from transformers import MistralConfig

    return MistralConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         vocab_size=32768, max_position_embeddings=32768, rope_theta=1000000.0,
                         rms_norm_eps=1e-5, sliding_window=4096, tie_word_embeddings=False)


def _qwen3_moe_small() -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_experts=32, num_experts_per_tok=8, num_hidden_layers=6,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          vocab_size=151936, max_position_embeddings=40960,
                          rope_theta=1000000.0, rms_norm_eps=1e-6, norm_topk_prob=True,
                          tie_word_embeddings=False)


SHAPES: tuple[Shape, ...] = (
    Shape("smollm2-135m", "SmolLM2-135M (the default model's shape)", _smollm2_135m, "llama",
          quick=True),
    Shape("qwen2.5-0.5b", "Qwen2.5-0.5B", _qwen25_05b, "qwen2", quick=True),
    Shape("llama3.2-1b", "Llama-3.2-1B", _llama32_1b, "llama", quick=True),
    Shape("llama3.2-3b", "Llama-3.2-3B", _llama32_3b, "llama"),
    Shape("qwen3-0.6b", "Qwen3-0.6B", _qwen3_06b, "qwen3"),
    Shape("gemma3-1b", "Gemma-3-1B (text)", _gemma3_1b, "gemma3"),
    Shape("phi3-mini-8l", "Phi-3-mini layers, 8 of its 32", _phi3_mini_8l, "phi3"),
    Shape("mistral-7b-4l", "Mistral-7B-v0.3 layers, 4 of its 32, window 4096", _mistral_7b_4l,
          "llama"),
    Shape("qwen3-moe-small", "Qwen3-30B-A3B layers (32 of 128 experts, top 8), 6 of 48",
          _qwen3_moe_small, "qwen3moe"),
)


@dataclass(frozen=True)
class Built:
    """A shape on disk: the transformers directory and the GGUFs by llama.cpp type name."""

    shape: Shape
    hf_dir: Path
    ggufs: dict[str, Path]
    params: int
    active_params: int


def _fill(model: Any, seed: int, vocab_keep: int) -> None:
    """Seeded N(0, 0.02) weights in fp16, norms at their identity, output rows past the
    tokenizer's ``vocab_keep`` ids zeroed."""
    gen = torch.Generator().manual_seed(seed)
    gemma = "gemma" in model.config.model_type
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                if "norm" in name:
                    p.fill_(0.0 if gemma else 1.0)  # Gemma's norms scale by 1 + weight
                else:
                    p.zero_()  # biases
                continue
            flat = p.view(-1)
            for i in range(0, flat.numel(), 1 << 26):  # fp32 temporaries of 256 MB at most
                part = flat[i:i + (1 << 26)]
                part.copy_(torch.randn(part.numel(), generator=gen) * 0.02)
        model.lm_head.weight[vocab_keep:] = 0


def _truncate_tokenizer(directory: Path, size: int) -> None:
    """Keep the first ``size`` ids of a saved BPE tokenizer (and the merges among them), for a
    shape whose vocabulary is smaller than the default model's (Phi-3's 32064, Mistral's
    32768): its special tokens are its first ids, so the chat template still works."""
    path = directory / "tokenizer.json"
    data = json.loads(path.read_text())
    vocab = {t: i for t, i in data["model"]["vocab"].items() if i < size}
    merges = []
    for m in data["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
    data["model"]["vocab"], data["model"]["merges"] = vocab, merges
    data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["id"] < size]
    path.write_text(json.dumps(data))


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for the "llama" architecture (convert_hf_to_gguf's permute):
    RoPE pairs interleaved instead of transformers' two halves."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def _gguf_tensors(model: Any, arch: str) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, array) of every weight, in llama.cpp's names and layouts."""
    import gguf

    cfg = model.config
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.TensorNameMap(arch_id, cfg.num_hidden_layers)
    H, KV = cfg.num_attention_heads, cfg.num_key_value_heads
    gemma = "gemma" in cfg.model_type
    out: list[tuple[str, np.ndarray]] = []
    tied = getattr(cfg, "tie_word_embeddings", False)
    for name, p in model.named_parameters():
        if tied and name == "lm_head.weight":
            continue
        a = p.detach().numpy()
        if p.dim() == 1:
            a = a.astype(np.float32) + (1.0 if gemma and "norm" in name else 0.0)
        if name.endswith("experts.gate_up_proj"):  # [E, 2I, h] -> gate and up [E, I, h]
            layer = name.split(".")[2]
            inter = a.shape[1] // 2
            out.append((f"blk.{layer}.ffn_gate_exps.weight", a[:, :inter]))
            out.append((f"blk.{layer}.ffn_up_exps.weight", a[:, inter:]))
            continue
        if name.endswith("experts.down_proj"):
            out.append((f"blk.{name.split('.')[2]}.ffn_down_exps.weight", a))
            continue
        base, suffix = name.rsplit(".", 1)
        mapped = names.get_name(base)
        if mapped is None:
            raise ValueError(f"no GGUF name for {name} ({arch})")
        if arch == "llama" and base.endswith("q_proj"):
            a = _permute(a, H)
        elif arch == "llama" and base.endswith("k_proj"):
            a = _permute(a, KV)
        out.append((f"{mapped}.{suffix}", np.ascontiguousarray(a)))
    return out


def _write_gguf(model: Any, arch: str, path: Path) -> None:
    """An fp16 GGUF (fp32 norms and biases) of ``model``'s weights, with the metadata
    llama.cpp's loader reads for ``arch`` and a placeholder vocabulary of the model's size."""
    import gguf

    cfg = model.config
    D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"chatui-bench-{cfg.model_type}")
    w.add_context_length(min(cfg.max_position_embeddings, 32768))
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(D)
    w.add_value_length(D)
    w.add_rope_dimension_count(D)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    theta = getattr(cfg, "rope_theta", None) or (cfg.rope_parameters or {}).get("rope_theta", 1e4)
    if isinstance(getattr(cfg, "rope_parameters", None), dict):
        params = cfg.rope_parameters
        theta = (params.get("full_attention") or params).get("rope_theta", theta)
    w.add_rope_freq_base(float(theta))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if getattr(cfg, "sliding_window", None) and arch in ("gemma3", "phi3"):
        w.add_sliding_window(cfg.sliding_window)
    if arch == "qwen3moe":
        w.add_expert_count(cfg.num_experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    n = cfg.vocab_size
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581t{i}" for i in range(n - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (n - 259)
    if arch == "phi3":  # its special tokens where Phi-3's vocabulary has them
        for i, t in enumerate(["<|endoftext|>", "<|assistant|>", "<|placeholder1|>",
                               "<|placeholder2|>", "<|placeholder3|>", "<|placeholder4|>",
                               "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>",
                               "<|user|>"], start=32000):
            if i < n:
                tokens[i], types[i] = t, gguf.TokenType.CONTROL
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    for name, a in _gguf_tensors(model, arch):
        if a.ndim > 1:
            a = a.astype(np.float16)
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def quantize_gguf(src: Path, dst: Path, ftype: int, threads: int) -> None:
    """llama.cpp's own quantizer (what ``llama-quantize`` runs) from ``src`` into ``dst``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    tmp = dst.with_suffix(".tmp")
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize failed ({rc}) on {src}")
    tmp.replace(dst)


GGUF_TYPES = {"Q8_0": 7, "Q4_K_M": 15}
"""llama.cpp's file types (``LLAMA_FTYPE_MOSTLY_*``) the table compares against."""


def build(shape: Shape, root: Path, tokenizer_dir: Path, threads: int,
          log: Callable[[str], None] = print) -> Built:
    """The shape's transformers directory and GGUFs, built once into ``root / shape.name``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = root / shape.name
    hf_dir = out / "hf"
    ggufs = {t: out / f"{shape.name}.{t}.gguf" for t in GGUF_TYPES}
    stamp = out / "built.json"
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        if info.get("version") == _version(shape) and all(p.is_file() for p in ggufs.values()):
            return Built(shape, hf_dir, ggufs, info["params"], info["active_params"])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.perf_counter()
    cfg = shape.config()
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = 1, 2, 2
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16)
    model.to_empty(device="cpu")
    model.tie_weights()  # to_empty gives tied parameters storages of their own
    _fill(model, seed=sum(map(ord, shape.name)), vocab_keep=min(len(tok), cfg.vocab_size))
    params = sum(p.numel() for p in model.parameters())
    active = params
    if getattr(cfg, "num_experts", None):
        experts = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
        active = params - experts + experts * cfg.num_experts_per_tok // cfg.num_experts
    model.save_pretrained(hf_dir)
    tok.save_pretrained(hf_dir)
    if len(tok) > cfg.vocab_size:
        _truncate_tokenizer(hf_dir, cfg.vocab_size)
    GenerationConfig(eos_token_id=2, pad_token_id=2, bos_token_id=1).save_pretrained(hf_dir)
    log(f"  {shape.name}: {params / 1e9:.2f}B parameters written ({time.perf_counter() - t0:.0f} s)")
    f16 = out / f"{shape.name}.F16.gguf"
    _write_gguf(model, shape.gguf_arch, f16)
    del model
    for t, ftype in GGUF_TYPES.items():
        quantize_gguf(f16, ggufs[t], ftype, threads)
    f16.unlink()
    log(f"  {shape.name}: GGUFs {', '.join(GGUF_TYPES)} ({time.perf_counter() - t0:.0f} s)")
    stamp.write_text(json.dumps({"version": _version(shape), "params": params,
                                 "active_params": active}))
    return Built(shape, hf_dir, ggufs, params, active)


def gguf_bytes_per_token(path: Path, top_k: int = 0, experts: int = 0) -> int:
    """Bytes of a GGUF's tensors that one decode step reads: every tensor but the token
    embedding (read a row at a time) unless it doubles as the output layer, and of the experts'
    tensors top_k / experts."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    names = {t.name for t in reader.tensors}
    total = 0
    for t in reader.tensors:
        n = int(t.n_bytes)
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue
        if "_exps." in t.name and experts:
            n = n * top_k // experts
        total += n
    return total


def read_bandwidth(seconds: float = 3.0) -> tuple[float, float]:
    """(read GB/s, copy GB/s read + written) of this machine with torch's threads: the best
    of repeated sums and copies of a 1 GiB buffer (far larger than the caches)."""
    a = torch.ones(1 << 28)
    b = torch.zeros_like(a)  # touched: no page faults in the timed copies
    best_read = best_copy = 0.0
    end = time.perf_counter() + seconds
    rounds = 0
    while time.perf_counter() < end or rounds < 5:
        rounds += 1
        t = time.perf_counter()
        a.sum()
        best_read = max(best_read, a.numel() * 4 / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        b.copy_(a)
        best_copy = max(best_copy, 2 * a.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return best_read, best_copy
