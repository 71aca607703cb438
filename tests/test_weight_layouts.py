"""Every quantization on every weight layout: int8 and int4, with chatui's kernel and without,
on tied and untied models, read from safetensors and from GGUF.

A real Qwen2.5 GGUF with its own output layer failed ``--quantize int4`` on its first token
(the untied embedding had been made ``Int4Weight``, which an embedding lookup cannot read); the
tests had only built tied models. So each layout is built here and decoded through the engine,
and the class of each weight is checked: the embedding is looked up by rows, so it is int8
(chatui's group-wise ``Q8Weight`` where the kernel builds, else per-channel ``Int8Weight``) under
both int8 and int4; the output layer stays int8 under int4 (int4 costs it 4 points of top-1
agreement) where its rows are not a multiple of 256 wide, and is 6-bit (``Q6Weight``, a tied
embedding looked up in it) where they are; the decoder's own layers are int4 under int4. The
quantized runner must compute what the same math computes on its dequantized weights.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from inference import q8kernel
from inference.engine import LocalBackend
from inference.quant import Int4Weight, Int8Weight, Q4Weight, Q6Weight, Q8Weight
from inference.settings import SamplingParams
from inference.types import GenerationRequest, Message, TokenBatch

from conftest import skip_unless_ci

LAYOUTS = [("llama", True), ("llama", False), ("qwen2", True), ("qwen2", False)]
"""(architecture, tied embeddings): Qwen2 untied is the shape of the Qwen2.5 GGUF that crashed."""


def tiny_model(arch: str, tied: bool, vocab: int, hidden: int = 64) -> Any:
    """A tiny random model (q/k/v biases for Qwen2) with output rows of varied norms."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config_class = LlamaConfig if arch == "llama" else Qwen2Config
    cfg = config_class(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                       pad_token_id=2, tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head.normal_(0, 0.05).mul_(torch.randn(head.shape[0], 1).exp_().clamp_(max=10))
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
    return model


def save_checkpoint(model: Any, tokenizer: Any, out: Path, fmt: str) -> Path:
    """The model as a safetensors directory, or as a Q8_0 GGUF file (as llama.cpp lays it out)
    with the default model's tokenizer; returns what ``--ckpt`` names."""
    from transformers import GenerationConfig

    from inference.checkpoint import default_gguf_path
    from inference.checkpoint.gguf_write import write_model

    out.mkdir(parents=True, exist_ok=True)
    if fmt == "gguf":
        return write_model(model, out / "model.Q8_0.gguf", "Q8_0", default_gguf_path())
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(eos_token_id=2, pad_token_id=2).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> dict[Any, Any]:
    """Each (architecture, tied, format) loaded as the engine loads it, built on first use."""
    from inference.checkpoint import load_checkpoint

    root = tmp_path_factory.mktemp("layouts")
    built: dict[Any, Any] = {}

    def get(arch: str, tied: bool, fmt: str, hidden: int = 64) -> Any:
        key = (arch, tied, fmt, hidden)
        if key not in built:
            name = f"{arch}-{'tied' if tied else 'untied'}-{fmt}-{hidden}"
            spec = save_checkpoint(tiny_model(arch, tied, len(tokenizer), hidden), tokenizer,
                                   root / name, fmt)
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("CHATUI_CACHE_DIR", str(root / "cache"))
                built[key] = load_checkpoint(str(spec), device="cpu", dtype="float32",
                                             lazy=True)  # as the app loads it
        return built[key]

    return get  # type: ignore[return-value]


def dequantized(runner: Any) -> Any:
    """The runner with every quantized weight replaced by its dequantized fp32 tensor."""
    twin, fast = copy.copy(runner), copy.copy(runner.fast)

    def deq(w: Any) -> Any:
        return w.dequantize(torch.float32) if isinstance(w, (Q8Weight, Int8Weight, Q4Weight,
                                                             Q6Weight, Int4Weight)) else w

    fast.layers = [copy.copy(L) for L in fast.layers]
    for L in fast.layers:
        L.wqkv, L.wo, L.wgu, L.wd = deq(L.wqkv), deq(L.wo), deq(L.wgu), deq(L.wd)
    fast.lm_head, fast.embed = deq(fast.lm_head), deq(fast.embed)
    fast.c_attention = False
    twin.fast = fast
    return twin


@pytest.mark.parametrize("kernel", ["chatui", "torch"])
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
@pytest.mark.parametrize("arch,tied", LAYOUTS, ids=[f"{a}-{'tied' if t else 'untied'}"
                                                     for a, t in LAYOUTS])
def test_every_quantization_on_every_weight_layout(arch: str, tied: bool, fmt: str, kind: str,
                                                   kernel: str, checkpoints: Any,
                                                   tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    if kernel == "torch":
        monkeypatch.setattr(q8kernel, "load_kernel", lambda: None)
    elif q8kernel.load_kernel() is None:
        skip_unless_ci("chatui's kernels do not build on this machine")
    ckpt = checkpoints(arch, tied, fmt)
    backend = LocalBackend.from_checkpoint(ckpt, quantize=kind, precision="auto")
    fast = backend.runner.fast
    assert backend.info.quantization == kind and fast.tied == tied
    int8 = Q8Weight if kernel == "chatui" else Int8Weight
    assert isinstance(fast.lm_head, int8)
    assert isinstance(fast.embed, int8)  # looked up by rows: int8 under int4 too
    assert (fast.embed is fast.lm_head) == tied
    decoder = [w for L in fast.layers for w in (L.wqkv, L.wo, L.wgu, L.wd)]
    int4 = Q4Weight if kernel == "chatui" else Int4Weight  # chatui's q4.c, else torch's
    assert all(isinstance(w, int4 if kind == "int4" else int8) for w in decoder)

    twin = dequantized(backend.runner)
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, 24))
    ca, cb = backend.runner.new_cache(), twin.new_cache()
    a, b = backend.runner.forward(ca, ids), twin.forward(cb, ids)
    # (q8.c and q4.c quantize activations to 8 bits per group of 32, as llama.cpp does: ~0.5%
    # off their dequantized twins; test_architectures allows them the same; bf16 likewise)
    tol = 0.05
    for _ in range(3):
        assert (a - b).abs().max() <= tol * b.abs().max()
        step = b.argmax(-1, keepdim=True)
        a, b = backend.runner.forward(ca, step), twin.forward(cb, step)

    req = GenerationRequest((Message("user", "Name three rivers."),),
                            (SamplingParams(temperature=0, max_new_tokens=6),), top_logprobs=2)
    events = list(backend.generate(req, threading.Event()))
    assert sum(len(e.tokens) for e in events if isinstance(e, TokenBatch)) == 6


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
@pytest.mark.parametrize("arch,tied", LAYOUTS, ids=[f"{a}-{'tied' if t else 'untied'}"
                                                     for a, t in LAYOUTS])
def test_int4_output_layer_is_6_bit_on_every_layout(arch: str, tied: bool, fmt: str,
                                                    checkpoints: Any, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows 256 wide (whole Q6_K super-blocks): int4 with chatui's kernels holds the output
    layer 6-bit, a tied model's embedding rows read from it, an untied embedding int8, and
    computes what its dequantized weights compute, through the engine too."""
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    if q8kernel.load_kernel() is None:
        skip_unless_ci("chatui's kernels do not build on this machine")
    backend = LocalBackend.from_checkpoint(checkpoints(arch, tied, fmt, 256), quantize="int4",
                                           precision="auto")
    fast = backend.runner.fast
    assert isinstance(fast.lm_head, Q6Weight) and fast.tied == tied
    assert (fast.embed is fast.lm_head) if tied else isinstance(fast.embed, Q8Weight)
    twin = dequantized(backend.runner)
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, 24))
    ca, cb = backend.runner.new_cache(), twin.new_cache()
    a, b = backend.runner.forward(ca, ids), twin.forward(cb, ids)
    for _ in range(3):
        assert (a - b).abs().max() <= 0.05 * b.abs().max()
        step = b.argmax(-1, keepdim=True)
        a, b = backend.runner.forward(ca, step), twin.forward(cb, step)
    req = GenerationRequest((Message("user", "Name three rivers."),),
                            (SamplingParams(temperature=0, max_new_tokens=6),), top_logprobs=2)
    batches = [e for e in backend.generate(req, threading.Event()) if isinstance(e, TokenBatch)]
    assert sum(len(b.tokens) for b in batches) == 6
