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
                    cache_root: Path) -> Path:
    """Where the int8 weights of a checkpoint live: inside the model's own directory when that
    is chatui's cache (the converted default model), else under ``<cache>/quantized``."""
    name = f"int8-v{QUANT_VERSION}-{weights_hash}.safetensors"
    if load_dir:
        d = Path(load_dir).resolve()
        try:
            d.relative_to(cache_root.resolve())
            return d / name
        except ValueError:
            pass
    return cache_root / "quantized" / name


def save_int8(path: Path, weights: dict[str, Int8Weight]) -> None:
    """Write atomically (a temp file renamed into place)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        tensors[f"{name}.q"] = w.q.contiguous().cpu()
        tensors[f"{name}.scales"] = w.scales.contiguous().cpu()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    save_file(tensors, str(tmp), metadata={"format": "chatui-int8", "version": str(QUANT_VERSION)})
    os.replace(tmp, path)


def load_int8(path: Path, device: torch.device) -> dict[str, Int8Weight] | None:
    """The cached weights, or None when missing or unreadable."""
    if not path.is_file():
        return None
    try:
        from safetensors.torch import load_file

        tensors = load_file(str(path), device=str(device))
    except Exception as exc:  # noqa: BLE001 - a corrupt cache is rebuilt, not fatal
        log.warning("ignoring unreadable int8 cache %s: %s", path, exc)
        return None
    out: dict[str, Int8Weight] = {}
    for key, t in tensors.items():
        if key.endswith(".q"):
            name = key[:-2]
            out[name] = Int8Weight(t, tensors[f"{name}.scales"])
    return out
