"""Checkpoints loaded lazily, as the app loads them: the large weights stay in the file and are
quantized from it a block of rows at a time (bf16 safetensors never whole in fp32), loaded
whole only when something needs them in full precision; and the disk cache of quantized
weights memory-mapped on later starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conftest import skip_unless_ci

from inference import weight_rows
from inference.checkpoint import lazy_model, load_checkpoint
from inference.checkpoint.st_tensors import SafetensorsRows
from inference.quant import Q8Weight
from inference.runner import HFRunner, build_runner


def _bf16_checkpoint(root: Path, tokenizer_dir: Path, tied: bool = False) -> Path:
    from transformers import AutoTokenizer

    from test_weight_layouts import tiny_model

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = tiny_model("qwen2", tied, len(tok)).to(torch.bfloat16)
    out = root / ("bf16-tied" if tied else "bf16")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_bf16_safetensors_quantized_tensor_by_tensor(cache: Path, default_model_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 from a bf16 checkpoint: each weight read a block of rows at a time (never a whole
    weight, let alone the model, in fp32), to exactly what quantizing the whole fp32 model
    gives; the large weights are never loaded into the model."""
    ckpt_dir = _bf16_checkpoint(cache, default_model_dir)
    eager = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32")
    lazy = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32", lazy=True)
    assert lazy.weights_hash == eager.weights_hash
    assert set(lazy_model.lazy_names(lazy.model)) >= {"model.embed_tokens.weight",
                                                       "lm_head.weight"}
    for name, p in lazy.model.named_parameters():  # the small ones are loaded, as from_pretrained
        if not p.is_meta:
            assert torch.equal(p, eager.model.get_parameter(name)), name

    monkeypatch.setattr(weight_rows, "CHUNK_ELEMENTS", 4096)
    largest: list[int] = []
    read = SafetensorsRows.read

    def counted(self: SafetensorsRows, rows: np.ndarray) -> torch.Tensor:
        largest.append(len(rows) * self.k)
        return read(self, rows)

    monkeypatch.setattr(SafetensorsRows, "read", counted)
    runner = build_runner(lazy, quantize="int8", precision="auto")
    assert lazy_model.is_lazy(lazy.model)  # quantized from the file, never loaded
    assert largest and max(largest) <= 4096 * 2  # a block of rows (of a 16-row multiple)
    whole = build_runner(eager, quantize="none", precision="model").fast
    fast = runner.fast
    for q, w in [(fast.lm_head, whole.lm_head), (fast.embed, whole.embed),
                 (fast.layers[1].wqkv, whole.layers[1].wqkv), (fast.layers[0].wd, whole.layers[0].wd)]:
        assert isinstance(q, Q8Weight)
        ref = Q8Weight.quantize(w)
        assert torch.equal(q.packed, ref.packed) and torch.equal(q.scales, ref.scales)


def test_full_precision_loads_the_rest_when_needed(cache: Path, default_model_dir: Path) -> None:
    """No quantization, or transformers' runner: the weights left in the file are loaded (one
    tensor at a time) into exactly what from_pretrained gives."""
    ckpt_dir = _bf16_checkpoint(cache, default_model_dir, tied=True)
    eager = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32")
    lazy = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32", lazy=True)
    assert lazy_model.is_lazy(lazy.model)
    runner = build_runner(lazy, quantize="none", precision="model")
    assert not lazy_model.is_lazy(lazy.model)
    assert lazy.model.lm_head.weight is lazy.model.model.embed_tokens.weight  # still tied
    for name, t in eager.model.state_dict().items():
        assert torch.equal(lazy.model.state_dict()[name], t), name
    ids = torch.tensor([[1, 5, 9, 14]])
    ref = HFRunner(eager.model)
    assert torch.allclose(runner.forward(runner.new_cache(), ids), ref.forward(ref.new_cache(), ids),
                          atol=1e-4)
    again = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32", lazy=True)
    hf = build_runner(again, runner="hf")
    assert isinstance(hf, HFRunner) and not lazy_model.is_lazy(again.model)


def test_a_checkpoint_transformers_converts_on_load_falls_back(cache: Path,
                                                               default_model_dir: Path) -> None:
    """Tensor names that are not the model's own (transformers renames or stacks them on load)
    are left to from_pretrained."""
    from safetensors.torch import load_file, save_file

    ckpt_dir = _bf16_checkpoint(cache, default_model_dir)
    tensors = load_file(str(ckpt_dir / "model.safetensors"))
    tensors["model.norm.gamma"] = tensors.pop("model.norm.weight")  # a legacy name it maps
    save_file(tensors, str(ckpt_dir / "model.safetensors"), metadata={"format": "pt"})
    lazy = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32", lazy=True)
    assert not lazy_model.is_lazy(lazy.model)
    assert build_runner(lazy, quantize="int8", precision="auto").fast.quantized




def test_weights_that_do_not_fit_get_one_sentence_before_loading(
        cache: Path, default_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Too little memory: one sentence with the size the weights need, before they are read
    (never an OOM kill); for a whole load, for a quantization, and for the full precision a
    lazily loaded model needs for transformers' runner."""
    from inference.checkpoint import memory
    from inference.checkpoint.errors import CheckpointError
    from inference.runner import RunnerError

    ckpt_dir = _bf16_checkpoint(cache, default_model_dir)
    lazy = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32", lazy=True)
    need = memory.weight_bytes([(n, tuple(p.shape), p.dtype)
                                for n, p in lazy.model.named_parameters() if p.is_meta],
                               "int8", True)
    monkeypatch.setattr(memory, "available_bytes", lambda: memory.WORKING_ROOM + need // 2)

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("weights were read")

    monkeypatch.setattr(SafetensorsRows, "read", refuse)
    for call in (lambda: load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32"),
                 lambda: build_runner(lazy, quantize="int8", precision="auto"),
                 lambda: build_runner(lazy, runner="hf")):
        with pytest.raises((CheckpointError, RunnerError)) as e:
            call()
        text = str(e.value)
        assert "\n" not in text and text.endswith(".") and "needs" in text and "GB" in text
        assert "available" in text
    assert lazy_model.is_lazy(lazy.model)


def test_the_estimate_is_what_the_runner_holds(cache: Path, default_model_dir: Path) -> None:
    """The size the memory check uses is the size of the weights the runner ends up with."""
    from inference.checkpoint import memory
    from inference.quant import q8_available

    ckpt_dir = _bf16_checkpoint(cache, default_model_dir)
    for kind in ("int8", "int4"):
        lazy = load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32", lazy=True)
        params = [(n, tuple(p.shape), p.dtype) for n, p in lazy.model.named_parameters()
                  if p.is_meta]
        estimate = memory.weight_bytes(params, kind, q8_available(torch.device("cpu")))
        runner = build_runner(lazy, quantize=kind, precision="auto")
        held = sum(t.numel() * t.element_size() for w in runner.fast.quantized.values()
                   for t in vars(w).values() if isinstance(t, torch.Tensor))
        assert abs(estimate - held) <= 0.05 * held, (kind, estimate, held)


def _tensors(weights: dict) -> list[torch.Tensor]:
    return [t for w in weights.values() for t in vars(w).values() if isinstance(t, torch.Tensor)]


def _in_one_huge_buffer(weights: dict, size: int) -> None:
    """Every tensor of ``weights`` a view of one buffer of at most ``size`` bytes, advised
    MADV_HUGEPAGE (how many huge pages it holds is the kernel's to give, or split later:
    ``benchmarks/bench_hugepages.py`` prints the share)."""
    from inference import hugepages

    tensors = _tensors(weights)
    lo = min(t.data_ptr() for t in tensors)
    hi = max(t.data_ptr() + t.numel() * t.element_size() for t in tensors)
    assert hi - lo <= size  # views of one copy of the file's bytes
    assert all(hugepages.advised(t.data_ptr()) for t in tensors)


def _mapped_from(weights: dict, path: Path) -> bool:
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(path.resolve())):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            spans.append((lo, hi))
    return all(any(lo <= t.data_ptr() < hi for lo, hi in spans) for t in _tensors(weights))


def test_the_weights_run_from_huge_pages(cache: Path, default_model_dir: Path) -> None:
    """A first start runs on the weights it has cached, read back into one private buffer in
    huge pages (a decode step streams them 5-12% quicker than from small pages), having let go
    of its own. A later start runs at once on the cache's file mapping while a thread reads the
    file into huge pages, and takes them in at the first forward after: the same logits to the
    bit before and after. Where the kernel has no huge pages, the file mapping stays."""
    from inference import hugepages

    ckpt_dir = _bf16_checkpoint(cache, default_model_dir)

    def start() -> Any:
        return build_runner(load_checkpoint(str(ckpt_dir), device="cpu", dtype="float32",
                                            lazy=True), quantize="int8", precision="auto")

    first = start()
    if not Path("/proc/self/maps").is_file():
        skip_unless_ci("there is no /proc/self/maps to see the mappings in")
    later = start()
    assert _mapped_from(later.fast.quantized, first.int8_path)
    pending, later.pending = later.pending, None  # (held back: this forward runs on the map)
    ids = torch.tensor([[1, 2, 3, 4]])
    before = later.forward(later.new_cache(), ids)
    if not hugepages.huge_pages_available():
        assert pending is None
        return
    size = first.int8_path.stat().st_size
    _in_one_huge_buffer(first.fast.quantized, size)
    assert pending is not None
    pending.wait()
    later.pending = pending
    after = later.forward(later.new_cache(), ids)
    assert later.pending is None
    running = {f"{i}.{name}": getattr(L, name) for i, L in enumerate(later.fast.layers)
               for name in ("wqkv", "wo", "wgu", "wd")} | {"lm_head": later.fast.lm_head}
    for weights in (later.fast.quantized, running):
        _in_one_huge_buffer(weights, size)
        assert not _mapped_from(weights, first.int8_path)
    assert torch.equal(before, after)
    assert torch.equal(later.fast.lm_head.packed, first.fast.lm_head.packed)


_EXIT_DURING_READ = """
import sys, time
from pathlib import Path
import torch
from inference.runner import ResidentWeights
ResidentWeights(Path(sys.argv[1]), torch.device("cpu"))
time.sleep(float(sys.argv[2]))
"""


def test_a_process_ending_while_the_weights_are_read_exits_cleanly(
        cache: Path, tiny_model_dir: Path) -> None:
    """A process that ends while ``ResidentWeights`` reads the int8 cache into huge pages (a
    refused ``chatui bench``, a short ``chatui generate``) exits 0. Its thread was a daemon:
    still in torch as the interpreter shut down (the tensors made after the read), it died
    unwinding through torch's C++ frames and the process aborted ("terminate called without an
    active exception", exit code 134), here in 4 of 12 runs ending 2-5 ms after the start
    (this test caught it in its first run).
    ``close`` stops the read at its next chunk and joins the thread."""
    import subprocess
    import sys

    from inference import hugepages
    from inference.runner import ResidentWeights

    if not hugepages.huge_pages_available():
        skip_unless_ci("this kernel gives no transparent huge pages")
    first = build_runner(load_checkpoint(str(tiny_model_dir), device="cpu", dtype="float32"),
                         quantize="int8", precision="auto")
    path = first.int8_path
    root = Path(__file__).resolve().parents[1]
    for ms in (1, 2, 3, 4, 5, 6):
        r = subprocess.run([sys.executable, "-c", _EXIT_DURING_READ, str(path), str(ms / 1e3)],
                           cwd=root, capture_output=True, text=True, timeout=120)
        assert (r.returncode, r.stderr) == (0, ""), f"ended {ms} ms after the start"
    weights = ResidentWeights(path, torch.device("cpu"))
    weights.close()
    assert not weights._thread.is_alive() and weights.ready() is not None
