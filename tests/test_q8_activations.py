"""The int8 kernel's activation quantization (``q8.c``'s ``quantize_row``, SIMD for whole
groups since issue 18) is bit for bit the scalar definition: per group of 32, amax = max |x|,
x * (32767 / amax) rounded to nearest even, scale amax / 32767."""

from __future__ import annotations

import pytest
import torch

from inference import q8kernel
from inference.quant import Q8Weight


def _quantized_identity(x: torch.Tensor) -> torch.Tensor:
    """What the kernel returns for x @ I.T with the identity quantized as ``Q8Weight`` (each
    row's one weight 127 at the fp16 scale of 1/127): the scalar quantization of x, multiplied
    out as the SIMD kernels do (one rounding of the integer sum times scale x x's scale)."""
    m, k = x.shape
    g = -(-k // 32)
    xp = torch.nn.functional.pad(x, (0, g * 32 - k)).view(m, g, 32)
    amax = xp.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.tensor(32767.0) / amax, torch.zeros_like(amax))
    xq = torch.round(xp * inv)  # half to even, as lrintf and vcvtps2dq
    xs = amax / torch.tensor(32767.0)
    sw = torch.tensor(1 / 127.0).to(torch.float16).float()
    return ((xq * 127) * (sw * xs)).view(m, g * 32)[:, :k]


def _check(kern: q8kernel.Q8Kernel) -> None:
    torch.manual_seed(18)
    for k in (576, 70, 32):  # whole groups, and a last group cut short (the scalar loop)
        w = Q8Weight.quantize(torch.eye(k))
        x = torch.randn(9, k) * torch.logspace(-2, 2, k)
        x[3] = 0.0  # an all-zero row: scale 0
        got = kern.matmul(x, w.packed, w.scales, k)
        assert torch.equal(got, _quantized_identity(x)), k


def test_activations_quantize_as_the_scalar_definition(kernel):
    _check(kernel)


def test_the_avx2_build_quantizes_the_same(tmp_path, x86_gcc):
    path = tmp_path / "kernels-haswell.so"
    q8kernel.compile_library(x86_gcc, path, openmp=True, march="haswell")
    kern = q8kernel.open_library(path, openmp=True)
    assert kern.isa == "avx2"
    _check(kern)


@pytest.mark.parametrize("rows", [2, 4, 8])
def test_batched_rows_are_each_row_alone(kernel, rows):
    """The batched path (M = 2..8) gives each row exactly what it gives that row alone."""
    torch.manual_seed(rows)
    w = Q8Weight.quantize(torch.randn(96, 576))
    x = torch.randn(rows, 576)
    out = kernel.matmul(x, w.packed, w.scales, 96)
    for r in range(rows):
        assert torch.equal(out[r], kernel.matmul(x[r:r + 1], w.packed, w.scales, 96)[0])
