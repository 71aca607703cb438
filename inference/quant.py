"""Weight-only int8 quantization (gpt-fast style): int8 weights with one scale per output
channel, activations stay in floating point.

``Int8Weight.quantize(w)`` is symmetric round-to-nearest over each row; ``linear`` runs it with
``torch.ops.aten._weight_int8pack_mm`` on CPU (bf16 activations), and elsewhere dequantizes
on the fly (``x @ w.T * scales``), which ``torch.compile`` fuses on CUDA. Quantized weights are
cached on disk as safetensors next to the model, keyed by the checkpoint's weights hash.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

QUANT_VERSION = 1
"""Bump when the stored layout or rounding changes (old cache files are then ignored)."""


@dataclass
class Int8Weight:
    """A weight [N, K] as int8 values [N, K] and per-output-channel scales [N]."""

    q: torch.Tensor  # [N, K] int8
    scales: torch.Tensor  # [N] in the activation dtype

    @classmethod
    def quantize(cls, w: torch.Tensor, scale_dtype: torch.dtype) -> Int8Weight:
        """Symmetric per-row int8: q = round(w / s), s = max|w_row| / 127."""
        w32 = w.detach().float()
        amax = w32.abs().amax(dim=1).clamp(min=1e-8)  # [N]
        scales = amax / 127.0
        q = torch.round(w32 / scales[:, None]).clamp_(-127, 127).to(torch.int8)
        return cls(q.contiguous(), scales.to(scale_dtype))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.q.to(dtype) * self.scales.to(dtype)[:, None]

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows (an embedding lookup). ids: [...] -> [..., K]."""
        return self.q[ids].to(dtype) * self.scales[ids].to(dtype)[..., None]

    @property
    def nbytes(self) -> int:
        return self.q.numel() + self.scales.numel() * self.scales.element_size()


def int8_linear(x: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """x: [..., K] -> [..., N] in the scales' dtype (x is cast to it first)."""
    if x.device.type == "cpu":
        flat = x.reshape(-1, x.shape[-1])
        if flat.dtype != w.scales.dtype:
            flat = flat.to(w.scales.dtype)
        out = torch.ops.aten._weight_int8pack_mm(flat, w.q, w.scales)  # [M, N]
        return out.view(*x.shape[:-1], out.shape[-1])
    dt = w.scales.dtype
    return F.linear(x.to(dt), w.q.to(dt)) * w.scales


def int8_cache_path(load_dir: str | os.PathLike | None, weights_hash: str,
                    cache_root: Path, kind: str = "int8") -> Path:
    """Where the quantized weights of a checkpoint live: inside the model's own directory when
    that is chatui's cache (the converted default model), else under ``<cache>/quantized``."""
    name = f"{kind}-v{QUANT_VERSION}-{weights_hash}.safetensors"
    if load_dir:
        d = Path(load_dir).resolve()
        try:
            d.relative_to(cache_root.resolve())
            return d / name
        except ValueError:
            pass
    return cache_root / "quantized" / name


def save_int8(path: Path, weights: dict[str, Any]) -> None:
    """Write int8 and int4 weights atomically (a temp file renamed into place); int4 is stored
    unpacked, the kernel layout is built on load."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if isinstance(w, Int4Weight):
            tensors[f"{name}.q4"] = w.q.contiguous().cpu()
            tensors[f"{name}.sz"] = w.scales_zeros.contiguous().cpu()
            continue
        tensors[f"{name}.q"] = w.q.contiguous().cpu()
        tensors[f"{name}.scales"] = w.scales.contiguous().cpu()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"format": "chatui-int8", "version": str(QUANT_VERSION)})
    os.replace(tmp, path)


def load_int8(path: Path, device: torch.device) -> dict[str, Any] | None:
    """The cached weights, or None when missing or unreadable."""
    if not path.is_file():
        return None
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(path), device=str(device))
    except Exception as exc:  # noqa: BLE001 - a corrupt cache is rebuilt, not fatal
        log.warning("ignoring unreadable int8 cache %s: %s", path, exc)
        return None
    out: dict[str, Any] = {}
    for key, t in tensors.items():
        if key.endswith(".q"):
            name = key[:-2]
            out[name] = Int8Weight(t, tensors[f"{name}.scales"])
        elif key.endswith(".q4"):
            name = key[:-3]
            out[name] = Int4Weight(t, tensors[f"{name}.sz"]).pack()
    return out


INT4_GROUP = 32
"""int4 group size along the input dimension (a Q4_0/Q4_1 GGUF block: those weights round-trip
exactly)."""


@dataclass
class Int4Weight:
    """A weight [N, K] as 4-bit values in groups of ``INT4_GROUP`` along K, each group with a
    scale and zero point: w = (q - 8) * scale + zero (torch's int4pack convention)."""

    q: torch.Tensor  # [N, K] uint8 in 0..15 (unpacked; kept for the disk cache)
    scales_zeros: torch.Tensor  # [K / G, N, 2] bf16
    packed: torch.Tensor | None = None  # the CPU kernel's layout, built on load

    @classmethod
    def quantize(cls, w: torch.Tensor, group: int = INT4_GROUP) -> Int4Weight:
        """Asymmetric min/max per group (a group's min and max are represented exactly)."""
        n, k = w.shape
        wg = w.detach().float().reshape(n, k // group, group)
        lo, hi = wg.amin(-1), wg.amax(-1)  # [N, K/G]
        scale = ((hi - lo) / 15).clamp(min=1e-10)
        q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp_(0, 15)
        zero = lo + 8 * scale
        sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous()  # [K/G, N, 2]
        return cls(q.reshape(n, k).to(torch.uint8), sz.to(torch.bfloat16)).pack()

    @staticmethod
    def supports(w: torch.Tensor, group: int = INT4_GROUP) -> bool:
        return w.device.type == "cpu" and w.shape[1] % group == 0 and w.shape[0] % 16 == 0

    def pack(self) -> Int4Weight:
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            self.q.to(torch.int32), 2)
        return self

    @property
    def group(self) -> int:
        return self.q.shape[1] // self.scales_zeros.shape[0]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        n, k = self.q.shape
        sz = self.scales_zeros.float().transpose(0, 1)  # [N, K/G, 2]
        qg = self.q.float().reshape(n, k // self.group, self.group)
        return ((qg - 8) * sz[..., :1] + sz[..., 1:]).reshape(n, k).to(dtype)

    @property
    def nbytes(self) -> int:
        return self.q.numel() // 2 + self.scales_zeros.numel() * 2


def int4_linear(x: torch.Tensor, w: Int4Weight) -> torch.Tensor:
    """x: [..., K] -> [..., N] bf16 (CPU kernel)."""
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, w.packed, w.group, w.scales_zeros)
    return out.view(*x.shape[:-1], out.shape[-1])
