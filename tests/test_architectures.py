"""Every architecture on the fast runner against transformers' own forward.

Each case builds a tiny random model from the transformers config class (tied and untied
embeddings where the architecture allows; sliding windows shorter than the prompt), saves it
with the default model's tokenizer and loads it as the engine does (``load_checkpoint``, then
``build_runner``). The fp32 fast runner must give transformers' full-forward log-probabilities
within 1e-4 at every position of a prompt read in chunks and of 45 greedy tokens (and the same
greedy tokens), through each of its decode paths (chatui's C attention, torch's attention, the
fixed-shape step the compiled decode uses), and a left-padded batch's logits. int8 and int4
must compute what fp32 computes on their dequantized weights, and int8 must keep >= 97 % top-1
agreement with fp32 on ``inference.quality``'s text (where fp32 is not a near-tie). Then
LongRoPE across its switch, and int8 on transformers' modules for an architecture the fast
runner does not know.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from inference import quality
from inference.decode_graph import DecodeStep
from inference.engine import LocalBackend
from inference.fast_blocks import decoder
from inference.fast_llama import FastRunner, unsupported_reason
from inference.quant import Int4Weight, Int8Weight, Q4Weight, Q6Weight, Q8Weight
from inference.runner import HFRunner, build_runner
from inference.settings import SamplingParams
from inference.types import GenerationRequest, Message, TokenBatch

PROMPT = 70
"""Prompt tokens: longer than every test window (16 to 24)."""
NEW = 45
"""Greedy tokens decoded after the prompt."""
CHUNKS = (30, 25)
"""The prompt is read in chunks of these sizes, then the rest (as the engine's prefill does)."""
ATOL = 1e-4
DECIDED = 0.1
"""int8 agreement counts positions whose fp32 top two log-probabilities differ by more."""


@dataclass
class Case:
    """One tiny model: its config class and keyword arguments."""

    name: str
    config: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


def _small(**kw: Any) -> dict[str, Any]:
    base = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    base.update(kw)
    return base


def _llama(**kw: Any) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**_small(**kw))


def _qwen3(**kw: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**_small(head_dim=16, **kw))


def _mistral(**kw: Any) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**_small(**kw))


def _qwen2(**kw: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**_small(**kw))


def _gemma2(**kw: Any) -> Any:
    from transformers import Gemma2Config

    return Gemma2Config(**_small(head_dim=16, query_pre_attn_scalar=24, **kw))


def _gemma3(**kw: Any) -> Any:
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(**_small(head_dim=16, query_pre_attn_scalar=24, **kw))


def _gemma3_multimodal(*, vocab_size: int, bos_token_id: int, eos_token_id: int,
                       pad_token_id: int, **kw: Any) -> Any:
    """Gemma 3 4B and up: a (tiny) vision tower, then the text decoder the fast runner runs."""
    from transformers import Gemma3Config, SiglipVisionConfig

    text = _gemma3(vocab_size=vocab_size, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
                   pad_token_id=pad_token_id, **kw)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                num_attention_heads=2, image_size=32, patch_size=8)
    return Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                        mm_tokens_per_image=4, bos_token_id=bos_token_id,
                        eos_token_id=eos_token_id, pad_token_id=pad_token_id)


def _phi3(**kw: Any) -> Any:
    from transformers import Phi3Config

    return Phi3Config(**_small(**kw))


def _longrope(rotated_pairs: int, original: int, **kw: Any) -> dict[str, Any]:
    """LongRoPE parameters (Phi-3 128k, Phi-4-mini) with distinct short and long factors."""
    return dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=original,
                short_factor=[1.0 + 0.1 * i for i in range(rotated_pairs)],
                long_factor=[2.0 + 0.5 * i for i in range(rotated_pairs)], **kw)


def _mixtral(**kw: Any) -> Any:
    from transformers import MixtralConfig

    return MixtralConfig(**_small(intermediate_size=64, num_local_experts=4,
                                  num_experts_per_tok=2, **kw))


def _qwen3_moe(**kw: Any) -> Any:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(**_small(head_dim=16, moe_intermediate_size=32, num_experts=8,
                                   num_experts_per_tok=2, **kw))


CASES = [
    # Llama 3.x's RoPE scaling (the tied Llama is tests/test_fast_path.py's)
    Case("llama3-untied", _llama, dict(tie_word_embeddings=False, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
        high_freq_factor=4.0, original_max_position_embeddings=64))),
    Case("qwen3-tied", _qwen3, dict(tie_word_embeddings=True)),
    Case("qwen3-untied", _qwen3, dict(tie_word_embeddings=False)),
    # every layer windowed
    Case("mistral-window", _mistral, dict(sliding_window=16, tie_word_embeddings=False)),
    # layer 0 full, layer 1 windowed (max_window_layers); q/k/v biases
    Case("qwen2-window", _qwen2, dict(use_sliding_window=True, sliding_window=20,
                                      max_window_layers=1, tie_word_embeddings=True)),
    # sliding and global layers alternating; attention and final soft-capping (caps small
    # enough for a random model's scores and logits to reach)
    Case("gemma2-tied", _gemma2, dict(sliding_window=16, tie_word_embeddings=True,
                                      attn_logit_softcapping=0.5,
                                      final_logit_softcapping=20.0)),
    # 2 local layers with their own RoPE base, then a global one; q/k norms
    Case("gemma3-tied", _gemma3, dict(
        num_hidden_layers=3, sliding_window=16, tie_word_embeddings=True,
        rope_local_base_freq=100.0,
        layer_types=["sliding_attention"] * 2 + ["full_attention"])),
    Case("gemma3-untied", _gemma3, dict(
        sliding_window=24, tie_word_embeddings=False, final_logit_softcapping=20.0,
        layer_types=["full_attention", "sliding_attention"])),
    # the multimodal checkpoints' text decoder (its final soft-capping is not applied there)
    Case("gemma3-multimodal-tied", _gemma3_multimodal, dict(
        sliding_window=16, tie_word_embeddings=True, final_logit_softcapping=20.0,
        layer_types=["sliding_attention", "full_attention"])),
    # fused qkv_proj and gate_up_proj, half the head rotated, a window (Phi-3-mini-4k has one)
    Case("phi3-untied", _phi3, dict(tie_word_embeddings=False, sliding_window=20,
                                    rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                         partial_rotary_factor=0.5))),
    # Phi-4-mini's shape: tied, 3/4 of the head rotated, LongRoPE (short factors up to 256)
    Case("phi4-mini-tied", _phi3, dict(
        tie_word_embeddings=True, original_max_position_embeddings=256,
        rope_parameters=_longrope(6, 256, partial_rotary_factor=0.75))),
    # 4 experts, 2 per token, weights renormalised over the chosen two
    Case("mixtral-untied", _mixtral, dict(tie_word_embeddings=False)),
    # 8 experts, 2 per token; layer 0 dense (mlp_only_layers); q/k norms
    Case("qwen3-moe-tied", _qwen3_moe, dict(tie_word_embeddings=True, norm_topk_prob=False,
                                            mlp_only_layers=[0])),
    Case("qwen3-moe-untied", _qwen3_moe, dict(tie_word_embeddings=False, norm_topk_prob=True,
                                              num_hidden_layers=3, sliding_window=None)),
]


# ---- building ----


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


_built: dict[str, Any] = {}


def checkpoint(case: Case, tokenizer: Any, root: Path) -> Any:
    """The case's model saved and loaded as the engine loads a checkpoint (once per module)."""
    if case.name in _built:
        return _built[case.name]
    from transformers import AutoModelForCausalLM, GenerationConfig

    from inference.checkpoint import load_checkpoint

    cfg = case.config(vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2, pad_token_id=2,
                      **case.kwargs)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        # a random model's logits are nearly uniform; a trained model's are heavy-tailed
        # (Zipf): output rows of varied norms
        head = model.get_output_embeddings().weight
        head.normal_(0, 0.03).mul_(torch.randn(head.shape[0], 1).mul_(1.2).exp_().clamp_(max=20))
        for name, p in model.named_parameters():  # norms start at 1 (Gemma's at 0): vary them
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            if name.endswith("mlp.gate.weight"):  # a trained router is decisive
                p.normal_(0, 0.5)
    out = root / case.name
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig(eos_token_id=2, pad_token_id=2).save_pretrained(out)
    ckpt = load_checkpoint(str(out), device="cpu", dtype="float32")
    _built[case.name] = ckpt
    return ckpt


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("archs")


# ---- checks ----


def vocab(ckpt: Any) -> int:
    return ckpt.model.config.get_text_config().vocab_size


def _decode_paths(runner: FastRunner) -> dict[str, Callable[[Any, torch.Tensor], torch.Tensor]]:
    """The one-token forwards a reply may go through (each must be exact)."""
    fast = runner.fast
    paths: dict[str, Callable[[Any, torch.Tensor], torch.Tensor]] = {}

    def with_c(on: bool) -> Callable[[Any, torch.Tensor], torch.Tensor]:
        def run(cache: Any, ids: torch.Tensor) -> torch.Tensor:
            saved, fast.c_attention = fast.c_attention, on and fast.c_attention
            try:
                return fast.forward(cache, ids)
            finally:
                fast.c_attention = saved
        return run

    if fast.c_attention:
        paths["C attention"] = with_c(True)
    paths["torch attention"] = with_c(False)
    if not fast.has_experts:
        paths["fixed-shape step"] = DecodeStep(fast, compile=False, graphs=False)
    return paths


def _greedy(runner: FastRunner, decode: Callable[[Any, torch.Tensor], torch.Tensor],
            prompt: torch.Tensor) -> tuple[list[int], list[torch.Tensor]]:
    """Prompt in chunks, then NEW greedy tokens: (tokens, the logits of every step)."""
    cache = runner.new_cache()
    logits: list[torch.Tensor] = []
    pos = 0
    for n in (*CHUNKS, prompt.shape[1]):
        chunk = prompt[:, pos:min(pos + n, prompt.shape[1])]
        if chunk.shape[1]:
            logits.append(runner.fast.forward(cache, chunk)[0])
        pos += chunk.shape[1]
    tokens: list[int] = []
    for _ in range(NEW):
        tokens.append(int(logits[-1].argmax()))
        logits.append(decode(cache, torch.tensor([[tokens[-1]]]))[0])
    return tokens, logits


def check_exact(ckpt: Any) -> None:
    """fp32 fast runner == transformers' full forward (log-probabilities within ATOL, same
    greedy tokens) over a chunked prompt and NEW decoded tokens, on every decode path."""
    runner = build_runner(ckpt, runner="fast", quantize="none", precision="model")
    assert isinstance(runner, FastRunner) and runner.fast.dtype == torch.float32
    torch.manual_seed(1)
    prompt = torch.randint(3, vocab(ckpt), (1, PROMPT))
    ends = [min(sum(CHUNKS[:i + 1]), PROMPT) for i in range(len(CHUNKS))] + [PROMPT]
    for name, decode in _decode_paths(runner).items():
        tokens, logits = _greedy(runner, decode, prompt)
        seq = torch.cat([prompt, torch.tensor([tokens])], dim=1)
        with torch.inference_mode():
            ref = torch.log_softmax(ckpt.model(seq).logits[0].float(), dim=-1)  # [T, V]
        positions = [e - 1 for e in ends] + list(range(PROMPT, PROMPT + NEW))
        assert len(positions) == len(logits)
        for p, lg in zip(positions, logits):
            got = torch.log_softmax(lg.float(), dim=-1)
            err = (got - ref[p]).abs().max().item()
            assert err < ATOL, f"{name}: position {p} differs by {err:.2e}"
        assert tokens == ref[PROMPT - 1:-1].argmax(-1).tolist(), name


def check_padded_batch(ckpt: Any) -> None:
    """A left-padded batch (attention mask and position ids) and three decode steps: the same
    logits as the transformers runner given the same masks."""
    hf, fast = HFRunner(ckpt.model), build_runner(ckpt, runner="fast", precision="model")
    torch.manual_seed(2)
    x = torch.randint(3, vocab(ckpt), (3, 40))
    mask = torch.ones_like(x)
    mask[1, :7] = 0
    mask[2, :30] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ch, cf = hf.new_cache(), fast.new_cache()
    a = hf.forward(ch, x, attention_mask=mask, position_ids=pos)
    b = fast.forward(cf, x, attention_mask=mask, position_ids=pos)
    assert (a - b).abs().max() < ATOL
    nxt = pos[:, -1:] + 1
    for _ in range(3):
        step = a.argmax(-1)[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
        a = hf.forward(ch, step, attention_mask=mask, position_ids=nxt)
        b = fast.forward(cf, step, attention_mask=mask, position_ids=nxt)
        assert (a - b).abs().max() < ATOL
        nxt = nxt + 1


def dequantized_twin(runner: FastRunner) -> FastRunner:
    """The same runner with every quantized weight (experts' too) replaced by its dequantized
    tensor: the quantized model's exact math on full-precision weights."""
    twin, fast = copy.copy(runner), copy.copy(runner.fast)

    def deq(w: Any) -> Any:
        quantized = isinstance(w, (Q8Weight, Int8Weight, Int4Weight, Q4Weight, Q6Weight))
        return w.dequantize(torch.float32) if quantized else w

    fast.layers = [copy.copy(L) for L in fast.layers]
    for L in fast.layers:
        L.wqkv, L.wo, L.wgu, L.wd = deq(L.wqkv), deq(L.wo), deq(L.wgu), deq(L.wd)
        if L.moe is not None:
            L.moe = copy.copy(L.moe)
            L.moe.experts = [(deq(a), deq(b)) for a, b in L.moe.experts]
    fast.lm_head, fast.embed = deq(fast.lm_head), deq(fast.embed)
    fast.c_attention = False
    twin.fast = fast
    return twin


def check_quantized(ckpt: Any, kind: str) -> FastRunner:
    """int8 (chatui's kernel where it builds, else torch's per-channel one) or int4: the
    logits of the same math on the dequantized weights over a prompt and 4 decode steps (so
    each architecture's quantized path computes what its fp32 path does)."""
    runner = build_runner(ckpt, runner="fast", quantize=kind, precision="auto")
    assert runner.fast.quantize == kind and runner.fast.quantized
    if kind == "int4":  # chatui's int4 kernel where it builds, else torch's
        assert any(isinstance(w, (Int4Weight, Q4Weight)) for w in runner.fast.quantized.values())
    twin = dequantized_twin(runner)
    torch.manual_seed(3)
    prompt = torch.randint(3, vocab(ckpt), (1, 40))
    ca, cb = runner.new_cache(), twin.new_cache()
    a, b = runner.forward(ca, prompt), twin.forward(cb, prompt)
    for _ in range(4):
        # bf16 activations (torch's kernels) or chatui's kernels' 8-bit ones (int8 and int4
        # weights alike): a few bf16 ulps, 0.6-2.3 % of the largest logit here
        tol = 0.05
        assert (a - b).abs().max() <= tol * b.abs().max(), (a - b).abs().max()
        step = b.argmax(-1, keepdim=True)
        a, b = runner.forward(ca, step), twin.forward(cb, step)
    if runner.fast.q8:  # the decode steps ran each layer's chosen experts in one kernel call
        assert all(L.moe.kernel_experts[1] is not None for L in runner.fast.layers
                   if L.moe is not None)
        if ckpt.model.config.model_type in ("qwen3", "qwen3_moe", "mixtral", "mistral",
                                            "qwen2", "gemma3", "gemma3_text"):
            # ... inside the one C call for every layer (decode.c), not a Python loop
            assert runner.fast._c_layers() is not None
            check_c_step_batch(ckpt, runner)
    return runner


def check_c_step_batch(ckpt: Any, runner: FastRunner) -> None:
    """A left-padded batch's decode steps in decode.c's one call (q/k norms, every row's own
    experts) give what the per-layer Python loop gives on the same quantized weights."""
    fast = runner.fast
    torch.manual_seed(4)
    x = torch.randint(3, vocab(ckpt), (3, 20))
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [fast.new_cache(), fast.new_cache()]
    outs = [fast.forward(c, x, attention_mask=mask, position_ids=pos) for c in caches]
    for _ in range(3):
        step = outs[0].argmax(-1, keepdim=True)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
        pos = pos[:, -1:] + 1
        outs[0] = fast.forward(caches[0], step, attention_mask=mask, position_ids=pos)
        fast._c_layers = lambda: None  # the Python loop over the layers
        try:
            outs[1] = fast.forward(caches[1], step, attention_mask=mask, position_ids=pos)
        finally:
            del fast._c_layers
        assert (outs[0] - outs[1]).abs().max() <= 1e-4 * outs[1].abs().max()


def check_int8(ckpt: Any) -> float:
    """int8 computes what fp32 does on its weights (``check_quantized``) and keeps >= 97 %
    top-1 agreement with the fp32 model."""
    runner = check_quantized(ckpt, "int8")
    return int8_agreement(ckpt, lambda ids: runner.fast.forward(runner.new_cache(), ids,
                                                               all_logits=True)[0])


def int8_agreement(ckpt: Any, all_logits: Callable[[torch.Tensor], torch.Tensor]) -> float:
    """Top-1 agreement with the fp32 model, teacher-forced on ``inference.quality``'s text, over
    the positions where fp32 has a choice: its top two log-probabilities more than
    DECIDED apart. A random model's top two are often a near-tie (10 % of positions or less
    here) that any rounding flips, which says nothing about int8; a trained model's rarely
    are (the default model's agreement over every position is tested in test_quant)."""
    ids = torch.tensor(ckpt.tokenizer.encode(quality.SAMPLE_TEXT))
    with torch.inference_mode():
        ref = torch.log_softmax(ckpt.model(ids[None]).logits[0].float(), dim=-1)
        got = all_logits(ids[None])
    top2 = ref.topk(2, dim=-1).values
    decided = top2[:, 0] - top2[:, 1] > DECIDED
    agree = (ref.argmax(-1) == got.argmax(-1))[decided].float().mean().item()
    assert decided.float().mean() >= 0.8 and agree >= 0.97, (decided.float().mean(), agree)
    return agree


def check_engine(ckpt: Any) -> None:
    """A short greedy reply through the engine: the same tokens and log-probabilities on the
    fast runner as on transformers' modules."""
    req = GenerationRequest((Message("user", "Name three rivers."),),
                            (SamplingParams(temperature=0, max_new_tokens=8),), top_logprobs=3)
    out = []
    for runner in ("hf", "fast"):
        backend = LocalBackend.from_checkpoint(ckpt, runner=runner)
        events = backend.generate(req, threading.Event())
        out.append([t for e in events if isinstance(e, TokenBatch) for t in e.tokens])
    assert [t.id for t in out[0]] == [t.id for t in out[1]]
    for a, b in zip(*out):
        assert a.logprob == pytest.approx(b.logprob, abs=ATOL)


def check_active_experts(ckpt: Any) -> None:
    """Only the chosen experts run: top_k per token in decode, each expert at most once per
    layer for a prompt (its tokens grouped), none unchosen."""
    runner = build_runner(ckpt, runner="fast", precision="model")
    fast = runner.fast
    moe_layers = [L.moe for L in fast.layers if L.moe is not None]
    assert moe_layers
    calls: list[int] = []
    expert = fast._expert

    def counted(x: torch.Tensor, wgu: Any, wd: Any) -> torch.Tensor:
        calls.append(x.shape[0])
        return expert(x, wgu, wd)

    fast._expert = counted
    cache = runner.new_cache()
    ids = torch.randint(3, vocab(ckpt), (1, 12))
    runner.forward(cache, ids)
    n_experts = len(moe_layers[0].experts)
    assert len(calls) <= len(moe_layers) * n_experts
    assert sum(calls) == 12 * sum(m.top_k for m in moe_layers)  # each token's k experts
    calls.clear()
    runner.forward(cache, ids[:, :1])
    assert calls == [1] * sum(m.top_k for m in moe_layers)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fast_runner_equals_transformers(case: Case, tokenizer: Any, models_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # a cache of its own per case (the int8 weights are keyed by the files' contents)
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / case.name / "cache"))
    ckpt = checkpoint(case, tokenizer, models_dir)
    assert unsupported_reason(ckpt.model) is None
    assert isinstance(LocalBackend.from_checkpoint(ckpt).runner, FastRunner)
    check_exact(ckpt)
    check_padded_batch(ckpt)
    check_engine(ckpt)
    if any(hasattr(layer.mlp, "experts") for layer in decoder(ckpt.model)[1].layers):
        check_active_experts(ckpt)
    check_int8(ckpt)
    check_quantized(ckpt, "int4")


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_int4_output_layer_is_6_bit_where_its_rows_are_whole_q6_k_blocks(
        tied: bool, tokenizer: Any, models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """int4 with chatui's kernels holds an output layer of rows of 256 (llama.cpp's Q6_K
    condition) 6-bit (``Q6Weight``, ``q6.c``), a tied model's embedding rows read from it, an
    untied embedding int8; the logits are the dequantized weights' (``check_quantized``),
    also from the disk cache. A 64-wide one (every other case here) stays int8."""
    from conftest import skip_unless_ci
    from inference import q8kernel

    if q8kernel.load_kernel() is None:
        skip_unless_ci("chatui's kernels do not build on this machine")
    case = Case(f"llama-256-{'tied' if tied else 'untied'}", _llama, dict(
        hidden_size=256, intermediate_size=256, head_dim=64, tie_word_embeddings=tied))
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / case.name / "cache"))
    ckpt = checkpoint(case, tokenizer, models_dir)
    runner = check_quantized(ckpt, "int4")
    fast = runner.fast
    assert isinstance(fast.lm_head, Q6Weight) and isinstance(fast.layers[0].wqkv, Q4Weight)
    assert (fast.embed is fast.lm_head) if tied else isinstance(fast.embed, Q8Weight)
    ids = torch.tensor([[3, 17, 250, 9]])
    assert torch.equal(fast._embed(ids), fast.embed.rows(ids, torch.float32))
    again = build_runner(ckpt, runner="fast", quantize="int4", precision="auto")  # cached
    assert isinstance(again.fast.lm_head, Q6Weight)
    assert torch.equal(again.forward(again.new_cache(), ids),
                       runner.forward(runner.new_cache(), ids))
    narrow = build_runner(checkpoint(CASES[0], tokenizer, models_dir), runner="fast",
                          quantize="int4", precision="auto")
    assert isinstance(narrow.fast.lm_head, Q8Weight)


@pytest.mark.parametrize("name", ["gemma2-tied", "gemma3-untied", "phi4-mini-tied",
                                  "qwen3-moe-tied"])
def test_int8_without_chatuis_kernel(name: str, tokenizer: Any, models_dir: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where chatui's kernels cannot be built, int8 is torch's per-channel kernel with bf16
    activations and torch's attention: the same check against the dequantized weights (Gemma's
    norms of sub-layer outputs, q/k norms, LongRoPE and experts in bf16)."""
    from inference import q8kernel

    case = next(c for c in CASES if c.name == name)
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / case.name / "cache-per-channel"))
    ckpt = checkpoint(case, tokenizer, models_dir)
    monkeypatch.setattr(q8kernel, "load_kernel", lambda: None)
    runner = check_quantized(ckpt, "int8")
    assert runner.fast.dtype == torch.bfloat16 and isinstance(runner.fast.lm_head, Int8Weight)


def test_longrope_switches_factors_past_the_original_context_as_transformers_does(
        tokenizer: Any, models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """LongRoPE uses its long factors for a forward that reaches past the original context and
    never recomputes cached keys, so a chunked prompt differs from one full forward there: the
    fast runner follows transformers' incremental forward (the transformers runner's) chunk for
    chunk, across the switch, on every decode path."""
    case = Case("phi4-longrope-switch", _phi3, dict(
        tie_word_embeddings=True, original_max_position_embeddings=64,
        rope_parameters=_longrope(6, 64, partial_rotary_factor=0.75)))
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / case.name / "cache"))
    ckpt = checkpoint(case, tokenizer, models_dir)
    runner = build_runner(ckpt, runner="fast", precision="model")
    assert runner.fast.ropes["default"].spec.long_after == 64
    torch.manual_seed(4)
    prompt = torch.randint(3, vocab(ckpt), (1, PROMPT))
    for name, decode in _decode_paths(runner).items():
        hf = HFRunner(ckpt.model)
        ch, cf = hf.new_cache(), runner.new_cache()
        for lo, hi in ((0, 30), (30, 55), (55, PROMPT)):  # the last chunk crosses 64
            a, b = hf.forward(ch, prompt[:, lo:hi]), runner.fast.forward(cf, prompt[:, lo:hi])
            assert (a - b).abs().max() < ATOL, name
        for _ in range(10):
            step = a.argmax(-1, keepdim=True)
            a, b = hf.forward(ch, step), decode(cf, step)
            assert (a - b).abs().max() < ATOL, name


def _olmo2(**kw: Any) -> Any:
    from transformers import Olmo2Config

    return Olmo2Config(**_small(**kw))


def test_int8_on_transformers_modules_for_an_architecture_the_fast_runner_does_not_know(
        tokenizer: Any, models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """OLMo 2 (norms after attention and MLP, q/k norms over all heads) is not one the fast
    runner knows: ``--quantize int8`` runs transformers' modules with every Linear layer in
    chatui's int8 kernel instead of being refused: the same logits as those modules over the
    dequantized weights, >= 97 % top-1 agreement with fp32, the int8 weights cached on disk,
    and the checkpoint's own model untouched. int4 stays the fast runner's."""
    from torch import nn

    from inference import quant
    from inference.hf_quant import Int8Linear
    from inference.runner import RunnerError, describe

    case = Case("olmo2-untied", _olmo2, dict(tie_word_embeddings=False))
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / case.name / "cache"))
    ckpt = checkpoint(case, tokenizer, models_dir)
    assert "olmo2" in unsupported_reason(ckpt.model)
    backend = LocalBackend.from_checkpoint(ckpt, quantize="int8")
    runner = backend.runner
    assert isinstance(runner, HFRunner) and runner.quantize == "int8"
    assert backend.info.quantization == "int8"
    assert "int8" in describe(runner) and "olmo2" in describe(runner)  # which runner, and why
    n_linear = sum(type(m) is nn.Linear for m in ckpt.model.modules())
    assert n_linear > 0  # the checkpoint's model keeps its Linear layers
    assert sum(isinstance(m, Int8Linear) for m in runner.model.modules()) == n_linear
    assert not any(type(m) is nn.Linear for m in runner.model.modules())

    twin = copy.deepcopy(ckpt.model)  # the same modules over the dequantized weights
    for name, m in runner.model.named_modules():
        if isinstance(m, Int8Linear):
            twin.get_submodule(name).weight.data = m.weight_int8.dequantize(torch.float32)
    torch.manual_seed(5)
    ids = torch.randint(3, vocab(ckpt), (1, 40))
    with torch.inference_mode():
        a, b = runner.model(ids).logits, twin(ids).logits
    tol = 0.05  # chatui's kernel's 8-bit activations, or torch's kernel's bf16 ones
    assert (a - b).abs().max() <= tol * b.abs().max()
    with torch.inference_mode():
        int8_agreement(ckpt, lambda x: runner.model(x).logits[0])

    req = GenerationRequest((Message("user", "Hi"),),
                            (SamplingParams(temperature=0, max_new_tokens=6),), top_logprobs=2)
    events = list(backend.generate(req, threading.Event()))
    assert sum(len(e.tokens) for e in events if isinstance(e, TokenBatch)) == 6

    def boom(*a: Any, **k: Any) -> Any:
        raise AssertionError("quantized again instead of loading the cache")

    assert runner.int8_path.is_file()
    monkeypatch.setattr(quant.Q8Weight, "quantize", classmethod(boom))
    monkeypatch.setattr(quant.Int8Weight, "quantize", classmethod(boom))
    again = build_runner(ckpt, quantize="int8")
    with torch.inference_mode():
        assert torch.equal(again.model(ids).logits, a)
    with pytest.raises(RunnerError, match="int4 needs the fast runner"):
        build_runner(ckpt, quantize="int4")
