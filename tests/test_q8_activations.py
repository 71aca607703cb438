"""The int8 kernel's activation quantization (``q8.c``'s ``quantize_row``, SIMD for whole
groups since issue 18) is bit for bit the scalar definition, ``test_quant.uint8_codes``."""

from __future__ import annotations

import pytest
import torch
from test_quant import uint8_codes

from inference import q8kernel
from inference.quant import Q8Weight


def _quantized_identity(x: torch.Tensor) -> torch.Tensor:
    """What the kernel returns for x @ I.T with the identity quantized as ``Q8Weight`` (each
    row's one weight 127 at the fp16 scale of 1/127): the scalar quantization of x, multiplied
    out as the SIMD kernels do (the exact integer 127 (q - z), one rounding of it times
    scale x x's scale)."""
    k = x.shape[1]
    codes, scale = uint8_codes(x)
    sw = torch.tensor(1 / 127.0).to(torch.float16).float()
    return ((codes * 127) * (sw * scale)).view(x.shape[0], -1)[:, :k]


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


@pytest.mark.parametrize("march", ["haswell", "skylake-avx512"])
def test_the_avx2_build_quantizes_the_same(march, tmp_path, x86_gcc):
    """AVX2's kernel (and AVX-512 without VNNI: its quantization in 512-bit lanes, stored as
    int16 q - z for AVX2's multiply-adds) computes the same bits."""
    path = tmp_path / f"kernels-{march}.so"
    q8kernel.compile_library(x86_gcc, path, openmp=True, march=march)
    kern = q8kernel.open_library(path, openmp=True)
    assert kern.isa == "avx2"
    _check(kern)


@pytest.mark.parametrize("rows", [2, 4, 8, 20])
def test_batched_rows_are_each_row_alone(kernel, rows):
    """The batched path (M = 2..8) gives each row exactly what it gives that row alone; so
    does a prefill's (20 rows: two chunks of 8 with the block's weight sums taken once for
    both, then 4)."""
    torch.manual_seed(rows)
    w = Q8Weight.quantize(torch.randn(96, 576))
    x = torch.randn(rows, 576)
    out = kernel.matmul(x, w.packed, w.scales, 96)
    for r in range(rows):
        assert torch.equal(out[r], kernel.matmul(x[r:r + 1], w.packed, w.scales, 96)[0])


HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "rowprep.h"
__attribute__((noinline)) static void scalar(const float *g, const float *u, int n, float *o) {
    for (int k = 0; k < n; k++) o[k] = g[k] / (1.0f + fast_exp(-g[k])) * u[k];
}
int main(void) {
    int n = 1 << 16, bad = 0;
    float *g = malloc(4 * n), *u = malloc(4 * n), *a = malloc(4 * n), *b = malloc(4 * n);
    srand(18);
    for (int rep = 0; rep < 16; rep++) {
        float scale = 0.5f + rep * 5.4f; /* up to |g| = 81.5 */
        for (int i = 0; i < n; i++) {
            g[i] = ((float)rand() / RAND_MAX * 2 - 1) * scale;
            u[i] = ((float)rand() / RAND_MAX * 2 - 1) * 4;
        }
        scalar(g, u, n - rep, a);
        silu_mul(g, u, n - rep, b);
        for (int i = 0; i < n - rep; i++) bad += a[i] != b[i];
    }
    printf("%d\n", bad);
    return 0;
}
"""


@pytest.mark.parametrize("march", ["native", "haswell", "x86-64"])
def test_the_simd_swiglu_input_is_the_scalar_formula_bit_for_bit(march, tmp_path, x86_gcc):
    """rowprep.h's silu_mul (the down projection's fused input, mode 2) gives exactly the
    scalar loop's bits on each build, for |gate| up to ~80 and lengths that leave a tail; its
    fast_exp16 / fast_exp8 (fastmath.h) are also attention's softmax exponentials (attn.c)."""
    import subprocess

    src = tmp_path / "h.c"
    src.write_text(HARNESS)
    exe = tmp_path / "h"
    subprocess.run([x86_gcc, "-O3", f"-march={march}", "-I", str(q8kernel.KERNELS), str(src),
                    "-o", str(exe), "-lm"], check=True, capture_output=True, timeout=120)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "0"
