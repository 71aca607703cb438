"""The contract between Python and chatui's C kernels (``kernels/chatui_kernels.h``), in one place.

ctypes trusts what it is told: a signature or a struct copied by hand that drifts from the C
code makes a call read or write the wrong memory, silently. So the header carries an ABI
version and the library exports the ``sizeof`` of every struct; ``bind`` sets every function's
ctypes signature from the ONE table below and checks the version and the sizes first, raising
``KernelABIError`` (the loader then falls back to torch) on any mismatch.

The C side cannot see tensors, only pointers: a wrong dtype, a non-contiguous view or a short
buffer is another silent corruption. ``CHATUI_KERNEL_DEBUG=1`` turns on ``check_*`` functions
that the kernel wrappers run before each call (off by default: the decode loop makes ~121
kernel calls a token and these checks would cost more Python than the loop itself has).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Sequence

import torch

ABI_VERSION = 12
"""``CHATUI_KERNELS_ABI`` in ``chatui_kernels.h``; bumped with any signature or struct change."""
DEBUG_ENV = "CHATUI_KERNEL_DEBUG"


class KernelABIError(RuntimeError):
    """The built library does not match this Python code (version, struct size or a missing
    function); it is not used."""


class KernelArgumentError(ValueError):
    """A kernel was called with a tensor of the wrong dtype, layout, device or shape (raised in
    debug mode only, before the C code runs)."""


class Layer(ctypes.Structure):
    """One decoder layer's tensors for ``decode_layers`` (the header's ``layer_t``)."""

    _fields_ = [*((name, ctypes.c_void_p) for name in (
        "ln1", "ln2", "wqkv", "sqkv", "bqkv", "wo", "so", "bo", "wgu", "sgu", "bgu",
        "wd", "sd", "bd")), ("wbits", ctypes.c_int),
        *((name, ctypes.c_void_p) for name in (
            "q_norm", "k_norm", "router", "egu_w", "egu_s", "ed_w", "ed_s")),
        *((name, ctypes.c_int) for name in ("n_experts", "top_k", "norm_topk", "moe_inter")),
        ("post_attn", ctypes.c_void_p), ("post_mlp", ctypes.c_void_p),
        *((name, ctypes.c_int) for name in ("window", "act", "rope"))]


STRUCTS: dict[str, type[ctypes.Structure]] = {"layer_t": Layer}
"""Every struct of the header by its C name; the library exports ``chatui_sizeof_<name>``."""

_p, _i, _f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "chatui_abi_version": (ctypes.c_int, []),
    **{f"chatui_sizeof_{name}": (ctypes.c_size_t, []) for name in STRUCTS},
    "q8_group_size": (_i, []),
    "q8_row_block": (_i, []),
    "q8_openmp": (_i, []),
    "q8_isa": (ctypes.c_char_p, []),
    "q8_matmul": (None, [_p, _i, _i, _p, _p, _i, _p, _i, _i, _p, _f]),
    "q8_matmul_sel": (None, [_i, _p, _i, _i, _p, _p, _p, _i, _p, _i, _i]),
    "q4_isa": (ctypes.c_char_p, []),
    "q4_matmul": (None, [_p, _i, _i, _p, _p, _i, _p, _i, _i, _p, _f]),
    "q4_matmul_sel": (None, [_i, _p, _i, _i, _p, _p, _p, _i, _p, _i, _i]),
    "q6_matmul": (None, [_p, _i, _i, _p, _p, _i, _p, _i, _i, _p, _f]),
    "attn_decode": (None, [_p, _i, _i, _i, _i, _p, _p, _i, _i, _p, _p, _p, _p, _i, _p, _i, _i]),
    "attn_prefill": (None, [_p, _i, _i, _i, _i, _p, _p, _i, _i, _p, _p, _p, _i, _i]),
    "decode_layers": (None, [_p, _i, _i, _i, ctypes.POINTER(Layer), _p, _p, _i, _i, _i, _i, _i,
                             _i, _p, _p, _p, _p, _i, _f, _i, _i]),
    "f32_max_rows": (_i, []),
    "f32_matvec": (None, [_p, _i, _i, _p, _i, _p, _i]),
    "q8_rows": (None, [_p, _i, _i, _p, _p, _f, _p]),
    "softcap": (None, [_p, ctypes.c_size_t, _f]),
    "token_stats_max_k": (_i, []),
    "token_stats_f32": (None, [_p, _i, _i, _p, _i, _f, _p, _i, _i]),
    "topk_f32": (None, [_p, _i, _i, _i, _p, _p, _i]),
    "sample_f32": (None, [_p, _p, _i, _i, _p, _p, _p, _p, _p, _p, _i, _p, _i, _i]),
}
"""Every exported function: (restype, argtypes), in the header's order of arguments."""


def debug_enabled() -> bool:
    """Whether ``CHATUI_KERNEL_DEBUG`` asks for argument checks (read when the kernel loads)."""
    return os.environ.get(DEBUG_ENV, "").lower() in ("1", "on", "yes", "true")


def bind(lib: ctypes.CDLL) -> None:
    """Check ``lib`` against this module (``ABI_VERSION``, ``STRUCTS``) and set every
    signature of ``SIGNATURES`` on it; nothing else of the library is called before.

    Raises:
        KernelABIError: the library predates ABI checks, has another ABI version, a struct of
            another size, or lacks a function.
    """
    version_fn = getattr(lib, "chatui_abi_version", None)
    if version_fn is None:
        raise KernelABIError("the kernel library has no ABI version (built from older sources)")
    version_fn.restype, version_fn.argtypes = ctypes.c_int, []
    version = version_fn()
    if version != ABI_VERSION:
        raise KernelABIError(
            f"the kernel library has ABI version {version}, this code expects {ABI_VERSION}")
    for name, cls in STRUCTS.items():
        fn = getattr(lib, f"chatui_sizeof_{name}", None)
        if fn is None:
            raise KernelABIError(f"the kernel library does not report the size of {name}")
        fn.restype, fn.argtypes = ctypes.c_size_t, []
        if fn() != ctypes.sizeof(cls):
            raise KernelABIError(f"{name} is {fn()} bytes in the kernel library but "
                                 f"{ctypes.sizeof(cls)} in Python ({cls.__name__})")
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name, None)
        if fn is None:
            raise KernelABIError(f"the kernel library lacks {name}()")
        fn.restype, fn.argtypes = restype, argtypes


# ---------------------------------------------------------------------------------------------
# Argument checks (debug mode)


def _tensor(name: str, t: Any, dtype: torch.dtype, numel: int | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise KernelArgumentError(f"{name} must be a tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise KernelArgumentError(f"{name} must be {dtype}, got {t.dtype}")
    if t.device.type != "cpu":
        raise KernelArgumentError(f"{name} must be on the CPU, got {t.device}")
    if not t.is_contiguous():
        raise KernelArgumentError(f"{name} must be contiguous")
    if numel is not None and t.numel() != numel:
        raise KernelArgumentError(f"{name} must hold {numel} values, got {t.numel()} "
                                  f"(shape {tuple(t.shape)})")


def _matmul_shapes(x: torch.Tensor, out: torch.Tensor, norm: torch.Tensor | None,
                   swiglu: bool, *, group: int, rows: int) -> tuple[int, int, int]:
    """The checks every packed matmul's x, out and swiglu share; returns (K of the weight,
    groups along it, row blocks of ``rows``)."""
    _tensor("x", x, torch.float32)
    k = x.shape[-1]
    if swiglu and (k % 2 or norm is not None):
        raise KernelArgumentError("swiglu needs x of [gate | up] (an even width) and no norm")
    kin = k >> swiglu
    m = x.numel() // k if k else 0
    _tensor("out", out, torch.float32)
    n = out.shape[-1]
    if out.numel() != m * n:
        raise KernelArgumentError(f"out must be [{m}, {n}] for {m} rows of x, got "
                                  f"{tuple(out.shape)}")
    return kin, -(-kin // group), -(-n // rows)


def check_q8_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                    out: torch.Tensor, norm: torch.Tensor | None, swiglu: bool, *, group: int,
                    rows: int) -> None:
    """``q8_matmul``'s arguments: x [..., K] (or [..., 2K] with swiglu) fp32, the packed
    weight and scales of an [n, K] ``Q8Weight``, out [..., n] fp32, norm [K] fp32."""
    kin, g, nb = _matmul_shapes(x, out, norm, swiglu, group=group, rows=rows)
    _tensor("packed", packed, torch.int8, nb * g * group * rows)
    _tensor("scales", scales, torch.float16, nb * g * rows)
    if norm is not None:
        _tensor("norm", norm, torch.float32, kin)


def check_q4_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                    out: torch.Tensor, norm: torch.Tensor | None, swiglu: bool, *, group: int,
                    rows: int) -> None:
    """``q4_matmul``'s arguments: as ``check_q8_matmul``'s, for the packed nibbles (uint8, half
    a byte a weight) and the scales and mins (two fp16 per row and group) of a ``Q4Weight``."""
    kin, g, nb = _matmul_shapes(x, out, norm, swiglu, group=group, rows=rows)
    _tensor("packed", packed, torch.uint8, nb * g * group * rows // 2)
    _tensor("scales", scales, torch.float16, nb * g * rows * 2)
    if norm is not None:
        _tensor("norm", norm, torch.float32, kin)


def check_softcap(y: torch.Tensor) -> None:
    """``softcap``'s argument: fp32, contiguous, on the CPU."""
    _tensor("y", y, torch.float32)


def check_q6_matmul(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                    out: torch.Tensor, norm: torch.Tensor | None, swiglu: bool, *, group: int,
                    rows: int) -> None:
    """``q6_matmul``'s arguments: as ``check_q8_matmul``'s, for a ``Q6Weight``'s packed bytes
    (uint8, 416 per 16 rows and group) and super-block scales (fp16, 16 per row block and 8
    groups)."""
    kin, g, nb = _matmul_shapes(x, out, norm, swiglu, group=group, rows=rows)
    _tensor("packed", packed, torch.uint8, nb * g * (group * rows * 13 // 16))
    _tensor("scales", scales, torch.float16, nb * -(-g // 8) * rows)
    if norm is not None:
        _tensor("norm", norm, torch.float32, kin)


def check_f32_matvec(x: torch.Tensor, w: torch.Tensor, *, max_rows: int) -> None:
    """``f32_matvec``'s arguments: x [..., K] fp32 of at most ``max_rows`` rows, w [N, K]."""
    _tensor("x", x, torch.float32)
    _tensor("w", w, torch.float32)
    k = x.shape[-1]
    if w.dim() != 2 or w.shape[1] != k:
        raise KernelArgumentError(f"w must be [N, {k}], got {tuple(w.shape)}")
    if k and x.numel() // k > max_rows:
        raise KernelArgumentError(f"x has {x.numel() // k} rows; the kernel takes {max_rows}")


def check_attention(qkv: torch.Tensor | None, k_caches: Sequence[torch.Tensor],
                    v_caches: Sequence[torch.Tensor], write: int, positions: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None,
                    n_heads: int, shared: int = 0) -> None:
    """``attn_decode``'s (and ``decode_layers``' attention) arguments: qkv [B, (H + 2KV) * D]
    fp32; every cache [B, KV, C, D], all fp32 or all fp16, with ``write`` < C; positions [B]
    int64 inside the RoPE tables cos, sin [P, D/2] fp32; mask [B, write + 1] uint8; ``shared``
    (the positions every row holds alike) in 0..write."""
    if not k_caches or len(k_caches) != len(v_caches):
        raise KernelArgumentError("need one key and one value cache per layer")
    shape = tuple(k_caches[0].shape)
    if len(shape) != 4:
        raise KernelArgumentError(f"a cache must be [B, KV, C, D], got {shape}")
    b, kv, c, d = shape
    kv_dtype = k_caches[0].dtype
    if kv_dtype not in (torch.float32, torch.float16):
        raise KernelArgumentError(f"a cache must be fp32 or fp16, got {kv_dtype}")
    for i, t in enumerate((*k_caches, *v_caches)):
        _tensor(f"cache {i}", t, kv_dtype)
        if tuple(t.shape) != shape:
            raise KernelArgumentError(f"cache {i} is {tuple(t.shape)}, cache 0 is {shape}")
    if n_heads <= 0 or n_heads % kv or d % 2:
        raise KernelArgumentError(f"{n_heads} query heads do not share {kv} KV heads of {d}")
    if not 0 <= write < c:
        raise KernelArgumentError(f"write position {write} is outside the cache's {c}")
    if not 0 <= shared <= write:
        raise KernelArgumentError(f"{shared} shared positions is outside 0..{write}")
    if qkv is not None:
        _tensor("qkv", qkv, torch.float32, b * (n_heads + 2 * kv) * d)
    _tensor("positions", positions, torch.int64, b)
    _tensor("cos", cos, torch.float32)
    _tensor("sin", sin, torch.float32)
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != d // 2:
        raise KernelArgumentError(f"cos and sin must both be [P, {d // 2}]")
    if b and (int(positions.min()) < 0 or int(positions.max()) >= cos.shape[0]):
        raise KernelArgumentError(f"positions must lie in the RoPE tables' 0..{cos.shape[0] - 1}")
    if mask is not None:
        _tensor("mask", mask, torch.uint8, b * (write + 1))


def check_prefill_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            start: int, cos: torch.Tensor, sin: torch.Tensor,
                            n_heads: int) -> None:
    """``attn_prefill``'s arguments: qkv [T, (H + 2KV) * D] fp32 and the caches [KV, C, D] of
    one row, checked as ``check_attention`` checks a one-row step writing the last of the
    positions start..start+T-1."""
    if qkv.dim() != 2 or k_cache.dim() != 3 or v_cache.dim() != 3:
        raise KernelArgumentError("qkv must be [T, (H + 2KV) * D] and the caches [KV, C, D]")
    t, last = qkv.shape[0], start + qkv.shape[0] - 1
    if start < 0:
        raise KernelArgumentError(f"the first position {start} is negative")
    check_attention(None, [k_cache[None]], [v_cache[None]], last, torch.tensor([last]), cos, sin,
                    None, n_heads)
    kv, _, d = k_cache.shape
    _tensor("qkv", qkv, torch.float32, t * (n_heads + 2 * kv) * d)


def check_decode_layers(x: torch.Tensor, n_layers: int, k_caches: Sequence[torch.Tensor],
                        v_caches: Sequence[torch.Tensor], write: int, positions: torch.Tensor,
                        cos: Sequence[torch.Tensor], sin: Sequence[torch.Tensor],
                        mask: torch.Tensor | None, n_heads: int, shared: int = 0) -> None:
    """``decode_layers``' arguments: x [B, hidden] fp32, one ``Layer`` and one key and value
    cache per layer, one (cos, sin) table per RoPE kind, the rest as for ``check_attention``."""
    if not cos or len(cos) != len(sin):
        raise KernelArgumentError("need one cos and one sin table per RoPE kind")
    _tensor("x", x, torch.float32)
    if x.dim() != 2:
        raise KernelArgumentError(f"x must be [B, hidden], got {tuple(x.shape)}")
    if len(k_caches) != n_layers:
        raise KernelArgumentError(f"{n_layers} layers but {len(k_caches)} caches")
    for c, s in zip(cos, sin):
        check_attention(None, k_caches, v_caches, write, positions, c, s, mask, n_heads, shared)
    if k_caches[0].shape[0] != x.shape[0]:
        raise KernelArgumentError(f"x has {x.shape[0]} rows, the caches {k_caches[0].shape[0]}")
