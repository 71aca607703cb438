"""GGUF files read by chatui itself, a tensor (a block of rows) at a time, against transformers'
GGUF reader.

Each case writes a tiny random model as llama.cpp lays it out (``gguf_write``: q/k rows
permuted for llama, Gemma's norms stored as 1 + weight, MoE experts stacked) in one block type,
then checks: every parameter chatui loads equals the one transformers' reader loads (both
dequantize the same blocks, so exactly; the block type's rounding is the file's, not the
loader's); greedy decoding gives the same tokens as transformers' model; and loaded lazily, as
the app loads it, int8 is the GGUF's own Q8_0 blocks with no requantization (any other type is
quantized from the dequantized rows, within half an int8 step of them) and decodes as its
dequantized weights do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from inference import quant
from inference.checkpoint import default_gguf_path, load_checkpoint
from inference.checkpoint.gguf_write import write_model
from inference.fast_llama import FastRunner
from inference.quant import Q8Weight
from inference.runner import build_runner

BLOCK_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
HIDDEN = 256
"""Rows of 256 weights: whole blocks of every type (the k-quants' blocks are 256 long)."""
VOCAB = 2048
"""The default model's first 2,048 tokens (``write_model``'s ``vocab``): with all 49,152, each
case spent most of its 15-22 s in GGUF readers parsing the header's 98,000 strings."""


def _llama(tied: bool) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                       pad_token_id=2, tie_word_embeddings=tied)


def _qwen2() -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                       pad_token_id=2, tie_word_embeddings=False)


def _qwen3() -> Any:
    from transformers import Qwen3Config

    # transformers' GGUF config mapping has no head_dim for Qwen3: it is the default, 128
    return Qwen3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=128, max_position_embeddings=512, bos_token_id=1,
                       eos_token_id=2, pad_token_id=2, tie_word_embeddings=True)


def _phi3() -> Any:
    from transformers import Phi3Config

    return Phi3Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                      pad_token_id=2, tie_word_embeddings=False)


def _gemma2() -> Any:
    from transformers import Gemma2Config

    # transformers' Gemma tokenizer from a GGUF adds a <mask> token to the VOCAB it reads
    return Gemma2Config(vocab_size=VOCAB + 1, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=HIDDEN // 4, max_position_embeddings=512, bos_token_id=1,
                        eos_token_id=2, pad_token_id=2, sliding_window=16)


def _qwen3_moe() -> Any:
    from transformers import Qwen3MoeConfig

    # the GGUF config mapping has no expert width: it stays the config's default (768)
    return Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=HIDDEN // 4, num_experts=4, num_experts_per_tok=2,
                          max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                          pad_token_id=2, tie_word_embeddings=False)


def write(config: Any, qtype: str, out: Path) -> Path:
    """A random model of ``config`` as a GGUF file of ``qtype`` blocks."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.2)
            elif p.dim() >= 2:
                p.normal_(0, 0.05)
    out.mkdir(parents=True, exist_ok=True)
    return write_model(model, out / f"tiny.{qtype}.gguf", qtype, default_gguf_path(), VOCAB)


def reference(gguf: Path) -> Any:
    """transformers' own GGUF reader's model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    return model.eval()


def greedy(forward: Callable[[torch.Tensor], torch.Tensor], n: int = 12) -> list[int]:
    """n greedy tokens after a fixed prompt (full forward each step)."""
    ids = torch.tensor([[1, 5, 9, 14, 100, 2000, 7, 42]])
    out: list[int] = []
    for _ in range(n):
        nxt = int(forward(ids).argmax())
        out.append(nxt)
        ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def check_same_weights_and_tokens(gguf: Path) -> Any:
    """chatui's eager load == transformers' reader, parameter for parameter, and the same
    greedy tokens on the fast runner as transformers' model."""
    ref = reference(gguf)
    ckpt = load_checkpoint(str(gguf), device="cpu", dtype="float32")
    mine, theirs = ckpt.model.state_dict(), ref.state_dict()
    assert set(mine) == set(theirs)
    for name, t in theirs.items():
        assert torch.equal(mine[name], t), name
    fast = FastRunner(ckpt.model, dtype=torch.float32)
    with torch.inference_mode():
        want = greedy(lambda ids: ref(ids).logits[0, -1])
    got = greedy(lambda ids: fast.forward(fast.new_cache(), ids)[0])
    assert got == want
    return ckpt


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


@pytest.mark.parametrize("qtype", BLOCK_TYPES)
def test_every_block_type_loads_as_transformers_reads_it(qtype: str, cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    gguf = write(_llama(tied=qtype != "Q4_K"), qtype, cache / "model")
    eager = check_same_weights_and_tokens(gguf)

    if qtype == "Q8_0":  # the file's blocks are chatui's int8 layout: nothing is rounded
        from inference.checkpoint import memory

        # the memory check's bytes per weight, measured once per process on a sample it
        # quantizes: not a tensor of the file (run alone, this test refused it)
        memory.bytes_per_weight("int8")

        def refuse(*a: Any, **k: Any) -> Any:
            raise AssertionError("a Q8_0 tensor was requantized")

        monkeypatch.setattr(quant.Q8Weight, "round_groups", staticmethod(refuse))
    lazy = load_checkpoint(str(gguf), device="cpu", dtype="float32", lazy=True)
    assert any(p.is_meta for p in lazy.model.parameters())  # the large weights stay in the file
    runner = build_runner(lazy, quantize="int8", precision="auto")
    full = FastRunner(eager.model, dtype=torch.float32).fast
    fast = runner.fast
    pairs = [(fast.lm_head, full.lm_head), (fast.embed, full.embed)]
    for L, F in zip(fast.layers, full.layers):
        pairs += [(L.wqkv, F.wqkv), (L.wo, F.wo), (L.wgu, F.wgu), (L.wd, F.wd)]
    for q, w in pairs:
        assert isinstance(q, Q8Weight)
        got = q.dequantize(torch.float32)
        if qtype == "Q8_0":
            assert torch.equal(got, w)
        else:  # within half a step of each group of 32
            step = w.view(w.shape[0], -1, 32).abs().amax(-1, keepdim=True) / 127
            err = (got - w).view(w.shape[0], -1, 32).abs()
            assert (err <= step * 0.5 + 1e-6).all()

    # the cached start: the weights from the disk cache, not the file
    monkeypatch.setattr(quant.Q8Weight, "from_groups", classmethod(
        lambda *a, **k: pytest.fail("quantized again instead of reading the cache")))
    again = build_runner(load_checkpoint(str(gguf), device="cpu", dtype="float32", lazy=True),
                         quantize="int8", precision="auto")
    ids = torch.tensor([[1, 5, 9, 14]])
    assert torch.equal(again.forward(again.new_cache(), ids),
                       runner.forward(runner.new_cache(), ids))


@pytest.mark.parametrize("name,config", [("qwen2-untied", _qwen2), ("qwen3-tied", _qwen3),
                                         ("phi3-untied", _phi3), ("gemma2-tied", _gemma2),
                                         ("qwen3-moe-untied", _qwen3_moe)])
def test_other_architectures_load_as_transformers_reads_them(name: str, config: Any,
                                                            cache: Path) -> None:
    """Q/K/V biases, q/k norms, fused qkv and gate_up, Gemma's norms (stored as 1 + weight),
    stacked experts (gate and up merged into one gate_up_proj): the same weights as
    transformers' reader, the same greedy tokens, and int8/int4 from the file's rows decode."""
    gguf = write(config(), "Q4_K" if name.startswith("qwen2") else "Q8_0", cache / name)
    check_same_weights_and_tokens(gguf)
    lazy = load_checkpoint(str(gguf), device="cpu", dtype="float32", lazy=True)
    ids = torch.tensor([[1, 5, 9, 14, 100]])
    for kind in ("int8", "int4"):
        runner = build_runner(lazy, quantize=kind, precision="auto")
        assert runner.fast.quantized and torch.isfinite(
            runner.forward(runner.new_cache(), ids)).all()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q4_K"])
def test_int4_is_the_files_own_4bit_blocks(qtype: str, cache: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``--quantize int4`` on a 4-bit GGUF repacks the file's blocks (Q4Weight.from_gguf_blocks
    of each tensor's bytes), never dequantizes and rounds them again; the cached start maps the
    same packed weights back."""
    import gguf as gguf_pkg

    path = write(_llama(tied=False), qtype, cache / "model")
    monkeypatch.setattr(quant.Q4Weight, "round_groups", staticmethod(
        lambda *a, **k: pytest.fail("a 4-bit tensor was requantized")))
    lazy = load_checkpoint(str(path), device="cpu", dtype="float32", lazy=True)
    runner = build_runner(lazy, quantize="int4", precision="auto")
    tensors = {t.name: t for t in gguf_pkg.GGUFReader(str(path)).tensors}

    def blocks(name: str) -> quant.Q4Weight:
        t = tensors[name]
        return quant.Q4Weight.from_gguf_blocks(t.data, qtype, (int(t.shape[1]), int(t.shape[0])))

    for i, L in enumerate(runner.fast.layers):
        for got, name in ((L.wo, f"blk.{i}.attn_output.weight"),
                          (L.wd, f"blk.{i}.ffn_down.weight")):
            want = blocks(name)
            assert isinstance(got, quant.Q4Weight) and got.shape == want.shape
            assert torch.equal(got.packed, want.packed) and torch.equal(got.scales, want.scales)
        gate, up = blocks(f"blk.{i}.ffn_gate.weight"), blocks(f"blk.{i}.ffn_up.weight")
        assert torch.equal(L.wgu.packed, torch.cat([gate.packed, up.packed]))
    monkeypatch.setattr(quant.Q4Weight, "_pack_rows", staticmethod(
        lambda *a, **k: pytest.fail("repacked again instead of reading the cache")))
    again = build_runner(load_checkpoint(str(path), device="cpu", dtype="float32", lazy=True),
                         quantize="int4", precision="auto")
    for name, w in runner.fast.quantized.items():
        other = again.fast.quantized[name]
        assert torch.equal(other.packed, w.packed) and torch.equal(other.scales, w.scales), name


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_int4_output_layer_is_the_files_own_q6_k_blocks(tied: bool, cache: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--quantize int4`` keeps a Q6_K output layer (what llama.cpp's Q4_K_M writes) as its
    own blocks in ``Q6Weight`` (no rounding); a tied model looks its embedding rows up in the
    same 6-bit tensor, an untied one keeps its embedding int8; the cached start maps them back."""
    import gguf as gguf_pkg

    from conftest import skip_unless_ci
    from inference import q8kernel

    if q8kernel.load_kernel() is None:
        skip_unless_ci("chatui's kernels do not build on this machine")
    path = write(_llama(tied=tied), "Q6_K", cache / "model")
    monkeypatch.setattr(quant.Q6Weight, "round_groups", staticmethod(
        lambda *a, **k: pytest.fail("a Q6_K tensor was requantized")))
    runner = build_runner(load_checkpoint(str(path), device="cpu", dtype="float32", lazy=True),
                          quantize="int4", precision="auto")
    t = {t.name: t for t in gguf_pkg.GGUFReader(str(path)).tensors}[
        "token_embd.weight" if tied else "output.weight"]
    want = quant.Q6Weight.from_gguf_blocks(t.data, (int(t.shape[1]), int(t.shape[0])))
    head = runner.fast.lm_head
    assert isinstance(head, quant.Q6Weight) and head.shape == want.shape
    assert torch.equal(head.packed, want.packed) and torch.equal(head.scales, want.scales)
    ref = reference(path)
    ids = torch.tensor([[1, 5, 9, 14, 100, 2000, 7, 42]])
    embed = ref.get_input_embeddings().weight.detach()[ids]
    if tied:
        assert runner.fast.embed is head
        assert torch.equal(runner.fast._embed(ids), embed)  # Q6_K rows as gguf reads them
    else:
        assert isinstance(runner.fast.embed, Q8Weight)
    logits = runner.forward(runner.new_cache(), ids)
    assert torch.isfinite(logits).all()
    again = build_runner(load_checkpoint(str(path), device="cpu", dtype="float32", lazy=True),
                         quantize="int4", precision="auto")
    assert isinstance(again.fast.lm_head, quant.Q6Weight)
    assert torch.equal(again.forward(again.new_cache(), ids), logits)


def test_a_truncated_tokenizer_still_encodes_any_text(cache: Path) -> None:
    """The tests' models keep the default model's first VOCAB tokens (``truncate_tokenizer``):
    transformers reads the cut tokenizer from the file, every id it gives is below VOCAB, and
    any text (accents, CJK, an emoji) encodes and decodes back to itself through the bytes the
    cut vocabulary still has."""
    from transformers import AutoTokenizer

    from inference.checkpoint.gguf_write import tokenizer_fields, truncate_tokenizer

    gguf = write(_llama(tied=True), "Q8_0", cache / "model")
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    assert len(tok) == VOCAB
    text = "Hello, world! Ünïcödé naïveté, 日本語のテキスト, and an emoji 🙂 at 3.14."
    ids = tok.encode(text, add_special_tokens=False)
    assert ids and max(ids) < VOCAB
    assert tok.decode(ids) == text
    full = tokenizer_fields(default_gguf_path())
    with pytest.raises(ValueError, match="eos_token_id"):
        truncate_tokenizer(full, 2)
