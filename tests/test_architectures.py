"""Every architecture on the fast runner against transformers' own forward.

Each case builds a tiny random model from the transformers config class (tied and untied
embeddings where the architecture allows; sliding windows shorter than the prompt), saves it
with the default model's tokenizer and loads it as the engine does (``load_checkpoint``, then
``build_runner``). The fp32 fast runner must give transformers' full-forward log-probabilities
within 1e-4 at every position of a prompt read in chunks and of 45 greedy tokens (and the same
greedy tokens), through each of its decode paths (chatui's C attention, torch's attention, the
fixed-shape step the compiled decode uses); int8 must keep >= 97 % top-1 agreement with fp32
on ``inference.quality``'s text.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from inference import quality
from inference.decode_graph import DecodeStep
from inference.engine import LocalBackend
from inference.fast_llama import FastRunner, unsupported_reason
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


def _qwen3(**kw: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(**_small(head_dim=16, **kw))


def _mistral(**kw: Any) -> Any:
    from transformers import MistralConfig

    return MistralConfig(**_small(**kw))


def _qwen2(**kw: Any) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(**_small(**kw))


CASES = [
    Case("qwen3-tied", _qwen3, dict(tie_word_embeddings=True)),
    Case("qwen3-untied", _qwen3, dict(tie_word_embeddings=False)),
    # every layer windowed
    Case("mistral-window", _mistral, dict(sliding_window=16, tie_word_embeddings=False)),
    # layer 0 full, layer 1 windowed (max_window_layers); q/k/v biases
    Case("qwen2-window", _qwen2, dict(use_sliding_window=True, sliding_window=20,
                                      max_window_layers=1, tie_word_embeddings=True)),
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
        # spread the logits (a random model's are nearly uniform)
        model.get_output_embeddings().weight.normal_(0, 0.15)
        for name, p in model.named_parameters():  # norms start at 1 (Gemma's at 0): vary them
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
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
    prompt = torch.randint(3, ckpt.model.config.vocab_size, (1, PROMPT))
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
    x = torch.randint(3, ckpt.model.config.vocab_size, (3, 40))
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


def check_int8(ckpt: Any) -> float:
    """int8 (chatui's kernel where it builds) against the fp32 model: top-1 agreement."""
    runner = build_runner(ckpt, runner="fast", quantize="int8", precision="auto")
    assert runner.fast.quantize == "int8"
    got = quality.measure(ckpt.model, ckpt.tokenizer, runner)
    assert got.top1_agreement >= 0.97, got
    return got.top1_agreement


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


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fast_runner_equals_transformers(case: Case, tokenizer: Any, models_dir: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / "cache"))
    ckpt = checkpoint(case, tokenizer, models_dir)
    assert unsupported_reason(ckpt.model) is None
    assert isinstance(LocalBackend.from_checkpoint(ckpt).runner, FastRunner)
    check_exact(ckpt)
    check_padded_batch(ckpt)
    check_engine(ckpt)
    check_int8(ckpt)
