"""The engine on a CUDA GPU: every architecture of the fast runner against transformers' own
forward on the same GPU, the CUDA-graph and compiled decode steps against the eager one, int8's
dequantising path, and the whole engine (pipelined steps, logprobs copied off the GPU) as a
user runs it.

These tests need an NVIDIA GPU, which CI does not have: the default run deselects them
(``-m "not cuda"`` in pyproject's addopts) and ``pytest -m cuda`` runs them. The engine's
device handling is otherwise covered on the CPU (devices and dtypes passed down, never a
hard-coded ``cuda``); only a GPU shows whether the graph capture, the compiled step and the
copies of the logprobs off the device work. ``CHATUI_TEST_DEVICE=cpu pytest -m cuda
tests/test_cuda.py`` runs the same checks on the CPU (without the graph capture), which is how
this file is kept working between GPU sessions. ``CHATUI_TEST_TOKENIZER=DIR`` names a tokenizer
directory where the default model is not installed (a GPU machine without the package).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from inference.chat import encode_messages
from inference.checkpoint import load_checkpoint
from inference.decode_graph import DecodeStep
from inference.engine import LocalBackend
from inference.fast_llama import FastRunner, _linear
from inference.quant import Int8Weight, Q8Weight
from inference.runner import build_runner
from inference.settings import SamplingParams
from inference.types import GenerationRequest, Message, TokenBatch

from test_architectures import CASES, CHUNKS, DECIDED, NEW, PROMPT, Case, checkpoint, vocab
from test_decode_step import Pair

pytestmark = pytest.mark.cuda

DEVICE = os.environ.get("CHATUI_TEST_DEVICE", "cuda")
FP32_ATOL = 1e-3
"""fp32 log-probabilities on a GPU against transformers' on the same GPU: cuBLAS picks its own
reduction orders per shape, so a little above the CPU's 1e-4."""
BF16_ATOL = 0.25
"""bf16 log-probabilities of two paths over the same weights, over the whole vocabulary:
a logit near 3 has a bf16 step of 1/64, and the compiled step fuses and rounds differently
(0.09 seen on the CPU for a tiny Llama); a wrong position, window or norm costs more than 1."""


@pytest.fixture(scope="module")
def device() -> torch.device:
    if DEVICE.startswith("cuda") and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here (run on a machine with one, or CHATUI_TEST_DEVICE=cpu)")
    return torch.device(DEVICE)


@pytest.fixture(scope="module")
def tokenizer(request: pytest.FixtureRequest) -> Any:
    from transformers import AutoTokenizer

    given = os.environ.get("CHATUI_TEST_TOKENIZER")
    path = Path(given) if given else request.getfixturevalue("default_model_dir")
    return AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda-archs")


def on_device(case: Case, tokenizer: Any, root: Path, device: torch.device,
              dtype: str) -> Any:
    """The case's tiny model (built and saved on the CPU by tests/test_architectures.py's
    builder) loaded on ``device`` as the engine loads a checkpoint."""
    checkpoint(case, tokenizer, root)
    return load_checkpoint(str(root / case.name), device=str(device), dtype=dtype)


def case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)


def reference(ckpt: Any, seq: torch.Tensor) -> torch.Tensor:
    """transformers' full forward over ``seq`` [1, T]: log-probabilities [T, V] in fp32."""
    with torch.inference_mode():
        return torch.log_softmax(ckpt.model(seq).logits[0].float(), dim=-1)


def teacher_forced(runner: FastRunner, decode: Callable[[Any, torch.Tensor], torch.Tensor],
                   seq: torch.Tensor) -> list[torch.Tensor]:
    """The prompt in chunks, then ``seq``'s remaining tokens one decode step each: the
    log-probabilities after each chunk's last token and after every step (fp32)."""
    cache = runner.new_cache()
    out: list[torch.Tensor] = []
    pos = 0
    for n in (*CHUNKS, PROMPT):
        chunk = seq[:, pos:min(pos + n, PROMPT)]
        if chunk.shape[1]:
            out.append(runner.fast.forward(cache, chunk)[0])
        pos += chunk.shape[1]
    for t in range(PROMPT, seq.shape[1]):
        out.append(decode(cache, seq[:, t:t + 1])[0].clone())
    return [torch.log_softmax(o.float(), dim=-1) for o in out]


def near(a: torch.Tensor, ref: torch.Tensor, floor: float = -15.0) -> float:
    """The largest difference of two log-probability vectors where the reference is above
    ``floor`` (every token a user can see: the far tail of a 49k vocabulary sits at -40 in a
    random model, where bf16's step is a quarter)."""
    keep = ref > floor
    return (a - ref)[keep].abs().max().item()


def positions() -> list[int]:
    ends = [min(sum(CHUNKS[:i + 1]), PROMPT) for i in range(len(CHUNKS))] + [PROMPT]
    return [e - 1 for e in ends] + list(range(PROMPT, PROMPT + NEW))


def sequence(ckpt: Any, device: torch.device, seed: int = 1) -> torch.Tensor:
    """A random prompt and NEW greedy tokens of transformers' model after it ([1, T])."""
    torch.manual_seed(seed)
    seq = torch.randint(3, vocab(ckpt), (1, PROMPT)).to(device)
    for _ in range(NEW):
        nxt = reference(ckpt, seq)[-1].argmax()
        seq = torch.cat([seq, nxt.view(1, 1)], dim=1)
    return seq


def compare(got: list[torch.Tensor], ref: torch.Tensor, atol: float, label: str) -> float:
    """Every position's log-probabilities within ``atol`` of the reference's, and the same
    greedy token wherever the reference's choice is decided; returns the largest difference."""
    worst = 0.0
    for p, lp in zip(positions(), got):
        err = near(lp, ref[p])
        worst = max(worst, err)
        assert err < atol, f"{label}: position {p} differs by {err:.2e}"
        top2 = ref[p].topk(2).values
        if top2[0] - top2[1] > DECIDED:
            assert int(lp.argmax()) == int(ref[p].argmax()), f"{label}: position {p}"
    return worst


def decode_paths(runner: FastRunner, device: torch.device) -> dict[str, Callable]:
    paths: dict[str, Callable] = {"eager": runner.fast.forward}
    if not runner.fast.has_experts:  # experts are chosen per token: no fixed-shape step
        graphs = device.type == "cuda"
        paths["fixed-shape step" + (" in a CUDA graph" if graphs else "")] = DecodeStep(
            runner.fast, compile=False, graphs=graphs)
    return paths


@pytest.mark.parametrize("arch", CASES, ids=str)
def test_fp32_fast_runner_on_the_gpu_equals_transformers(arch: Case, tokenizer: Any,
                                                         models_dir: Path, device: torch.device,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / arch.name / "cache"))
    ckpt = on_device(arch, tokenizer, models_dir, device, "float32")
    runner = build_runner(ckpt, runner="fast", quantize="none", precision="model")
    assert isinstance(runner, FastRunner) and runner.fast.device.type == device.type
    seq = sequence(ckpt, device)
    ref = reference(ckpt, seq)
    for name, decode in decode_paths(runner, device).items():
        worst = compare(teacher_forced(runner, decode, seq), ref, FP32_ATOL, name)
        print(f"{arch.name} fp32 {name}: max |dlogprob| {worst:.2e}")


@pytest.mark.parametrize("name", ["llama3-untied", "gemma3-tied", "phi3-untied"])
def test_bf16_compiled_step_equals_eager(name: str, tokenizer: Any, models_dir: Path,
                                         device: torch.device,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 (the GPU default): the compiled step (in a CUDA graph on a GPU) computes what the
    eager forward does, teacher-forced over the same tokens, and both stay near transformers'
    bf16 forward."""
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / name / "cache"))
    ckpt = on_device(case(name), tokenizer, models_dir, device, "bfloat16")
    runner = build_runner(ckpt, runner="fast", quantize="none", precision="model")
    assert runner.fast.dtype == torch.bfloat16
    seq = sequence(ckpt, device, seed=5)
    ref = reference(ckpt, seq)
    eager = teacher_forced(runner, runner.fast.forward, seq)
    step = DecodeStep(runner.fast, compile=True, graphs=device.type == "cuda",
                      cache_dir=models_dir / name / "inductor")
    compiled = teacher_forced(runner, step, seq)
    for a, b in zip(eager, compiled):
        assert near(b, a) < BF16_ATOL
    worst = compare(compiled, ref, 2 * BF16_ATOL, "compiled bf16 vs transformers bf16")
    print(f"{name} bf16 compiled: max |dlogprob| vs transformers {worst:.3f}")


@pytest.mark.parametrize("name", ["llama3-untied", "qwen3-moe-untied", "gemma2-tied"])
def test_int8_on_the_gpu_computes_its_dequantized_weights(name: str, tokenizer: Any,
                                                          models_dir: Path, device: torch.device,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """``--quantize int8`` off the CPU (per-channel int8 dequantised on the fly, bf16
    activations): every quantized weight's product is that of its dequantized weight, and the
    model keeps >= 97 % top-1 agreement with its own fp32 forward where that is decided."""
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / name / "cache-int8"))
    ckpt = on_device(case(name), tokenizer, models_dir, device, "float32")
    runner = build_runner(ckpt, runner="fast", quantize="int8", precision="model")
    kinds = (Int8Weight,) if device.type == "cuda" else (Int8Weight, Q8Weight)  # CPU: chatui's
    weights = {k: w for k, w in runner.fast.quantized.items() if isinstance(w, kinds)}
    assert weights
    torch.manual_seed(7)
    dt = runner.fast.dtype
    for key, w in weights.items():
        k = w.k if isinstance(w, Q8Weight) else w.q.shape[1]
        x = torch.randn(3, k, device=device).to(dt)
        got = _linear(x, w).float()
        want = x.float() @ w.dequantize(torch.float32).T
        assert (got - want).abs().max() <= 1e-2 * want.abs().max(), key
    seq = sequence(ckpt, device, seed=3)
    ref = reference(ckpt, seq)
    with torch.inference_mode():
        a = runner.fast.forward(runner.new_cache(), seq, all_logits=True)[0].float()
    top2 = ref.topk(2, dim=-1).values
    decided = top2[:, 0] - top2[:, 1] > DECIDED
    agree = (ref.argmax(-1) == a.argmax(-1))[decided].float().mean().item()
    print(f"{name} int8 on {device} ({dt}): top-1 agreement {agree:.3f} over "
          f"{int(decided.sum())} decided positions")
    assert agree >= 0.97


def test_int8_compiled_step_equals_eager(tokenizer: Any, models_dir: Path, device: torch.device,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """int8's compiled step (in a CUDA graph on a GPU; there its products are written as a
    reduction inductor fuses, not the matmul it rewrites into aten's slow int8 kernel) computes
    what int8's eager forward does, teacher-forced over the same tokens."""
    name = "llama3-untied"
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / name / "cache-int8-compiled"))
    ckpt = on_device(case(name), tokenizer, models_dir, device, "bfloat16")
    runner = build_runner(ckpt, runner="fast", quantize="int8", precision="model")
    seq = sequence(ckpt, device, seed=9)
    eager = teacher_forced(runner, runner.fast.forward, seq)
    step = DecodeStep(runner.fast, compile=True, graphs=device.type == "cuda",
                      cache_dir=models_dir / name / "inductor-int8")
    compiled = teacher_forced(runner, step, seq)
    worst = max(near(b, a) for a, b in zip(eager, compiled))
    print(f"{name} int8 compiled vs eager on {device}: max |dlogprob| {worst:.3f}")
    assert worst < BF16_ATOL


@pytest.mark.parametrize("name", ["llama3-untied", "qwen3-moe-tied"])
def test_the_engine_on_the_gpu_as_a_user_runs_it(name: str, tokenizer: Any, models_dir: Path,
                                                 device: torch.device,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's defaults on the device (bf16; on a GPU the compiled, graph-captured and
    pipelined step): a greedy reply of 24 tokens whose ids, log-probabilities and top-5
    alternatives are transformers' bf16 forward's over the same tokens; two rows (compare)
    give each row what one row alone gives."""
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(models_dir / name / "cache-engine"))
    ckpt = on_device(case(name), tokenizer, models_dir, device, "bfloat16")
    # on a CPU (CHATUI_TEST_DEVICE=cpu) "auto" means int8 with 8-bit activations, whose top-5
    # is not bf16's where the 5th and 6th are a little apart: the CPU run checks the rest
    quantize = "auto" if device.type == "cuda" else "none"
    backend = LocalBackend.from_checkpoint(ckpt, quantize=quantize, precision="auto")
    backend.eos_ids = frozenset()
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    messages = (Message("user", "Name three rivers and say where they flow."),)

    def run(settings: tuple[SamplingParams, ...]) -> list[list[Any]]:
        backend.reset()
        events = list(backend.generate(GenerationRequest(messages, settings, 5),
                                       threading.Event()))
        rows: list[list[Any]] = [[] for _ in settings]
        for e in events:
            if isinstance(e, TokenBatch):
                rows[e.row].extend(e.tokens)
        return rows

    (tokens,) = run((greedy,))
    assert len(tokens) == 24
    prompt = encode_messages(ckpt.tokenizer, messages)
    ids = [t.id for t in tokens]
    seq = torch.tensor([prompt + ids], device=device)
    ref = reference(ckpt, seq)[len(prompt) - 1:-1]
    for t, lp in zip(tokens, ref):
        assert t.logprob == pytest.approx(lp[t.id].item(), abs=BF16_ATOL)
        assert len(t.top) == 5
        gap = lp.topk(6).values
        if gap[4] - gap[5] > DECIDED:
            assert {a.id for a in t.top} == set(lp.topk(5).indices.tolist())
    two = run((greedy, SamplingParams(temperature=0, max_new_tokens=24)))
    assert [t.id for t in two[0]] == ids and [t.id for t in two[1]] == ids


def test_captured_steps_take_new_caches_of_their_shape(tokenizer: Any, models_dir: Path,
                                                      device: torch.device) -> None:
    """Each CUDA graph is bound to the cache tensors it was captured with; a new cache of its
    shape (each comparison, fan-out, reset) is copied into them instead of a new capture, and
    the conversation that held them gets the newcomer's tensors with its own keys and values:
    caches interleaved through the graphs decode what the eager forward does on their own."""
    ckpt = on_device(case("llama3-untied"), tokenizer, models_dir, device, "float32")
    fast = FastRunner(ckpt.model).fast
    step = DecodeStep(fast, compile=False, graphs=device.type == "cuda")
    chat = Pair(fast, 1, 40, atol=FP32_ATOL)
    chat.decode(step, 3)
    other = Pair(fast, 2, 60, atol=FP32_ATOL)
    other.decode(step, 2)
    chat.decode(step, 2)
    compare = Pair(fast, 3, 50, rows=3, atol=FP32_ATOL)
    compare.decode(step, 3)
    again = Pair(fast, 4, 30, rows=3, atol=FP32_ATOL)
    again.decode(step, 2)
    compare.decode(step, 2)
    chat.decode(step, 2)
    other.decode(step, 2)
    if step.graphs:
        assert step.captures == 2


def test_a_seed_draws_the_same_tokens_on_the_gpu_as_on_the_cpu(device: torch.device) -> None:
    """A sampled row draws from its own CPU generator on any device (``sample_rows``: one
    number a row and step, then the cumulative probabilities on the device), so a comparison
    seeded on a GPU gives the tokens the same seeds give on the CPU; greedy rows keep their
    argmax."""
    from inference.sampling import RowSampling, process_logits, sample_rows

    settings = [SamplingParams(temperature=t, top_p=p, seed=s)
                for t, p, s in ((0.7, 0.95, 1), (0, 1.0, None), (1.2, 1.0, 3), (1.0, 0.9, 4))]
    torch.manual_seed(5)
    on = {d: RowSampling.build(settings, d) for d in (torch.device("cpu"), device)}
    for _ in range(40):
        logits = torch.randn(4, 1000) * 3
        got = {d: sample_rows(process_logits(logits.to(d), None, rows), rows).cpu()
               for d, rows in on.items()}
        assert torch.equal(got[torch.device("cpu")], got[device])
        assert got[device][1] == logits[1].argmax()
