"""The C kernels' ABI (``kernels/chatui_kernels.h`` against ``inference/kernel_abi.py``), the
load-time refusal of a library that does not match, the debug-mode argument checks and the
ahead-of-time build."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from inference import kernel_abi, kernel_build, q8kernel
from inference.kernel_abi import KernelABIError, KernelArgumentError
from inference.quant import Q4Weight, Q8Weight

KERNELS = q8kernel.KERNELS
HEADER = KERNELS / "chatui_kernels.h"


def _prototypes(text: str) -> dict[str, int]:
    """Exported functions declared in C text (not static, ending in ``);``) -> argument count."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    found = {}
    for m in re.finditer(r"^(?!static)(?:const\s+)?\w+[\s*]+(\w+)\(([^)]*)\);", text, re.M):
        args = m.group(2).strip()
        found[m.group(1)] = 0 if args in ("", "void") else args.count(",") + 1
    return found


def test_the_python_table_matches_the_header():
    """Every function of the header is in SIGNATURES with as many arguments, and back."""
    declared = _prototypes(HEADER.read_text())
    table = {name: len(argtypes) for name, (_, argtypes) in kernel_abi.SIGNATURES.items()}
    assert declared == table
    version = re.search(r"#define CHATUI_KERNELS_ABI (\d+)", HEADER.read_text())
    assert version and int(version.group(1)) == kernel_abi.ABI_VERSION
    for name in kernel_abi.STRUCTS:
        assert re.search(rf"}}\s*{name};", HEADER.read_text())


def test_every_source_includes_the_header_and_redeclares_nothing():
    for source in q8kernel.SOURCES:
        text = source.read_text()
        assert '#include "chatui_kernels.h"' in text, source.name
        assert _prototypes(text) == {}, f"{source.name} declares prototypes of its own"
        assert "typedef struct" not in text, f"{source.name} defines a struct of the ABI"


def _build_variant(tmp_path: Path, cc: str, header_edit=None, sources=None) -> Path:
    """The kernels built from a copy of the sources, the header edited by ``header_edit``."""
    src = tmp_path / "kernels"
    shutil.copytree(KERNELS, src)
    if header_edit:
        h = src / HEADER.name
        h.write_text(header_edit(h.read_text()))
    out = tmp_path / "variant.so"
    names = sources or [p.name for p in q8kernel.SOURCES]
    subprocess.run([cc, "-O1", "-shared", "-fPIC", *(str(src / n) for n in names), "-o",
                    str(out), "-lm"], check=True, capture_output=True, timeout=120)
    return out


def test_a_library_of_another_abi_version_is_refused(tmp_path, x86_gcc):
    path = _build_variant(tmp_path, x86_gcc, lambda h: h.replace(
        f"#define CHATUI_KERNELS_ABI {kernel_abi.ABI_VERSION}", "#define CHATUI_KERNELS_ABI 99"),
        ["abi.c"])
    with pytest.raises(KernelABIError,
                       match=f"ABI version 99, this code expects {kernel_abi.ABI_VERSION}"):
        kernel_abi.bind(ctypes.CDLL(str(path)))


def test_a_library_whose_layer_struct_grew_is_refused(tmp_path, x86_gcc):
    """A field added in C but not in Python: refused before any kernel is called."""
    path = _build_variant(tmp_path, x86_gcc, lambda h: h.replace(
        "const int8_t *wd;", "const float *extra; const int8_t *wd;"), ["abi.c"])
    size = ctypes.sizeof(kernel_abi.Layer)
    with pytest.raises(KernelABIError,
                       match=rf"layer_t is {size + 8} bytes .* but {size} in Python"):
        kernel_abi.bind(ctypes.CDLL(str(path)))


def test_a_library_without_abi_answers_is_refused(tmp_path, x86_gcc):
    old = tmp_path / "old.c"
    old.write_text("int q8_group_size(void) { return 32; }\n")
    out = tmp_path / "old.so"
    subprocess.run([x86_gcc, "-shared", "-fPIC", str(old), "-o", str(out)], check=True)
    with pytest.raises(KernelABIError, match="no ABI version"):
        kernel_abi.bind(ctypes.CDLL(str(out)))


def test_a_python_struct_that_drifted_is_refused_and_the_runtime_falls_back(
        tmp_path, x86_gcc, monkeypatch, caplog):
    """The other side of the contract: Python's Layer changed, the built library did not. The
    loader refuses it (a logged warning) and the engine runs on torch's kernels."""

    class Grown(ctypes.Structure):
        _fields_ = [*kernel_abi.Layer._fields_, ("extra", ctypes.c_void_p)]

    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernel_abi, "STRUCTS", {"layer_t": Grown})
    q8kernel.load_kernel.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="inference.q8kernel"):
            assert q8kernel.load_kernel() is None
        size = ctypes.sizeof(kernel_abi.Layer)
        assert f"does not match this code (layer_t is {size} bytes" in caplog.text
        with pytest.raises(kernel_build.KernelBuildError, match="do not match this chatui"):
            kernel_build.build_all()
    finally:
        q8kernel.load_kernel.cache_clear()


def test_build_all_builds_once_and_rebuilds_when_forced(tmp_path, x86_gcc, monkeypatch):
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    [path] = kernel_build.build_all()
    assert path.is_file() and path.parent == tmp_path / "kernels"
    first = path.stat()
    assert kernel_build.build_all() == [path]
    assert path.stat().st_ino == first.st_ino  # not built again
    [again] = kernel_build.build_all(force=True)
    assert again == path and path.stat().st_ino != first.st_ino  # a new file renamed in place
    assert q8kernel.open_library(path, openmp=False).isa in ("avx512-vnni", "avx2", "generic")


def test_build_all_reports_a_missing_compiler_in_one_sentence(monkeypatch):
    monkeypatch.setattr(q8kernel, "_compiler", lambda: None)
    monkeypatch.setattr(q8kernel.platform, "machine", lambda: "x86_64")
    with pytest.raises(kernel_build.KernelBuildError, match=r"^Cannot build chatui's kernels: "
                                                            r"no C compiler found.*\.$"):
        kernel_build.build_all()


def test_build_all_reports_a_compiler_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(q8kernel.platform, "machine", lambda: "x86_64")
    fake = tmp_path / "cc"
    fake.write_text("#!/bin/sh\necho 'q8.c:1: error: boom' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CC", str(fake))
    with pytest.raises(kernel_build.KernelBuildError, match="failed on chatui's kernels: q8.c:1: "
                                                            "error: boom"):
        kernel_build.build_all()


# ---------------------------------------------------------------------------------------------
# Debug mode


@pytest.fixture
def checked(kernel):
    return dataclasses.replace(kernel, debug=True)


def test_debug_mode_is_switched_on_by_the_environment(monkeypatch, kernel):
    monkeypatch.setenv("CHATUI_KERNEL_DEBUG", "1")
    q8kernel.load_kernel.cache_clear()
    try:
        assert q8kernel.load_kernel().debug
        monkeypatch.delenv("CHATUI_KERNEL_DEBUG")
        q8kernel.load_kernel.cache_clear()
        assert not q8kernel.load_kernel().debug
    finally:
        q8kernel.load_kernel.cache_clear()


def test_debug_checks_pass_good_calls_with_the_same_results(kernel, checked):
    torch.manual_seed(0)
    w = Q8Weight.quantize(torch.randn(40, 70))
    x = torch.randn(3, 70)
    norm = torch.rand(70) + 0.5
    assert torch.equal(checked.matmul(x, w.packed, w.scales, 40, norm, 1e-5),
                       kernel.matmul(x, w.packed, w.scales, 40, norm, 1e-5))
    gu = torch.randn(2, 140)
    assert torch.equal(checked.matmul(gu, w.packed, w.scales, 40, swiglu=True),
                       kernel.matmul(gu, w.packed, w.scales, 40, swiglu=True))
    wf, xf = torch.randn(9, 37), torch.randn(2, 37)
    assert torch.equal(checked.f32_linear(xf, wf), kernel.f32_linear(xf, wf))


def test_debug_checks_refuse_bad_matmul_arguments(checked):
    w = Q8Weight.quantize(torch.randn(40, 70))
    x = torch.randn(3, 70)
    with pytest.raises(KernelArgumentError, match="x must be torch.float32, got torch.float64"):
        checked.matmul(x.double(), w.packed, w.scales, 40)
    with pytest.raises(KernelArgumentError, match="x must be contiguous"):
        checked.matmul(torch.randn(70, 3).t(), w.packed, w.scales, 40)
    with pytest.raises(KernelArgumentError, match="packed must hold 9216 values, got 4608"):
        checked.matmul(torch.randn(3, 70), w.packed, w.scales, 90)  # too few rows packed
    wide = Q8Weight.quantize(torch.randn(40, 100))
    with pytest.raises(KernelArgumentError, match="packed must hold 4608 values, got 6144"):
        checked.matmul(x, wide.packed, wide.scales, 40)  # a weight for another K
    with pytest.raises(KernelArgumentError, match="scales must be torch.float16"):
        checked.matmul(x, w.packed, w.scales.float(), 40)
    with pytest.raises(KernelArgumentError, match="norm must hold 70 values"):
        checked.matmul(x, w.packed, w.scales, 40, norm=torch.ones(69))
    with pytest.raises(KernelArgumentError, match="swiglu needs"):
        checked.matmul(torch.randn(3, 71), w.packed, w.scales, 40, swiglu=True)
    with pytest.raises(KernelArgumentError, match=r"out must be \[3, 40\]"):
        checked.run(x, w.packed, w.scales, torch.empty(2, 40), None, 0.0, False)


def test_debug_checks_cover_the_int4_kernel(kernel, checked):
    """The same checks for ``q4_matmul``: good calls give the unchecked results, a weight packed
    for another shape or scales of another dtype are refused before C runs."""
    torch.manual_seed(1)
    w = Q4Weight.quantize(torch.randn(40, 70))
    x, norm = torch.randn(3, 70), torch.rand(70) + 0.5
    assert torch.equal(checked.q4_matmul(x, w.packed, w.scales, 40, norm, 1e-5),
                       kernel.q4_matmul(x, w.packed, w.scales, 40, norm, 1e-5))
    with pytest.raises(KernelArgumentError, match="packed must hold 4608 values, got 2304"):
        checked.q4_matmul(x, w.packed, w.scales, 90)  # too few rows packed
    with pytest.raises(KernelArgumentError, match="packed must be torch.uint8"):
        checked.q4_matmul(x, w.packed.view(torch.int8), w.scales, 40)  # an int8 weight's bytes
    with pytest.raises(KernelArgumentError, match="scales must hold 288 values, got 144"):
        checked.q4_matmul(x, w.packed, w.scales[:, :, 0].contiguous(), 40)  # no mins
    with pytest.raises(KernelArgumentError, match="swiglu needs"):
        checked.q4_matmul(torch.randn(3, 71), w.packed, w.scales, 40, swiglu=True)


def test_debug_checks_refuse_bad_f32_arguments(checked):
    with pytest.raises(KernelArgumentError, match=r"w must be \[N, 37\]"):
        checked.f32_linear(torch.randn(2, 37), torch.randn(9, 36))
    with pytest.raises(KernelArgumentError, match="x has 9 rows; the kernel takes 8"):
        checked.f32_linear(torch.randn(9, 37), torch.randn(9, 37))


def _attention_args(B=1, H=4, KV=2, D=8, C=16, write=5):
    return dict(qkv=torch.randn(B, (H + 2 * KV) * D), k_cache=torch.zeros(B, KV, C, D),
                v_cache=torch.zeros(B, KV, C, D), write=write,
                positions=torch.full((B,), write), cos=torch.ones(C, D // 2),
                sin=torch.zeros(C, D // 2), mask=None, n_heads=H)


def test_debug_checks_refuse_bad_attention_arguments(kernel, checked):
    good = _attention_args()
    same = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in good.items()}
    assert torch.equal(checked.attention(**good), kernel.attention(**same))
    cases = [
        (dict(write=16), "write position 16 is outside the cache's 16"),
        (dict(positions=torch.tensor([20])), r"positions must lie in the RoPE tables' 0..15"),
        (dict(positions=torch.tensor([5], dtype=torch.int32)), "positions must be torch.int64"),
        (dict(v_cache=torch.zeros(1, 2, 8, 8)), r"cache 1 is \(1, 2, 8, 8\)"),
        (dict(qkv=torch.randn(1, 63)), "qkv must hold 64 values"),
        (dict(n_heads=3), "3 query heads do not share 2 KV heads"),
        (dict(mask=torch.ones(1, 5, dtype=torch.uint8)), "mask must hold 6 values"),
        (dict(cos=torch.ones(16, 3)), r"cos and sin must both be \[P, 4\]"),
        (dict(shared=6), "6 shared positions is outside 0..5"),
    ]
    for change, message in cases:
        with pytest.raises(KernelArgumentError, match=message):
            checked.attention(**{**_attention_args(), **change})


def test_debug_checks_refuse_bad_prefill_attention_arguments(kernel, checked):
    def args(**change):
        good = dict(qkv=torch.randn(5, 8 * 64), k_cache=torch.randn(2, 10, 64),
                    v_cache=torch.randn(2, 10, 64), start=3, cos=torch.ones(10, 32),
                    sin=torch.zeros(10, 32), n_heads=4)
        return {**good, **change}

    same = args()
    assert torch.equal(checked.prefill_attention(**same),
                       kernel.prefill_attention(**{k: v.clone() if isinstance(v, torch.Tensor)
                                                   else v for k, v in same.items()}))
    cases = [
        (dict(start=6), "write position 10 is outside the cache's 10"),
        (dict(start=-1), "the first position -1 is negative"),
        (dict(k_cache=torch.randn(2, 10, 64).half()),
         "cache 1 must be torch.float16, got torch.float32"),
        (dict(v_cache=torch.randn(2, 10, 32)), r"cache 1 is \(1, 2, 10, 32\)"),
        (dict(qkv=torch.randn(5, 8 * 64).double()), "qkv must be torch.float32"),
        (dict(qkv=torch.randn(5, 7 * 64)), "qkv must hold 2560 values"),
        (dict(n_heads=3), "3 query heads do not share 2 KV heads"),
        (dict(k_cache=torch.randn(10, 2, 64).transpose(0, 1)), "cache 0 must be contiguous"),
        (dict(qkv=torch.randn(8 * 64)), r"qkv must be \[T, \(H \+ 2KV\) \* D\]"),
        (dict(cos=torch.ones(10, 31)), r"cos and sin must both be \[P, 32\]"),
        (dict(cos=torch.ones(7, 32), sin=torch.zeros(7, 32)),
         r"positions must lie in the RoPE tables' 0..6"),
    ]
    for change, message in cases:
        with pytest.raises(KernelArgumentError, match=message):
            checked.prefill_attention(**args(**change))


def test_debug_checks_refuse_bad_decode_layers_arguments(checked):
    a = _attention_args(B=2)
    layers = (kernel_abi.Layer * 2)()
    caches = [torch.zeros(2, 2, 16, 8) for _ in range(2)]
    common = dict(n_heads=4, inter=16, write=5, positions=a["positions"], cos=[a["cos"]],
                  sin=[a["sin"]], mask=None, eps=1e-5)
    with pytest.raises(KernelArgumentError, match="2 layers but 1 caches"):
        checked.decode_layers(torch.randn(2, 32), layers, caches[:1], caches[:1], **common)
    with pytest.raises(KernelArgumentError, match="x has 3 rows, the caches 2"):
        checked.decode_layers(torch.randn(3, 32), layers, caches, caches, **common)
    with pytest.raises(KernelArgumentError, match=r"x must be \[B, hidden\]"):
        checked.decode_layers(torch.randn(2, 1, 32), layers, caches, caches, **common)
