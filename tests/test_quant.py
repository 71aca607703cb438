"""int8 weight-only quantization: rounding, the kernel against a dequantized matmul, the disk
cache, and the quality floor on the default model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inference import q8kernel
from inference.quant import (Int4Weight, Int8Weight, PackedExperts, Q4Weight, Q6Weight,
                             Q8Weight, int4_linear, int8_cache_path, int8_linear, load_int8,
                             q4_linear, q6_linear, q8_linear, save_int8)


def test_quantize_round_trip_error_is_at_most_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(64, 96) * torch.rand(64, 1)  # rows of different scales
    q = Int8Weight.quantize(w, torch.float32)
    assert q.q.dtype == torch.int8 and q.scales.shape == (64,)
    assert q.q.abs().max() <= 127
    err = (q.dequantize(torch.float32) - w).abs()
    assert (err <= q.scales[:, None] / 2 + 1e-7).all()
    # the largest weight of each row lands exactly on +-127
    assert (q.q.abs().amax(dim=1) == 127).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_int8_linear_matches_dequantized_matmul(dtype):
    torch.manual_seed(1)
    w = Int8Weight.quantize(torch.randn(48, 64), dtype)
    x = torch.randn(3, 5, 64, dtype=dtype)
    out = int8_linear(x, w)  # [3, 5, 48]
    ref = x.float() @ w.dequantize(torch.float32).t()
    assert out.shape == (3, 5, 48) and out.dtype == dtype
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    assert torch.allclose(out.float(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_int4_groups_and_kernel():
    torch.manual_seed(2)
    w = torch.randn(64, 96)
    q = Int4Weight.quantize(w)
    assert q.q.max() <= 15 and q.scales_zeros.shape == (3, 64, 2)
    deq = q.dequantize(torch.float32)
    # each group's min and max are on the grid; every weight within half a step (+ bf16)
    step = (w.reshape(64, 3, 32).amax(-1) - w.reshape(64, 3, 32).amin(-1)) / 15
    err = (deq - w).abs().reshape(64, 3, 32)
    assert (err <= step[..., None] * 0.5 + 0.02).all()
    x = torch.randn(4, 96, dtype=torch.bfloat16)
    ref = x.float() @ deq.t()
    out = int4_linear(x, q)
    assert torch.allclose(out.float(), ref, atol=0.03 * ref.abs().max().item())
    # the disk cache keeps int4 unpacked and packs on load
    path = __import__("pathlib").Path(__import__("tempfile").mkdtemp()) / "q.safetensors"
    save_int8(path, {"w": q})
    back = load_int8(path, torch.device("cpu"))["w"]
    assert torch.equal(int4_linear(x, back), out)


def test_the_kernel_builds_on_an_x86_machine_with_a_compiler(x86_gcc):
    """CI's machine is one: a kernel that stops building must fail here, not silently fall
    back to torch's slower, less accurate per-channel int8."""
    kernel = q8kernel.load_kernel()
    assert kernel is not None and kernel.isa in q8kernel.FAST_ISAS and kernel.openmp


@pytest.mark.parametrize("march", ["native", "haswell", "x86-64"])
def test_the_fp16_cache_stores_what_torch_rounds_to(march, tmp_path, x86_gcc, kernel):
    """``attn.c``'s fp16 cache (int8 and int4 decoding): every build stores a new value as
    torch's float16 rounding does (nearest even; subnormals, overflow to inf, 65504 kept), the
    portable build in software and the others with F16C, so a cache written by one CPU reads
    the same on another; and attention over the fp16 cache equals attention over its values in
    fp32."""
    if march == "native":
        kern = kernel
    else:
        path = tmp_path / f"kernels-{march}.so"
        q8kernel.compile_library(x86_gcc, path, openmp=True, march=march)
        kern = q8kernel.open_library(path, openmp=True)
    H, KV, D, C, w = 2, 1, 16, 8, 5
    torch.manual_seed(3)
    special = torch.tensor([0.0, -0.0, 1e-8, 2.0 ** -24, 2.0 ** -25, 3 * 2.0 ** -25,
                            2.0 ** -14 * 1.0009765625, 65504.0, 65519.0, 65520.0, 1e6, -1e6,
                            1 / 3, -2.5, 1.00048828125, 1.00146484375])
    qkv = torch.randn(1, (H + 2 * KV) * D)
    qkv[0, (H + KV) * D:] = special  # the value row is stored as given (no RoPE)
    kc = torch.randn(1, KV, C, D).half()
    vc = torch.randn(1, KV, C, D).half()
    pos = torch.tensor([w])
    cos, sin = torch.ones(C, D // 2), torch.zeros(C, D // 2)  # RoPE of angle 0: keys as given
    out = kern.attention(qkv, kc, vc, w, pos, cos, sin, None, H)
    assert torch.equal(vc[0, 0, w].view(torch.int16), special.half().view(torch.int16))
    assert torch.equal(kc[0, 0, w].view(torch.int16),
                       qkv[0, H * D:(H + 1) * D].half().view(torch.int16))
    # the fp32 cache of the same values (the new key and value as the fp16 cache holds them):
    # the same arithmetic (up to the order the compiler sums in), inf where values overflowed
    q16 = qkv.clone()
    q16[0, H * D:] = qkv[0, H * D:].half().float()
    ref = kern.attention(q16, kc.float(), vc.float(), w, pos, cos, sin, None, H)
    finite = torch.isfinite(ref)
    assert torch.equal(finite, torch.isfinite(out)) and not finite.all()
    assert torch.allclose(out[finite], ref[finite], rtol=1e-5, atol=1e-6)


def test_the_weights_are_fetched_into_l2_unless_told_otherwise():
    """q8.c's weight stream goes into L2 on every CPU: non-temporal fetches lost on AMD once the
    weights ran from huge pages and left an Intel Xeon decoding at a third of its speed
    (README, issue 18); ``CHATUI_WEIGHT_FETCH=nontemporal`` still builds them, to measure."""
    nt = ("-DCHATUI_WEIGHTS_NT=1",)
    assert q8kernel.weight_fetch_defines() == ()
    assert q8kernel.weight_fetch_defines(" L2 ") == ()
    assert q8kernel.weight_fetch_defines("bogus") == ()
    assert q8kernel.weight_fetch_defines("nontemporal") == nt
    assert q8kernel.weight_fetch_defines(" NonTemporal ") == nt


def test_an_unknown_weight_fetch_is_reported_and_ignored(monkeypatch, caplog, x86_gcc):
    monkeypatch.setenv("CHATUI_WEIGHT_FETCH", "temporal")
    with caplog.at_level("WARNING", logger="inference.q8kernel"):
        plan = q8kernel.plan_build()
    monkeypatch.delenv("CHATUI_WEIGHT_FETCH")
    assert plan.path == q8kernel.plan_build().path
    assert "CHATUI_WEIGHT_FETCH=temporal is not one of nontemporal, l2" in caplog.text


def test_either_weight_fetch_gives_the_same_bits(tmp_path, x86_gcc, kernel, monkeypatch):
    """The other weight fetch, built here, multiplies to the same bits at every row count
    (a fetch is a hint; the arithmetic must not depend on it); the plan's key tells them apart."""
    plan = q8kernel.plan_build()
    other = () if plan.defines else ("-DCHATUI_WEIGHTS_NT=1",)
    monkeypatch.setenv("CHATUI_WEIGHT_FETCH", "l2" if plan.defines else "nontemporal")
    assert q8kernel.plan_build().path != plan.path
    path = tmp_path / "kernels-other-fetch.so"
    q8kernel.compile_library(x86_gcc, path, openmp=True, defines=other)
    theirs = q8kernel.open_library(path, openmp=True)
    torch.manual_seed(11)
    w = Q8Weight.quantize(torch.randn(200, 1536))  # 48 groups: the fetches run past blocks
    for m in (1, 2, 4, 8):
        x = torch.randn(m, 1536)
        assert torch.equal(theirs.matmul(x, w.packed, w.scales, 200),
                           kernel.matmul(x, w.packed, w.scales, 200))


@pytest.mark.parametrize("march", ["haswell", "x86-64"])
def test_kernels_built_for_other_cpus_give_the_same_results(march, tmp_path, x86_gcc):
    """The AVX2 code (an older or smaller CPU) and the portable C code, built here for those
    CPUs, against the same float64 references: this machine only runs its own best path."""
    path = tmp_path / f"kernels-{march}.so"
    q8kernel.compile_library(x86_gcc, path, openmp=True, march=march)
    kernel = q8kernel.open_library(path, openmp=True)
    assert kernel.isa == {"haswell": "avx2", "x86-64": "generic"}[march]
    torch.manual_seed(10)
    w = Q8Weight.quantize(torch.randn(40, 70))
    x = torch.randn(3, 70) * torch.logspace(-1, 1, 70)
    norm = torch.rand(70) + 0.5
    for out, ref in (
            (kernel.matmul(x, w.packed, w.scales, 40), q8_reference(x, w)),
            (kernel.matmul(x, w.packed, w.scales, 40, norm=norm, eps=1e-5),
             q8_reference(torch.nn.functional.rms_norm(x, (70,), norm, 1e-5), w))):
        assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    xs = torch.randn(9, 70)  # the multi-row path: each row as alone, bit for bit
    rows = kernel.matmul(xs, w.packed, w.scales, 40)
    for r in range(9):
        assert torch.equal(rows[r], kernel.matmul(xs[r:r + 1], w.packed, w.scales, 40)[0])
    w4 = Q4Weight.quantize(torch.randn(40, 70))
    assert kernel.lib.q4_isa().decode() == kernel.isa
    for norm4 in (None, norm):
        out = kernel.q4_matmul(x, w4.packed, w4.scales, 40, norm=norm4, eps=1e-5)
        xin = x if norm4 is None else torch.nn.functional.rms_norm(x, (70,), norm4, 1e-5)
        ref = q4_reference(xin, w4)
        assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    w6 = Q6Weight.quantize(torch.randn(40, 300))  # a short last super-block
    x6 = torch.randn(9, 300) * torch.logspace(-1, 1, 300)
    norm6 = torch.rand(300) + 0.5
    for norm_ in (None, norm6):
        out = torch.empty(9, 40)
        kernel.run6(x6, w6.packed, w6.scales, out, norm_, 1e-5, False)
        xin = x6 if norm_ is None else torch.nn.functional.rms_norm(x6, (300,), norm_, 1e-5)
        ref = q6_reference(xin, w6)
        assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
        for r in range(9):  # the multi-row block: each row as alone, bit for bit
            one = torch.empty(1, 40)
            kernel.run6(x6[r:r + 1], w6.packed, w6.scales, one, norm_, 1e-5, False)
            assert torch.equal(one[0], out[r])
    for cls, fn in ((Q8Weight, kernel.matmul), (Q4Weight, kernel.q4_matmul)):
        def linear(x, w, swiglu=False, fn=fn):
            return fn(x.float().contiguous(), w.packed, w.scales, w.n, swiglu=swiglu)
        _experts_check(kernel, cls, linear)
        _batch_experts_check(kernel, cls, linear)
    wf = torch.randn(70, 37)
    xf = torch.randn(2, 37)
    ref = xf.double() @ wf.double().t()
    assert (kernel.f32_linear(xf, wf).double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    # attention: 2 KV heads of 2 query heads each, D = 64, 300 keys; against a float64 softmax
    B, H, KV, D, C, write = 1, 4, 2, 64, 320, 299
    qkv = torch.randn(B, (H + 2 * KV) * D)
    kc, vc = torch.randn(B, KV, C, D), torch.randn(B, KV, C, D)
    cos, sin = torch.ones(C, D // 2), torch.zeros(C, D // 2)  # RoPE as the identity
    out = kernel.attention(qkv, kc, vc, write, torch.tensor([write]), cos, sin, None, H)
    q = qkv[0, :H * D].view(H, D).double()
    keys = kc[0, :, :write + 1].double().repeat_interleave(H // KV, 0)
    values = vc[0, :, :write + 1].double().repeat_interleave(H // KV, 0)
    assert torch.equal(kc[0, :, write], qkv[0, H * D:(H + KV) * D].view(KV, D))
    p = torch.softmax((keys @ q[:, :, None])[..., 0] / D ** 0.5, -1)
    ref = (p[:, None, :] @ values)[:, 0].reshape(-1)
    assert (out[0].double() - ref).abs().max() <= 1e-5


def test_q8_groups_round_trip_within_half_a_step():
    torch.manual_seed(3)
    w = torch.randn(40, 70) * torch.rand(40, 1)  # N, K not multiples of 16, 32
    q = Q8Weight.quantize(w)
    assert q.shape == (40, 70) and q.packed.shape == (3, 3, 16, 16, 2)
    deq = q.dequantize(torch.float32)
    assert deq.shape == (40, 70)
    wp = torch.nn.functional.pad(w, (0, 26))
    step = wp.view(40, 3, 32).abs().amax(-1) / 127  # [N, G]
    err = torch.nn.functional.pad(deq - w, (0, 26)).view(40, 3, 32).abs()
    # half a step, plus the scale's own fp16 rounding (2^-11 relative) carried to each weight
    assert (err <= step[..., None] / 2 + wp.view(40, 3, 32).abs() * 2 ** -11 + 1e-7).all()
    assert q.scales.dtype == torch.float16
    chunked = Q8Weight.quantize(w, chunk_rows=16)  # the same, a block of rows at a time
    assert torch.equal(chunked.packed, q.packed) and torch.equal(chunked.scales, q.scales)
    ids = torch.tensor([[0, 17], [39, 5]])
    assert torch.equal(q.rows(ids, torch.float32), deq[ids])


@pytest.mark.parametrize("m", [1, 3, 9, 17])
@pytest.mark.parametrize("nk", [(48, 64), (40, 70), (1000, 576)])
def test_q8_kernel_matches_the_dequantized_matmul(m, nk, kernel):
    """Against the dequantized weights times the kernel's 8-bit activations in float64 (to
    ~1e-6: the kernel's float32 sums), and within 8-bit activations' rounding of the float64
    product of the unquantized ones (~2e-3 here: 0.4 % of a group's range a value at most)."""
    torch.manual_seed(4)
    n, k = nk
    w = Q8Weight.quantize(torch.randn(n, k))
    x = torch.randn(2, m, k) * torch.logspace(-2, 2, k)  # groups of very different scales
    out = q8_linear(x, w)
    assert out.shape == (2, m, n) and out.dtype == torch.float32
    ref = q8_reference(x, w).view(2, m, n)
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    exact = x.double() @ w.dequantize(torch.float64).t()
    assert (out.double() - exact).abs().max() <= 1e-2 * exact.abs().max()
    assert torch.equal(q8_linear(x.bfloat16(), w), q8_linear(x.bfloat16().float(), w))


@pytest.mark.parametrize("m", [1, 6])
def test_q8_kernel_fuses_the_norm_and_swiglu(m, kernel):
    torch.manual_seed(5)
    w = Q8Weight.quantize(torch.randn(40, 70))
    x, norm = torch.randn(m, 70) * 3, torch.rand(70) + 0.5
    ref = q8_reference(torch.nn.functional.rms_norm(x, (70,), norm, 1e-5), w)
    out = q8_linear(x, w, norm=norm, eps=1e-5)
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    gate_up = torch.randn(m, 140) * 2
    gate, up = gate_up.chunk(2, dim=-1)
    ref = q8_reference(torch.nn.functional.silu(gate) * up, w)
    out = q8_linear(gate_up, w, swiglu=True)
    assert out.shape == (m, 40) and (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


@pytest.mark.parametrize("m", [1, 6])
def test_q8_kernel_fuses_tanh_gelu_for_gemma(m, kernel):
    """Mode 3 (decode.c's down projection of a Gemma MLP): gelu_tanh(gate) * up, against
    float64 with torch's tanh GELU."""
    torch.manual_seed(6)
    w = Q8Weight.quantize(torch.randn(40, 70))
    gate_up = torch.randn(m, 140) * 3
    gate, up = gate_up.chunk(2, dim=-1)
    ref = q8_reference(torch.nn.functional.gelu(gate, approximate="tanh") * up, w)
    out = torch.empty(m, 40)
    kernel.lib.q8_matmul(gate_up.data_ptr(), m, 70, w.packed.data_ptr(), w.scales.data_ptr(), 40,
                         out.data_ptr(), 1, 3, None, 0.0)
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_embedding_rows_and_softcap_in_c_equal_torch(kernel):
    """vocab.c: an int8 embedding's rows times Gemma's scale are bitwise Q8Weight.rows times
    it; soft-capping is within a few ulps of float64's cap * tanh(y / cap)."""
    torch.manual_seed(7)
    w = Q8Weight.quantize(torch.randn(100, 70) * 0.1)
    ids = torch.tensor([[0, 17, 99], [39, 5, 16]])
    for mul in (1.0, 33.941125):
        ref = w.rows(ids, torch.float32) * mul
        assert torch.equal(kernel.q8_rows(ids, w.packed, w.scales, 70, mul), ref)
    y = torch.randn(5000) * 40
    ref = torch.tanh(y.double() / 30.0) * 30.0
    got = kernel.softcap(y.clone(), 30.0)
    assert (got.double() - ref).abs().max() <= 1e-5 * 30.0


@pytest.mark.parametrize("m", [1, 2, 4, 5, 8])
@pytest.mark.parametrize("nk", [(70, 37), (64, 576), (1000, 100), (130, 64)])
def test_f32_kernel_matches_a_float64_matmul(m, nk, kernel):
    """fp32 decode's matrix-vector product (f32.c): K with a tail under 16, N past 4 and 64;
    and every row of x gets the bits it gets alone (a comparison's 5-8 columns too)."""
    torch.manual_seed(8)
    n, k = nk
    w, x = torch.randn(n, k), torch.randn(m, k)
    out = kernel.f32_linear(x, w)
    ref = x.double() @ w.double().t()
    assert out.shape == (m, n) and (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    for r in range(m):
        assert torch.equal(out[r], kernel.f32_linear(x[r:r + 1], w)[0])


def int8_groups(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the int4 kernel quantizes it: int8 per group of 32 along K, symmetric, round
    to nearest (float64, dequantized; padded with zeros to whole groups)."""
    m, k = x.shape
    g = -(-k // 32)
    xp = torch.nn.functional.pad(x.double(), (0, g * 32 - k)).view(m, g, 32)
    amax = xp.abs().amax(-1, keepdim=True)
    xq = torch.where(amax > 0, torch.round(xp * (127 / amax.clamp(min=1e-300))), 0.0)
    return (xq * amax / 127).view(m, g * 32)


def uint8_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] as the int8 kernel quantizes it, in float32 as the kernel computes it: 8 bits
    per group of 32 along K (zeros past K), lo = min(0, min x), hi = max(0, max x),
    inv = 255 / (hi - lo), zero point z = round(-lo * inv), q = clamp(round(x * inv) + z, 0,
    255), scale (hi - lo) / 255, rounded to nearest even (as lrintf and vcvtps2dq). Returns
    q - z [M, G, 32] and scale [M, G, 1] (x is scale * (q - z)); an all-zero group has 0s."""
    m, k = x.shape
    g = -(-k // 32)
    xp = torch.nn.functional.pad(x.float(), (0, g * 32 - k)).view(m, g, 32)
    lo = xp.amin(-1, keepdim=True).clamp(max=0.0)
    hi = xp.amax(-1, keepdim=True).clamp(min=0.0)
    span = hi - lo
    inv = torch.where(span > 0, torch.tensor(255.0) / span, torch.zeros_like(span))
    zero = torch.round(-lo * inv)
    q = (torch.round(xp * inv) + zero).clamp(0, 255)
    scale = torch.where(span > 0, span / torch.tensor(255.0), torch.zeros_like(span))
    return q - zero, scale


def uint8_groups(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] as the int8 kernel quantizes it (``uint8_codes``; ``tests/test_q8_activations.py``
    checks the codes bit for bit), dequantized in float64, padded with zeros to whole groups."""
    codes, scale = uint8_codes(x)
    return (codes.double() * scale.double()).view(x.shape[0], -1)


def q8_reference(x: torch.Tensor, w: Q8Weight) -> torch.Tensor:
    """What the int8 kernel computes, in float64: the dequantized weights times the 8-bit
    activations of ``uint8_groups`` (so the kernel is checked to ~1e-6, not to the
    activations' rounding). x is what the kernel quantizes (after any fused norm or SwiGLU,
    computed here in float32 as the kernel does: a code can differ where the two land on
    either side of a rounding boundary, one step of one group)."""
    deq = torch.nn.functional.pad(w.dequantize(torch.float64), (0, -(-w.k // 32) * 32 - w.k))
    return uint8_groups(x.reshape(-1, x.shape[-1])) @ deq.t()


def q4_reference(x: torch.Tensor, w: Q4Weight) -> torch.Tensor:
    """What the int4 kernel computes, in float64: the dequantized weights times the int8
    activations (so the kernel is checked to ~1e-6, not to the activations' rounding)."""
    deq = torch.nn.functional.pad(w.dequantize(torch.float64), (0, -(-w.k // 32) * 32 - w.k))
    return int8_groups(x.reshape(-1, x.shape[-1])) @ deq.t()


def q6_reference(x: torch.Tensor, w: Q6Weight) -> torch.Tensor:
    """What the 6-bit kernel computes, in float64: the dequantized weights times the int8
    activations (as ``q4_reference``)."""
    deq = torch.nn.functional.pad(w.dequantize(torch.float64), (0, -(-w.k // 32) * 32 - w.k))
    return int8_groups(x.reshape(-1, x.shape[-1])) @ deq.t()


def test_q6_groups_round_trip_and_gguf_q6_k_blocks():
    """The layout is a reorder (groups() gives back what from_groups took), and Q6_K blocks as
    llama.cpp writes them load to exactly the weights gguf dequantizes them to."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    torch.manual_seed(21)
    n, k = 40, 320  # a short last super-block (K need not be a multiple of 256)
    q = torch.randint(0, 64, (n, k), dtype=torch.uint8)
    sc = torch.randint(-128, 128, (n, 20), dtype=torch.int8)
    d = (torch.rand(n, 2) * 0.01).half()
    w = Q6Weight.from_groups(q, sc, d)
    assert w.packed.shape == (3, 10, 416) and w.scales.shape == (3, 2, 16)
    q2, sc2, d2 = w.groups()
    assert torch.equal(q2, q) and torch.equal(sc2, sc) and torch.equal(d2, d)
    step = sc.double() * d.double().repeat_interleave(16, 1)[:, :20]
    deq = (q.double().view(n, 20, 16) - 32) * step[..., None]
    assert torch.equal(w.dequantize(torch.float64), deq.view(n, k))
    ids = torch.tensor([[39, 0], [17, 17]])
    assert torch.equal(w.rows(ids, torch.float32), w.dequantize(torch.float32)[ids])
    # Q6_K: random blocks (a finite fp16 d), as llama.cpp's block_q6_K
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (n, 2, 210), dtype=np.uint8)
    blocks[..., 208:] = np.frombuffer(rng.uniform(1e-4, 0.01, (n, 2)).astype(np.float16)
                                      .tobytes(), dtype=np.uint8).reshape(n, 2, 2)
    ref = torch.from_numpy(quants.dequantize(blocks.reshape(n, 420), T.Q6_K)).double()
    got = Q6Weight.from_gguf_blocks(blocks, (n, 512))
    assert torch.equal(got.dequantize(torch.float64), ref)
    with pytest.raises(ValueError, match="takes 210 bytes, got 18"):
        Q6Weight.from_gguf_blocks(bytes(18), (1, 256))
    with pytest.raises(ValueError, match="not whole blocks of 256"):
        Q6Weight.from_gguf_blocks(bytes(210), (1, 320))


def test_q6_quantize_within_half_a_step():
    """Each sub-block of 16 is rounded with a step of at least max|w| / 31 (never clipped) and
    at most that plus one step of its row's d (the int8 scale rounded up)."""
    torch.manual_seed(22)
    w = torch.randn(40, 300) * torch.rand(40, 1) * 0.05
    q = Q6Weight.quantize(w)
    assert q.shape == (40, 300)
    err = torch.nn.functional.pad(q.dequantize(torch.float32) - w, (0, 20)).view(40, 20, 16)
    sub = torch.nn.functional.pad(w, (0, 20)).view(40, 20, 16).abs().amax(-1)
    d = sub.view(40, 2, -1).amax(-1) / 31 / 127  # [40, 2]: d before fp16 rounding
    step = sub / 31 + d.repeat_interleave(16, 1)[:, :20] * 1.01
    assert (err.abs() <= step[..., None] * 0.5 + 1e-7).all()
    chunked = Q6Weight.quantize(w, chunk_rows=16)
    assert torch.equal(chunked.packed, q.packed) and torch.equal(chunked.scales, q.scales)


@pytest.mark.parametrize("m", [1, 3, 9])
@pytest.mark.parametrize("nk", [(48, 64), (40, 70), (1000, 576), (33, 768)])
def test_q6_kernel_matches_the_dequantized_matmul(m, nk, kernel):
    """The 6-bit kernel against a float64 reference (the dequantized weights times its int8
    activations) to ~1e-6, with the fused norm, and within ~1 % of the exact product."""
    torch.manual_seed(23)
    n, k = nk
    w = Q6Weight.quantize(torch.randn(n, k))
    x = torch.randn(2, m, k) * torch.logspace(-2, 2, k)
    out = q6_linear(x, w)
    assert out.shape == (2, m, n) and out.dtype == torch.float32
    ref = q6_reference(x, w).view(2, m, n)
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    exact = x.double() @ w.dequantize(torch.float64).t()
    assert (out.double() - exact).abs().max() <= 2e-2 * exact.abs().max()
    norm = torch.rand(k) + 0.5
    ref = q6_reference(torch.nn.functional.rms_norm(x.double(), (k,), norm.double(), 1e-5), w)
    out = q6_linear(x, w, norm=norm, eps=1e-5)
    assert (out.double() - ref.view(2, m, n)).abs().max() <= 1e-5 * ref.abs().max()
    path = Path(__import__("tempfile").mkdtemp()) / "q6.safetensors"  # the disk cache
    save_int8(path, {"w": w})
    back = load_int8(path, torch.device("cpu"))["w"]
    assert isinstance(back, Q6Weight) and back.shape == (n, k)
    assert torch.equal(q6_linear(x, back, norm=norm, eps=1e-5), out)


def test_q4_groups_round_trip_and_gguf_blocks():
    """The layout is a reorder: groups() gives back what from_groups took; Q4_0 and Q4_1
    blocks written by the gguf package load to exactly the weights gguf dequantizes them to,
    and Q4_K blocks to within the fp16 rounding of each sub-block's scale and min."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import quants

    torch.manual_seed(11)
    n, k = 40, 96
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    d, m = torch.rand(n, 3).half(), -torch.rand(n, 3).half()
    w = Q4Weight.from_groups(q, d, m)
    assert w.packed.shape == (3, 3, 4, 64) and w.scales.shape == (3, 3, 2, 16)
    q2, d2, m2 = w.groups()
    assert torch.equal(q2, q) and torch.equal(d2, d) and torch.equal(m2, m)
    deq = (q.float().view(n, 3, 32) * d.float()[..., None] + m.float()[..., None]).view(n, k)
    assert torch.equal(w.dequantize(torch.float32), deq)
    wf = (torch.randn(n, 256) * torch.rand(n, 1)).numpy()
    for name, qtype in (("Q4_0", T.Q4_0), ("Q4_1", T.Q4_1)):
        raw = quants.quantize(wf, qtype)  # [n, 256 / 32 * block bytes] uint8
        ref = torch.from_numpy(quants.dequantize(raw, qtype))
        got = Q4Weight.from_gguf_blocks(raw.tobytes(), name, (n, 256))
        assert torch.equal(got.dequantize(torch.float32), ref), name
    # Q4_K: random super-blocks (finite fp16 d and dmin), as llama.cpp's block_q4_K
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (n, 2, 144), dtype=np.uint8)
    blocks[..., :4] = np.frombuffer(rng.uniform(0.001, 0.05, (n, 2, 2)).astype(np.float16)
                                    .tobytes(), dtype=np.uint8).reshape(n, 2, 4)
    ref = torch.from_numpy(quants.dequantize(blocks.reshape(n, 288), T.Q4_K)).double()
    got = Q4Weight.from_gguf_blocks(torch.from_numpy(blocks), "Q4_K", (n, 512))
    q, d, m = got.groups()
    bound = 15 * d.double().abs() * 2 ** -11 + m.double().abs() * 2 ** -11  # [n, G]
    err = (got.dequantize(torch.float64) - ref).abs().view(n, 16, 32)
    assert (err <= bound[..., None] + 1e-9).all()
    with pytest.raises(ValueError, match="Q5_K is not a 4-bit GGUF block type"):
        Q4Weight.from_gguf_blocks(b"", "Q5_K", (1, 32))
    with pytest.raises(ValueError, match="takes 36 bytes, got 18"):
        Q4Weight.from_gguf_blocks(bytes(18), "Q4_0", (1, 64))


def test_q4_quantize_within_half_a_step():
    torch.manual_seed(12)
    w = torch.randn(40, 70) * torch.rand(40, 1)
    q = Q4Weight.quantize(w)
    assert q.shape == (40, 70)
    wp = torch.nn.functional.pad(w, (0, 26)).view(40, 3, 32)
    step = (wp.amax(-1) - wp.amin(-1)) / 15
    err = torch.nn.functional.pad(q.dequantize(torch.float32) - w, (0, 26)).view(40, 3, 32)
    # half a step, plus fp16's rounding of the scale (15 steps) and of the min
    assert (err.abs() <= step[..., None] * (0.5 + 15 * 2 ** -11) + wp.abs().amax(-1, True)
            * 2 ** -10 + 1e-6).all()
    chunked = Q4Weight.quantize(w, chunk_rows=16)
    assert torch.equal(chunked.packed, q.packed) and torch.equal(chunked.scales, q.scales)


@pytest.mark.parametrize("m", [1, 3, 9, 17])
@pytest.mark.parametrize("nk", [(48, 64), (40, 70), (1000, 576)])
def test_q4_kernel_matches_the_dequantized_matmul(m, nk, kernel):
    """The int4 kernel against a float64 reference: to ~1e-6 of the dequantized weights times
    the int8 activations it computes with, and to ~1 % of the exact product (the activations'
    int8 rounding, as llama.cpp's Q8 activations)."""
    torch.manual_seed(13)
    n, k = nk
    w = Q4Weight.quantize(torch.randn(n, k))
    x = torch.randn(2, m, k) * torch.logspace(-2, 2, k)
    out = q4_linear(x, w)
    assert out.shape == (2, m, n) and out.dtype == torch.float32
    ref = q4_reference(x, w).view(2, m, n)
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    exact = x.double() @ w.dequantize(torch.float64).t()
    assert (out.double() - exact).abs().max() <= 2e-2 * exact.abs().max()
    assert torch.equal(q4_linear(x.bfloat16(), w), q4_linear(x.bfloat16().float(), w))


@pytest.mark.parametrize("m", [1, 6])
def test_q4_kernel_fuses_the_norm_and_swiglu(m, kernel):
    torch.manual_seed(14)
    w = Q4Weight.quantize(torch.randn(40, 70))
    x, norm = torch.randn(m, 70) * 3, torch.rand(70) + 0.5
    ref = q4_reference(torch.nn.functional.rms_norm(x.double(), (70,), norm.double(), 1e-5), w)
    out = q4_linear(x, w, norm=norm, eps=1e-5)
    assert (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    gate_up = torch.randn(m, 140) * 2
    gate, up = gate_up.double().chunk(2, dim=-1)
    ref = q4_reference(torch.nn.functional.silu(gate) * up, w)
    out = q4_linear(gate_up, w, swiglu=True)
    assert out.shape == (m, 40) and (out.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    # the disk cache keeps the kernel's layout as is
    path = Path(__import__("tempfile").mkdtemp()) / "q4.safetensors"
    save_int8(path, {"w": w})
    back = load_int8(path, torch.device("cpu"))["w"]
    assert isinstance(back, Q4Weight) and back.shape == (40, 70)
    assert torch.equal(q4_linear(gate_up, back, swiglu=True), out)


def _experts_check(kernel: q8kernel.Q8Kernel, cls: type, linear) -> None:
    """A mixture's chosen experts in two ``matmul_sel`` calls give exactly what one matmul
    per expert and projection gives (the same blocks, the same activation rounding), and the
    float64 product of the dequantized weights within the activations' rounding."""
    torch.manual_seed(15)
    E, h, inter = 5, 70, 40  # K not a multiple of 32 in both projections
    experts = [(cls.quantize(torch.randn(2 * inter, h)), cls.quantize(torch.randn(h, inter)))
               for _ in range(E)]
    packed = PackedExperts.of(experts)
    assert packed is not None and packed.bits == (8 if cls is Q8Weight else 4)
    x = torch.randn(2, h) * 3
    ids = torch.tensor([[3, 0, 4], [1, 1, 2]])
    sel = ids.reshape(-1)
    gu = torch.empty(6, 2 * inter)
    kernel.matmul_sel(packed.bits, x, 3, *packed.gate_up, sel, gu, False)
    down = torch.empty(6, h)
    kernel.matmul_sel(packed.bits, gu, 1, *packed.down, sel, down, True)
    for p, e in enumerate(sel.tolist()):
        a, b = experts[e]
        one = linear(x[p // 3: p // 3 + 1], a)
        assert torch.equal(gu[p], one[0])
        assert torch.equal(down[p], linear(one, b, swiglu=True)[0])
        g, u = (x[p // 3].double() @ a.dequantize(torch.float64).t()).chunk(2)
        ref = (torch.nn.functional.silu(g) * u) @ b.dequantize(torch.float64).t()
        tol = 3e-2  # 8-bit activations
        assert (down[p].double() - ref).abs().max() <= tol * ref.abs().max()


@pytest.mark.parametrize("cls", [Q8Weight, Q4Weight])
def test_chosen_experts_in_one_call_equal_a_call_per_expert(cls, kernel):
    _experts_check(kernel, cls, q8_linear if cls is Q8Weight else q4_linear)
    experts = [(cls.quantize(torch.randn(64, 32)), cls.quantize(torch.randn(32, 32)))] * 2
    packed = PackedExperts.of(experts)
    w = torch.tensor([[0.25, 0.75]])
    x = torch.randn(1, 32)
    linear = q8_linear if cls is Q8Weight else q4_linear
    one = linear(linear(x, experts[0][0]), experts[0][1], swiglu=True)
    assert torch.allclose(packed(x, torch.tensor([[0, 1]]), w), one, rtol=1e-6, atol=1e-6)
    mixed = [(Q8Weight.quantize(torch.randn(64, 32)), Q4Weight.quantize(torch.randn(32, 32)))]
    assert PackedExperts.of(mixed) is None  # one weight type only (else: a call per expert)


@pytest.mark.parametrize("cls", [Q8Weight, Q4Weight])
def test_a_batch_whose_rows_chose_the_same_experts_gives_each_row_as_alone(cls, kernel):
    _batch_experts_check(kernel, cls, q8_linear if cls is Q8Weight else q4_linear)


def _batch_experts_check(kernel: q8kernel.Q8Kernel, cls: type, linear) -> None:
    """A batch's products of one expert go through the kernel together (q4.c groups them, up
    to 8 rows at a time): 11 rows, most on one expert, in any order, each bit for bit what its
    own call gives."""
    torch.manual_seed(16)
    experts = [(cls.quantize(torch.randn(40, 70)), cls.quantize(torch.randn(70, 20)))
               for _ in range(3)]
    packed = PackedExperts.of(experts)
    assert packed is not None
    x = torch.randn(11, 70)
    sel = torch.tensor([2, 2, 0, 2, 2, 2, 1, 2, 2, 2, 2], dtype=torch.int64)
    gu = torch.empty(11, 40)
    kernel.matmul_sel(packed.bits, x, 1, *packed.gate_up, sel, gu, False)
    down = torch.empty(11, 70)
    kernel.matmul_sel(packed.bits, gu, 1, *packed.down, sel, down, True)
    for p, e in enumerate(sel.tolist()):
        one = linear(x[p:p + 1], experts[e][0])
        assert torch.equal(gu[p], one[0])
        assert torch.equal(down[p], linear(gu[p:p + 1], experts[e][1], swiglu=True)[0])


def test_q8_kernel_inside_torch_compile(kernel):
    w = Q8Weight.quantize(torch.randn(64, 96))
    x = torch.randn(2, 96)
    norm = torch.rand(96)
    f = lambda t: torch.relu(q8_linear(t, w)) * 2 + q8_linear(t, w, norm=norm, eps=1e-6)  # noqa: E731
    assert torch.allclose(torch.compile(f, fullgraph=True)(x), f(x))
    w4 = Q4Weight.quantize(torch.randn(64, 96))
    f4 = lambda t: torch.relu(q4_linear(t, w4)) * 2 + q4_linear(t, w4, norm=norm, eps=1e-6)  # noqa: E731
    assert torch.allclose(torch.compile(f4, fullgraph=True)(x), f4(x))
    w6 = Q6Weight.quantize(torch.randn(64, 96))
    f6 = lambda t: torch.relu(q6_linear(t, w6, norm=norm, eps=1e-6)) * 2  # noqa: E731
    assert torch.allclose(torch.compile(f6, fullgraph=True)(x), f6(x))


def test_embedding_rows_are_dequantized_rows():
    w = Int8Weight.quantize(torch.randn(10, 8), torch.float32)
    ids = torch.tensor([[3, 7], [0, 9]])
    assert torch.allclose(w.rows(ids, torch.float32), w.dequantize(torch.float32)[ids])


def test_cache_path_inside_chatui_cache_else_quantized_dir(tmp_path: Path):
    root = tmp_path / "cache"
    model_dir = root / "models" / "m-123"
    model_dir.mkdir(parents=True)
    assert int8_cache_path(model_dir, "abc", root).parent == model_dir
    elsewhere = tmp_path / "user-model"
    elsewhere.mkdir()
    p = int8_cache_path(elsewhere, "abc", root)
    assert p.parent == root / "quantized" and "abc" in p.name


def test_save_load_round_trip_and_corrupt_file(tmp_path: Path):
    ws = {"a": Int8Weight.quantize(torch.randn(4, 6), torch.bfloat16),
          "b.c": Int8Weight.quantize(torch.randn(2, 6), torch.bfloat16)}
    path = tmp_path / "x" / "int8.safetensors"
    save_int8(path, ws)
    back = load_int8(path, torch.device("cpu"))
    assert back is not None and set(back) == {"a", "b.c"}
    for k in ws:
        assert torch.equal(back[k].q, ws[k].q) and torch.equal(back[k].scales, ws[k].scales)
    # a new layout version replaces the files of older ones for the same weights
    root = tmp_path / "models" / "m"
    root.mkdir(parents=True)
    old = root / "int8-v1-abc.safetensors"
    other_kind, other_hash = root / "int4-v1-abc.safetensors", root / "int8-v1-def.safetensors"
    for p in (old, other_kind, other_hash):
        p.write_bytes(b"x")
    new = int8_cache_path(root, "abc", tmp_path, "int8")
    save_int8(new, ws)
    assert new.is_file() and not old.exists() and other_kind.exists() and other_hash.exists()
    q8 = {"g": Q8Weight.quantize(torch.randn(20, 40))}
    save_int8(path, q8)
    g = load_int8(path, torch.device("cpu"))["g"]
    assert isinstance(g, Q8Weight) and g.shape == (20, 40)
    assert torch.equal(g.packed, q8["g"].packed) and torch.equal(g.scales, q8["g"].scales)
    assert load_int8(tmp_path / "missing.safetensors", torch.device("cpu")) is None
    path.write_bytes(b"not a safetensors file")
    assert load_int8(path, torch.device("cpu")) is None


def test_build_runner_reuses_the_disk_cache(tiny_ckpt, tmp_path, monkeypatch):
    from inference import quant
    from inference.runner import build_runner
    from inference.types import Progress

    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    stages: list[Progress] = []
    first = build_runner(tiny_ckpt, quantize="int8", precision="auto", progress=stages.append)
    assert first.int8_path.is_file()
    assert any("int8" in p.stage for p in stages)

    def boom(*a, **k):
        raise AssertionError("quantized again instead of loading the cache")

    monkeypatch.setattr(quant.Int8Weight, "quantize", classmethod(boom))
    monkeypatch.setattr(quant.Q8Weight, "quantize", classmethod(boom))
    second = build_runner(tiny_ckpt, quantize="int8", precision="auto")
    ids = torch.tensor([[1, 5, 9, 14]])
    a = first.forward(first.new_cache(), ids)
    b = second.forward(second.new_cache(), ids)
    assert torch.equal(a, b)


def test_unknown_quantization_is_refused(tiny_ckpt):
    from inference.engine import LocalBackend

    from inference.runner import RunnerError

    with pytest.raises(RunnerError, match="auto, none, int8 or int4"):
        LocalBackend.from_checkpoint(tiny_ckpt, quantize="int3")


def test_quality_floor_on_the_default_model(default_ckpt, monkeypatch):
    """Measured on inference.quality.SAMPLE_TEXT (762 tokens) against the fp32 model.

    The issue's bar is >= 97 % top-1 agreement and <= 2 % perplexity for int8. chatui's
    group-wise kernel measures 97.4 % / +0.77 % with its 8-bit activations, fp16 KV cache and
    the prompt's attention in C since issue 18's twenty-ninth pass (97.2 % / +0.68 % in torch's;
    97.6 % / +0.80 % with an fp32 cache, 97.9 % / +0.36 % with int16 activations before issue
    18's fifth pass); torch's per-channel kernel with bf16 activations (the fallback where ours
    cannot build) only about 94.7 %. int4 (chatui's kernel: groups of 32 with fp16 scale and
    min, int8 activations, int8 output layer, fp16 KV cache) measures 97.5 % / +0.22 % (97.4 %
    with an fp32 cache; 97.8 % before the int8 output layer's activations became 8-bit): this
    model's decoder was Q4_1, which int4 round-trips, so what it loses is the activations' int8
    rounding (torch's int4 kernel, bf16 activations: 99.2 %).
    """
    from conftest import skip_unless_ci
    from inference import quality
    from inference.runner import build_runner

    if q8kernel.load_kernel() is None:  # the fallback's own figures are checked below
        skip_unless_ci("chatui's kernels do not build on this machine")
    int8 = quality.measure(default_ckpt.model, default_ckpt.tokenizer,
                           build_runner(default_ckpt, quantize="int8", precision="auto"))
    assert int8.tokens > 700
    assert int8.top1_agreement >= 0.97
    assert int8.perplexity_increase <= 0.02
    int4 = quality.measure(default_ckpt.model, default_ckpt.tokenizer,
                           build_runner(default_ckpt, quantize="int4", precision="auto"))
    assert int4.top1_agreement >= 0.97
    assert int4.perplexity_increase <= 0.02
    # unquantized "auto": fp32 with chatui's kernels (exact), else bf16 + fp32 residual
    auto = build_runner(default_ckpt, precision="auto")
    exact = quality.measure(default_ckpt.model, default_ckpt.tokenizer, auto)
    assert auto.dtype == torch.float32 and exact.top1_agreement >= 0.999
    monkeypatch.setattr(q8kernel, "load_kernel", lambda: None)
    fallback = build_runner(default_ckpt, precision="auto")
    assert fallback.dtype == torch.bfloat16 and fallback.fast.rdtype == torch.float32
    bf16 = quality.measure(default_ckpt.model, default_ckpt.tokenizer, fallback)
    assert bf16.top1_agreement >= 0.97  # measured 97.9 %
    assert bf16.perplexity_increase <= 0.02


@pytest.mark.parametrize("fmt", ["safetensors", "gguf"])
def test_same_shape_checkpoints_get_their_own_cached_weights(fmt, tmp_path, monkeypatch,
                                                             default_model_dir):
    """A base model and its fine-tune have the same file names, shapes and sizes: each must get
    its own int8 weights from the disk cache (they were keyed by names and sizes, and the second
    silently ran the first's weights)."""
    from transformers import AutoTokenizer

    from inference.checkpoint import default_gguf_path, load_checkpoint
    from inference.checkpoint.gguf_write import write_model
    from inference.runner import build_runner

    from test_weight_layouts import tiny_model

    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    heads = []
    for name, shift in (("base", 0.0), ("finetune", 0.5)):
        model = tiny_model("llama", False, len(tok))
        with torch.no_grad():
            model.lm_head.weight.add_(shift)
        out = tmp_path / name
        out.mkdir()
        if fmt == "gguf":
            spec = write_model(model, out / "model.gguf", "Q8_0", default_gguf_path())
        else:
            model.save_pretrained(out)
            tok.save_pretrained(out)
            spec = out
        ckpt = load_checkpoint(str(spec), device="cpu", dtype="float32")
        runner = build_runner(ckpt, quantize="int8", precision="auto")
        assert runner.int8_path.is_file()
        heads.append((ckpt, runner))
    (a, ra), (b, rb) = heads
    assert a.weights_hash != b.weights_hash and ra.int8_path != rb.int8_path
    for ckpt, runner in heads:
        got = runner.fast.lm_head.dequantize(torch.float32)
        want = ckpt.model.lm_head.weight.float()
        step = want.abs().amax() / 127
        assert (got - want).abs().max() <= step  # its own weights, not the other's
    again = build_runner(b, quantize="int8", precision="auto")  # from the cache
    assert torch.equal(again.fast.lm_head.dequantize(torch.float32),
                       rb.fast.lm_head.dequantize(torch.float32))


@pytest.mark.parametrize("mode", ["plain", "norm", "swiglu"])
def test_q8_kernel_rows_equal_each_row_alone(mode, kernel):
    """Compare columns and fan-out branches decode M rows in one matmul (each weight block
    read once for all of them): every row equals that row computed alone, bit for bit, for
    M = 2..9 (the kernel takes rows 8 at a time) and each fused input."""
    torch.manual_seed(5)
    w = Q8Weight.quantize(torch.randn(80, 96))
    norm = torch.rand(96) + 0.5
    for m in range(2, 10):
        x = torch.randn(m, 192 if mode == "swiglu" else 96) * torch.logspace(-1, 1, m)[:, None]
        kw = dict(norm=norm, eps=1e-5) if mode == "norm" else dict(swiglu=mode == "swiglu")
        together = q8_linear(x, w, **kw)
        for r in range(m):
            assert torch.equal(together[r], q8_linear(x[r:r + 1].contiguous(), w, **kw)[0]), (m, r)


def test_q6_debug_checks_refuse_a_wrong_buffer():
    """``CHATUI_KERNEL_DEBUG``'s check of a 6-bit call: the right tensors pass, a short packed
    weight or scales is refused before C reads past them."""
    from inference import kernel_abi

    w = Q6Weight.quantize(torch.randn(40, 300))
    x, out = torch.randn(2, 300), torch.empty(2, 40)
    kernel_abi.check_q6_matmul(x, w.packed, w.scales, out, None, False, group=32, rows=16)
    with pytest.raises(kernel_abi.KernelArgumentError, match="packed must hold 12480"):
        kernel_abi.check_q6_matmul(x, w.packed[:1], w.scales, out, None, False, group=32,
                                   rows=16)
    with pytest.raises(kernel_abi.KernelArgumentError, match="scales must hold 96"):
        kernel_abi.check_q6_matmul(x, w.packed, w.scales[:1], out, None, False, group=32,
                                   rows=16)


@pytest.mark.parametrize("m", [1, 5, 9])
def test_matmul_results_do_not_depend_on_the_threads(m, kernel):
    """Each thread computes one contiguous range of row blocks (q8.c, q4.c, q6.c): with 2, 3
    and 7 threads, and more threads than blocks, every block is computed once and the results
    are bit for bit one thread's (63 blocks of 16 rows, the last one short)."""
    torch.manual_seed(31)
    k = 576
    weights = [(q8_linear, Q8Weight.quantize(torch.randn(1000, k))),
               (q4_linear, Q4Weight.quantize(torch.randn(1000, k))),
               (q6_linear, Q6Weight.quantize(torch.randn(1000, k))),
               (q8_linear, Q8Weight.quantize(torch.randn(40, k)))]  # 3 blocks
    x = torch.randn(m, k)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [linear(x, w) for linear, w in weights]
        for threads in (2, 3, 7):
            torch.set_num_threads(threads)
            for (linear, w), ref in zip(weights, alone):
                assert torch.equal(linear(x, w), ref), (type(w).__name__, threads)
    finally:
        torch.set_num_threads(before)
