"""Weight-only quantization: the weight types the runners hold, and their disk cache.

- ``Q8Weight``: int8 in groups of 32 with an fp16 scale (GGUF Q8_0's numbers), chatui's CPU
  kernel (``q8kernel``, ``kernels/q8.c``); the CPU default where the kernels build.
- ``Q4Weight``: 4-bit in groups of 32 with an fp16 scale and min (GGUF Q4_1's numbers; Q4_0
  and Q4_K load into it by a repack, ``Q4Weight.from_gguf_blocks``), chatui's CPU kernel
  (``kernels/q4.c``); ``--quantize int4`` where the kernels build. Its docstring is the format's
  reference for loaders.
- ``Q6Weight``: 6-bit in GGUF Q6_K's numbers (an int8 scale per 16, an fp16 one per 256), the
  output layer under ``--quantize int4`` (``kernels/q6.c``); a Q6_K tensor loads as it is.
- ``Int8Weight``: int8 with one scale per output channel (gpt-fast style), run with
  ``torch.ops.aten._weight_int8pack_mm`` on CPU (bf16 activations) and dequantized on the fly
  elsewhere (``x @ w.T * scales``, which ``torch.compile`` fuses on CUDA); the fallback.
- ``Int4Weight``: torch's int4pack layout and kernel (bf16 activations); int4's fallback.

Quantized weights are cached on disk as safetensors next to the model, keyed by the
checkpoint's weights hash (its files' contents), and mapped into memory on later starts
(``st_io``).
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from . import q8kernel

log = logging.getLogger(__name__)

QUANT_VERSION = 3
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
    if torch.compiler.is_compiling() and x.numel() <= 8 * x.shape[-1]:
        # The compiled decode step (a few rows): a product and a sum that inductor fuses into
        # one reduction reading the int8 weight once, as gpt-fast's matvec. The matmul form
        # below is rewritten by inductor into aten's int8 kernel, which on an H200 (torch
        # 2.11) took 147 us a call against 18 us for the same weight in bf16: int8 decoded a
        # 1B Llama at 92 tok/s against bf16's 718 (benchmarks/bench_gpu.py).
        prod = x.float().unsqueeze(-2) * w.q.float()  # [..., N, K], never materialized
        return (prod.sum(-1) * w.scales.float()).to(dt)
    return F.linear(x.to(dt), w.q.to(dt)) * w.scales


@dataclass
class Q8Weight:
    """A weight [N, K] as int8 in groups of 32 along K with an fp16 scale per row and group,
    in the layout of chatui's CPU kernel (``q8kernel``): rows in blocks of 16, and within a
    block and group, column pairs of all 16 rows side by side. N and K are padded with zeros to
    multiples of 16 and 32. Activations are quantized per group to 8 bits (asymmetric) inside the kernel."""

    packed: torch.Tensor  # [N/16, K/32, 16 (pair), 16 (row), 2] int8
    scales: torch.Tensor  # [N/16, K/32, 16 (row)] fp16
    n: int
    k: int

    @classmethod
    def quantize(cls, w: torch.Tensor, chunk_rows: int = 4096) -> Q8Weight:
        """Symmetric round-to-nearest per group: q = round(w / s), s = max|w_group| / 127,
        with s stored in fp16 and q rounded against the stored value. Works through
        ``chunk_rows`` rows at a time, so a large output layer needs no fp32 temporaries of
        its full size (they would set the process's peak memory)."""
        n, k = w.shape
        kp = -(-k // q8kernel.GROUP) * q8kernel.GROUP
        src = w.detach()

        def groups(r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
            return cls.round_groups(F.pad(src[r0:r1].float().cpu(), (0, kp - k)))

        return cls.from_groups(n, k, groups, chunk_rows)

    @staticmethod
    def round_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 rows [r, K] (K a multiple of 32) as (int8 [r, K], fp16 scales [r, K / 32]):
        ``quantize``'s rounding of each group of 32."""
        r, kp = w.shape
        wg = w.view(r, kp // q8kernel.GROUP, q8kernel.GROUP)
        s16 = (wg.abs().amax(-1) / 127.0).clamp(max=65504).to(torch.float16)  # [r, G]
        s32 = s16.float()[..., None]
        q = torch.where(s32 > 0, torch.round(wg / s32.clamp(min=1e-30)), 0.0)
        return q.clamp_(-127, 127).to(torch.int8).view(r, kp), s16

    @classmethod
    def from_groups(cls, n: int, k: int,
                    groups: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
                    chunk_rows: int = 4096) -> Q8Weight:
        """The kernel's layout from int8 values and fp16 scales in groups of 32 along K (a
        GGUF Q8_0 tensor's blocks as they are: no rounding here). ``groups(r0, r1)`` gives rows
        r0..r1 (r1 <= n) as (int8 [r, K32], fp16 [r, K32 / 32]), K32 being K rounded up to a
        multiple of 32 (zeros past K); it is asked for at most ``chunk_rows`` rows at a time."""
        rows, group = q8kernel.ROWS, q8kernel.GROUP
        np_, kp = -(-n // rows) * rows, -(-k // group) * group
        g = kp // group
        chunk_rows = max(rows, chunk_rows // rows * rows)
        packed = torch.empty((np_ // rows, g, group // 2, rows, 2), dtype=torch.int8)
        scales = torch.empty((np_ // rows, g, rows), dtype=torch.float16)
        # the transposes in numpy, a column pair as one int16: torch's copy of these strided
        # views took 2.5x (values) and 150x (scales) as long, 16 s of a 1B model's 49 s
        packed16 = packed.view(torch.int16).numpy().reshape(np_ // rows, g, group // 2, rows)
        scales16 = scales.view(torch.int16).numpy()
        for r0 in range(0, np_, chunk_rows):
            r1 = min(r0 + chunk_rows, np_)
            q, s16 = groups(r0, min(r1, n))
            if q.shape[0] < r1 - r0:  # zero rows up to a multiple of 16
                pad = r1 - r0 - q.shape[0]
                q = torch.cat([q, q.new_zeros((pad, kp))])
                s16 = torch.cat([s16, s16.new_zeros((pad, g))])
            b0, b1 = r0 // rows, r1 // rows
            q16 = q.contiguous().view(torch.int16).numpy()
            packed16[b0:b1] = q16.reshape(b1 - b0, rows, g, group // 2).transpose(0, 2, 3, 1)
            s = s16.contiguous().view(torch.int16).numpy()
            scales16[b0:b1] = s.reshape(b1 - b0, rows, g).transpose(0, 2, 1)
        return cls(packed, scales, n, k)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.rows(torch.arange(self.n), dtype)

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows (an embedding lookup). ids: [...] -> [..., K]."""
        b, r = ids // q8kernel.ROWS, ids % q8kernel.ROWS
        q = self.packed[b, :, :, r, :]  # [..., G, 16, 2]
        s = self.scales[b, :, r].float()  # [..., G]
        w = (q.float() * s[..., None, None]).to(dtype)
        return w.reshape(*w.shape[:-3], -1)[..., : self.k]

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() * self.scales.element_size()


@torch.library.custom_op("chatui::q8_matmul", mutates_args=())
def _q8_matmul_op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
                  norm: torch.Tensor | None, eps: float, swiglu: bool) -> torch.Tensor:
    kernel = q8kernel.load_kernel()
    assert kernel is not None, "Q8Weight exists only where the kernel loads"
    return kernel.matmul(x, packed, scales, n, norm, eps, swiglu)


@_q8_matmul_op.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
      norm: torch.Tensor | None, eps: float, swiglu: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


def q8_available(device: torch.device) -> bool:
    """Whether int8 weights on ``device`` use chatui's group-wise kernel."""
    return device.type == "cpu" and q8kernel.load_kernel() is not None


def q8_linear(x: torch.Tensor, w: Q8Weight, *, norm: torch.Tensor | None = None,
              eps: float = 0.0, swiglu: bool = False) -> torch.Tensor:
    """x: [..., K] (any float dtype, CPU) -> [..., N] fp32.

    norm: [K] fp32: the input is ``F.rms_norm(x, (K,), norm, eps)``, fused into the kernel.
    swiglu: x is [..., 2K] = [gate | up] and the input is ``F.silu(gate) * up``, fused.
    """
    if (x.dtype is torch.float32 and x.is_contiguous() and not torch.compiler.is_compiling()
            and (norm is None or (norm.dtype is torch.float32 and norm.is_contiguous()))):
        # the decode loop's case, with as little Python per call as can be (121 calls a token)
        out = torch.empty(x.shape[:-1] + (w.n,), dtype=torch.float32)
        q8kernel.load_kernel().run(x, w.packed, w.scales, out, norm, eps, swiglu)  # type: ignore[union-attr]
        return out
    flat = x.reshape(-1, x.shape[-1]).float().contiguous()
    if norm is not None:
        norm = norm.float().contiguous()
    if torch.compiler.is_compiling():
        out = _q8_matmul_op(flat, w.packed, w.scales, w.n, norm, float(eps), swiglu)
    else:
        kernel = q8kernel.load_kernel()
        assert kernel is not None, "Q8Weight exists only where the kernel loads"
        out = kernel.matmul(flat, w.packed, w.scales, w.n, norm, eps, swiglu)
    return out.view(*x.shape[:-1], w.n)


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
    from . import st_io

    tensors: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if isinstance(w, Q8Weight):
            tensors[f"{name}.q8"] = w.packed.contiguous().cpu()
            tensors[f"{name}.q8scales"] = w.scales.contiguous().cpu()
            tensors[f"{name}.q8shape"] = torch.tensor([w.n, w.k])
            continue
        if isinstance(w, Q4Weight):
            tensors[f"{name}.q4p"] = w.packed.contiguous().cpu()
            tensors[f"{name}.q4scales"] = w.scales.contiguous().cpu()
            tensors[f"{name}.q4shape"] = torch.tensor([w.n, w.k])
            continue
        if isinstance(w, Q6Weight):
            tensors[f"{name}.q6p"] = w.packed.contiguous().cpu()
            tensors[f"{name}.q6scales"] = w.scales.contiguous().cpu()
            tensors[f"{name}.q6shape"] = torch.tensor([w.n, w.k])
            continue
        if isinstance(w, Int4Weight):
            tensors[f"{name}.q4"] = w.q.contiguous().cpu()
            tensors[f"{name}.sz"] = w.scales_zeros.contiguous().cpu()
            continue
        tensors[f"{name}.q"] = w.q.contiguous().cpu()
        tensors[f"{name}.scales"] = w.scales.contiguous().cpu()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    st_io.save(tensors, tmp, metadata={"format": "chatui-int8", "version": str(QUANT_VERSION)})
    os.replace(tmp, path)
    _remove_older_versions(path)


def _remove_older_versions(path: Path) -> None:
    """Delete the same weights cached by an earlier layout version (never read again)."""
    m = re.fullmatch(r"(.+)-v\d+-(.+)\.safetensors", path.name)
    if m is None:
        return
    kind, digest = m.groups()
    same = re.compile(rf"{re.escape(kind)}-v\d+-{re.escape(digest)}\.safetensors")
    for old in path.parent.iterdir():
        if old != path and same.fullmatch(old.name):
            try:
                old.unlink()
            except OSError:
                pass


def load_int8(path: Path, device: torch.device, *, resident: bool = False,
              stop: Callable[[], bool] | None = None) -> dict[str, Any] | None:
    """The cached weights (mapped from the file, ``st_io.load_mapped``; with ``resident`` on a
    CPU, read into huge pages, ``st_io.load_resident``, whose read ``stop`` can end early), or
    None when missing, unreadable or stopped."""
    if not path.is_file():
        return None
    from . import hugepages, st_io

    try:
        cpu = device.type == "cpu"
        tensors = (st_io.load_resident(path, stop) if cpu and resident
                   else st_io.load_mapped(path))
        if not cpu:
            tensors = {k: v.to(device) for k, v in tensors.items()}
    except hugepages.ReadStopped:
        return None
    except Exception as exc:  # noqa: BLE001 - a corrupt cache is rebuilt, not fatal
        log.warning("ignoring unreadable int8 cache %s: %s", path, exc)
        return None
    out: dict[str, Any] = {}
    for key, t in tensors.items():
        if key.endswith(".q"):
            name = key[:-2]
            out[name] = Int8Weight(t, tensors[f"{name}.scales"])
        elif key.endswith(".q8"):
            name = key[:-3]
            n, k = tensors[f"{name}.q8shape"].tolist()
            out[name] = Q8Weight(t, tensors[f"{name}.q8scales"], n, k)
        elif key.endswith(".q4p"):
            name = key[:-4]
            n, k = tensors[f"{name}.q4shape"].tolist()
            out[name] = Q4Weight(t, tensors[f"{name}.q4scales"], n, k)
        elif key.endswith(".q6p"):
            name = key[:-4]
            n, k = tensors[f"{name}.q6shape"].tolist()
            out[name] = Q6Weight(t, tensors[f"{name}.q6scales"], n, k)
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
    scale and zero point: w = (q - 8) * scale + zero (torch's int4pack convention), for torch's
    int4 kernel: where chatui's kernels do not build (they run ``Q4Weight``)."""

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
    def supports_shape(shape: tuple[int, ...], device: torch.device,
                       group: int = INT4_GROUP) -> bool:
        return device.type == "cpu" and shape[1] % group == 0 and shape[0] % 16 == 0

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


GGUF_Q4_TYPES = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q4_K": (256, 144)}
"""GGUF 4-bit block types ``Q4Weight.from_gguf_blocks`` takes: (weights, bytes) per block."""


def _quantize_in_chunks(cls: Any, w: torch.Tensor, chunk_rows: int) -> Any:
    """``cls.round_groups`` of ``w`` [N, K] ``chunk_rows`` rows (a whole number of row blocks)
    at a time, packed into ``cls._empty``'s tensors (no fp32 temporaries the size of a large
    output layer); the ``quantize`` of ``Q4Weight`` and ``Q6Weight``."""
    n, k = w.shape
    packed, scales = cls._empty(n, k)
    src = w.detach()
    chunk_rows = max(q8kernel.ROWS, chunk_rows // q8kernel.ROWS * q8kernel.ROWS)
    for r0 in range(0, n, chunk_rows):
        cls._pack_rows(packed, scales, r0, *cls.round_groups(src[r0:r0 + chunk_rows]))
    return cls(packed, scales, n, k)


@dataclass
class Q4Weight:
    """A weight [N, K] as 4-bit values in GGUF's blocks, for chatui's int4 CPU kernel (``q4.c``).

    The format, for whoever loads weights into it: each row is cut into groups of 32 along K
    (a Q4_0/Q4_1 block, a Q4_K sub-block), and each group holds 32 values q in 0..15, an fp16
    scale d and an fp16 min m:

        w[n, 32g + i] = q[n, 32g + i] * d[n, g] + m[n, g]

    That is Q4_1's formula as is; Q4_0 is m = -8 d (exact in fp16); Q4_K's sub-block s of a
    super-block is d = d_K * sc_s and m = -dmin_K * mn_s, each rounded once to fp16 (relative
    error at most 2^-11 on a scale, far below the 4-bit rounding). ``from_groups(q, d, m)``
    builds the kernel's layout from those three arrays, ``from_gguf_blocks(raw, "Q4_0" |
    "Q4_1" | "Q4_K", (N, K))`` from a GGUF tensor's raw block bytes; both are a reorder of
    nibbles and scales, one tensor at a time, no float round trip of the weights.

    The kernel's layout (see ``kernels/q4.c``): rows in blocks of 16; ``packed`` [N/16, G, 4,
    64] uint8, where byte i of pair p holds row 16b + i // 4's columns 32g + 8p + i % 4 (low
    nibble) and 32g + 8p + 4 + i % 4 (high nibble); ``scales`` [N/16, G, 2, 16] fp16, the 16
    rows' d then their m. N is padded with zero rows to a multiple of 16, K with zeros to a
    multiple of 32. 5 bits a weight (Q4_1's size).
    """

    packed: torch.Tensor  # [N/16, K/32, 4, 64] uint8
    scales: torch.Tensor  # [N/16, K/32, 2, 16] fp16: d, then m
    n: int
    k: int

    @staticmethod
    def _empty(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows, group = q8kernel.ROWS, q8kernel.GROUP
        nb, g = -(-n // rows), -(-k // group)
        return (torch.zeros((nb, g, 4, 64), dtype=torch.uint8),
                torch.zeros((nb, g, 2, rows), dtype=torch.float16))

    @staticmethod
    def _pack_rows(packed: torch.Tensor, scales: torch.Tensor, r0: int, q: torch.Tensor,
                   d: torch.Tensor, m: torch.Tensor) -> None:
        """Write rows r0.. (r0 a multiple of 16) given as q [r, K] uint8 0..15, d, m [r, G]
        fp16 into the packed tensors (the rows and columns past N and K stay zero)."""
        rows, group = q8kernel.ROWS, q8kernel.GROUP
        g = packed.shape[1]
        r = -(-q.shape[0] // rows) * rows
        q = F.pad(q, (0, g * group - q.shape[1], 0, r - q.shape[0]))
        d = F.pad(d, (0, g - d.shape[1], 0, r - d.shape[0]))
        m = F.pad(m, (0, g - m.shape[1], 0, r - m.shape[0]))
        nb = r // rows
        q6 = q.view(nb, rows, g, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # [b, g, p, row, j, half]
        b0 = r0 // rows
        packed[b0:b0 + nb] = (q6[..., 0] | (q6[..., 1] << 4)).reshape(nb, g, 4, 64)
        scales[b0:b0 + nb, :, 0] = d.view(nb, rows, g).transpose(1, 2)
        scales[b0:b0 + nb, :, 1] = m.view(nb, rows, g).transpose(1, 2)

    @classmethod
    def from_groups(cls, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> Q4Weight:
        """From q [N, K] (uint8, 0..15), d and m [N, ceil(K / 32)] (cast to fp16)."""
        n, k = q.shape
        packed, scales = cls._empty(n, k)
        cls._pack_rows(packed, scales, 0, q.to(torch.uint8), d.to(torch.float16),
                       m.to(torch.float16))
        return cls(packed, scales, n, k)

    @classmethod
    def quantize(cls, w: torch.Tensor, chunk_rows: int = 4096) -> Q4Weight:
        """Asymmetric round-to-nearest per group of 32: m = the group's min, d = (max - min)
        / 15, both stored in fp16 and q rounded against the stored values. ``chunk_rows`` rows
        at a time (no fp32 temporaries the size of a large output layer)."""
        return _quantize_in_chunks(cls, w, chunk_rows)

    @staticmethod
    def round_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows [r, K] (any float dtype) as ``quantize`` rounds them: (q [r, K32] uint8 0..15,
        d [r, K32 / 32] fp16, m [r, K32 / 32] fp16), K32 being K rounded up to 32 (zeros)."""
        group = q8kernel.GROUP
        r, k = w.shape
        kp = -(-k // group) * group
        wg = F.pad(w.float().cpu(), (0, kp - k)).view(r, kp // group, group)
        lo, hi = wg.amin(-1), wg.amax(-1)
        d16 = ((hi - lo) / 15).clamp(max=65504).to(torch.float16)
        m16 = lo.clamp(-65504, 65504).to(torch.float16)
        d32, m32 = d16.float()[..., None], m16.float()[..., None]
        q = torch.where(d32 > 0, torch.round((wg - m32) / d32.clamp(min=1e-30)), 0.0)
        return q.clamp_(0, 15).to(torch.uint8).view(r, kp), d16, m16

    @classmethod
    def from_gguf_blocks(cls, data: Any, ggml_type: str, shape: tuple[int, int]) -> Q4Weight:
        """From a GGUF tensor's raw bytes (bytes, a buffer, a numpy uint8 array such as
        ``gguf.GGUFReader``'s ``tensor.data``, or a uint8 tensor; read, never written, and not
        copied before the repack): ``shape`` (N, K) as transformers sees the weight
        (GGUF lists it as ne = [K, N]), ``ggml_type`` "Q4_0", "Q4_1" or "Q4_K" (the blocks of
        each row in order, as llama.cpp's ``block_q4_0`` / ``block_q4_1`` / ``block_q4_K``).

        Raises:
            ValueError: another type, K not a multiple of the block, or a size that does not
                match the shape.
        """
        return cls.from_groups(*cls.gguf_groups(data, ggml_type, shape))

    @staticmethod
    def gguf_groups(data: Any, ggml_type: str, shape: tuple[int, int]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``from_gguf_blocks``' groups before packing: (q [N, K] uint8 0..15, d and m
        [N, K / 32]; fp16, or fp32 for Q4_K's products, which ``from_groups`` rounds)."""
        if ggml_type not in GGUF_Q4_TYPES:
            raise ValueError(f"{ggml_type} is not a 4-bit GGUF block type this loader takes "
                             f"({', '.join(GGUF_Q4_TYPES)})")
        per, size = GGUF_Q4_TYPES[ggml_type]
        n, k = shape
        if k % per:
            raise ValueError(f"{ggml_type} rows of {k} weights are not whole blocks of {per}")
        if isinstance(data, torch.Tensor):
            raw = data
        elif hasattr(data, "__array_interface__"):  # a numpy array (a memory map of the file)
            with warnings.catch_warnings():  # read-only memory is only read here
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.from_numpy(data)  # type: ignore[arg-type]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                raw = torch.frombuffer(data, dtype=torch.uint8)
        raw = raw.reshape(-1).view(torch.uint8)
        if raw.numel() != n * k // per * size:
            raise ValueError(f"{ggml_type} [{n}, {k}] takes {n * k // per * size} bytes, got "
                             f"{raw.numel()}")
        blocks = raw.view(n, k // per, size)
        g = k // 32

        def f16(t: torch.Tensor) -> torch.Tensor:  # [..., 2] uint8 -> [...] fp16
            return t.contiguous().view(torch.float16)[..., 0]

        if ggml_type == "Q4_K":
            d = f16(blocks[..., 0:2]).float()[..., None]  # [N, S, 1]
            dmin = f16(blocks[..., 2:4]).float()[..., None]
            sc6 = blocks[..., 4:16].view(n, -1, 3, 4).to(torch.int32)
            a, b, c = sc6[..., 0, :], sc6[..., 1, :], sc6[..., 2, :]
            sc = torch.cat([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], -1)  # [N, S, 8]
            mn = torch.cat([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], -1)
            qs = blocks[..., 16:].reshape(n, -1, 4, 1, 32)  # 4 chunks of 32 bytes
            q = torch.cat([qs & 0x0F, qs >> 4], dim=3)  # [N, S, 4, 2 (low: sub 2j), 32]
            return q.reshape(n, k), (d * sc).reshape(n, g), (-(dmin * mn)).reshape(n, g)
        d = f16(blocks[..., 0:2])  # [N, G]
        m = -8 * d if ggml_type == "Q4_0" else f16(blocks[..., 2:4])
        qs = blocks[..., size - 16:]  # [N, G, 16]: byte j holds weights j and j + 16
        q = torch.cat([qs & 0x0F, qs >> 4], dim=-1)
        return q.reshape(n, k), d, m

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    def groups(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [N, K] uint8, d [N, G] fp16, m [N, G] fp16): ``from_groups``' inverse."""
        nb, g = self.packed.shape[:2]
        lo, hi = self.packed & 0x0F, self.packed >> 4
        q6 = torch.stack([lo, hi], -1).view(nb, g, 4, 16, 4, 2)  # [b, g, p, row, j, half]
        q = q6.permute(0, 3, 1, 2, 5, 4).reshape(nb * 16, g * 32)
        d = self.scales[:, :, 0].transpose(1, 2).reshape(nb * 16, g)
        m = self.scales[:, :, 1].transpose(1, 2).reshape(nb * 16, g)
        return q[: self.n, : self.k], d[: self.n], m[: self.n]

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        q, d, m = self.groups()
        g = d.shape[1]
        qg = F.pad(q.float(), (0, g * 32 - self.k)).view(self.n, g, 32)
        w = qg * d.float()[..., None] + m.float()[..., None]
        return w.view(self.n, g * 32)[:, : self.k].to(dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() * self.scales.element_size()


@torch.library.custom_op("chatui::q4_matmul", mutates_args=())
def _q4_matmul_op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
                  norm: torch.Tensor | None, eps: float, swiglu: bool) -> torch.Tensor:
    kernel = q8kernel.load_kernel()
    assert kernel is not None, "Q4Weight runs only where the kernel loads"
    return kernel.q4_matmul(x, packed, scales, n, norm, eps, swiglu)


@_q4_matmul_op.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
      norm: torch.Tensor | None, eps: float, swiglu: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


def q4_linear(x: torch.Tensor, w: Q4Weight, *, norm: torch.Tensor | None = None,
              eps: float = 0.0, swiglu: bool = False) -> torch.Tensor:
    """``q8_linear`` for an int4 ``Q4Weight`` (the same fused norm and SwiGLU); x: [..., K]
    (any float dtype, CPU) -> [..., N] fp32."""
    if (x.dtype is torch.float32 and x.is_contiguous() and not torch.compiler.is_compiling()
            and (norm is None or (norm.dtype is torch.float32 and norm.is_contiguous()))):
        out = torch.empty(x.shape[:-1] + (w.n,), dtype=torch.float32)
        q8kernel.load_kernel().run4(x, w.packed, w.scales, out, norm, eps, swiglu)  # type: ignore[union-attr]
        return out
    flat = x.reshape(-1, x.shape[-1]).float().contiguous()
    if norm is not None:
        norm = norm.float().contiguous()
    if torch.compiler.is_compiling():
        out = _q4_matmul_op(flat, w.packed, w.scales, w.n, norm, float(eps), swiglu)
    else:
        kernel = q8kernel.load_kernel()
        assert kernel is not None, "Q4Weight runs only where the kernel loads"
        out = kernel.q4_matmul(flat, w.packed, w.scales, w.n, norm, eps, swiglu)
    return out.view(*x.shape[:-1], w.n)


Q6_SUPER = 8
"""Groups of 32 per ``Q6Weight`` super-block (one fp16 d per row: Q6_K's 256 weights)."""
Q6_GBYTES = 416
"""``Q6Weight.packed`` bytes per 16 rows and group of 32 (256 low nibbles, 128 high bits, 32
int8 sub-block scales)."""


@dataclass
class Q6Weight:
    """A weight [N, K] as 6-bit values in GGUF Q6_K's numbers, for chatui's 6-bit CPU kernel
    (``q6.c``): the output layer under ``--quantize int4``, as llama.cpp's Q4_K_M keeps it.

    The format, for whoever loads weights into it: q in 0..63 per weight, an int8 sc per row and
    sub-block of 16 along K, an fp16 d per row and super-block of 256 (8 groups of 32):

        w[n, i] = d[n, i // 256] * sc[n, i // 16] * (q[n, i] - 32)

    A Q6_K tensor is these arrays as they are (``from_gguf_blocks``: no rounding at all);
    ``quantize`` rounds anything else (the last super-block of a row may be short: K need only
    be a multiple of 32 after zero padding). 6.5625 bits a weight, Q6_K's size, against
    ``Q8Weight``'s 8.5: the output layer of the 1B to MoE shapes is a third to 60 % of the bytes
    an int4 token reads, and a 4-bit one cost 4 points of top-1 agreement on the default model.

    The kernel's layout (see ``kernels/q6.c``): rows in blocks of 16; ``packed`` [N/16, G, 416]
    uint8 (q = 32 past K), per block and group the low 4 bits as ``Q4Weight.packed``'s
    nibbles (256 bytes), the high 2 bits (128 bytes: half a, byte i holds at bits 2u the bits
    of row i // 4, column 16a + 4u + i % 4) and sc [2, 16] int8; ``scales`` [N/16,
    ceil(G / 8), 16] fp16, the rows' d. Zero rows and columns pad N and K to multiples of 16
    and 32.
    """

    packed: torch.Tensor  # [N/16, K/32, 416] uint8
    scales: torch.Tensor  # [N/16, ceil(K/256), 16] fp16
    n: int
    k: int

    @staticmethod
    def _empty(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows, group = q8kernel.ROWS, q8kernel.GROUP
        nb, g = -(-n // rows), -(-k // group)
        return (torch.zeros((nb, g, Q6_GBYTES), dtype=torch.uint8),
                torch.zeros((nb, -(-g // Q6_SUPER), rows), dtype=torch.float16))

    @staticmethod
    def _pack_rows(packed: torch.Tensor, scales: torch.Tensor, r0: int, q: torch.Tensor,
                   sc: torch.Tensor, d: torch.Tensor) -> None:
        """Write rows r0.. (r0 a multiple of 16) given as q [r, K] uint8 0..63, sc [r, K / 16]
        int8 and d [r, S] fp16 into the packed tensors (past N and K: zeros)."""
        rows, group = q8kernel.ROWS, q8kernel.GROUP
        g, s = packed.shape[1], scales.shape[1]
        r = -(-q.shape[0] // rows) * rows
        q = F.pad(q, (0, g * group - q.shape[1], 0, r - q.shape[0]), value=32)  # zeros
        sc = F.pad(sc.view(torch.uint8), (0, 2 * g - sc.shape[1], 0, r - sc.shape[0]))
        d = F.pad(d, (0, s - d.shape[1], 0, r - d.shape[0]))
        nb, b0 = r // rows, r0 // rows
        lo = (q & 0x0F).view(nb, rows, g, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)  # [b, g, p, r, j, h]
        out = packed[b0:b0 + nb]
        out[..., :256] = (lo[..., 0] | (lo[..., 1] << 4)).reshape(nb, g, 256)
        hi = (q >> 4).view(nb, rows, g, 2, 4, 4).permute(0, 2, 3, 1, 5, 4)  # [b, g, a, r, j, u]
        out[..., 256:384] = (hi[..., 0] | (hi[..., 1] << 2) | (hi[..., 2] << 4)
                             | (hi[..., 3] << 6)).reshape(nb, g, 128)
        out[..., 384:] = sc.view(nb, rows, g, 2).permute(0, 2, 3, 1).reshape(nb, g, 32)
        scales[b0:b0 + nb] = d.view(nb, rows, s).transpose(1, 2)

    @classmethod
    def from_groups(cls, q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> Q6Weight:
        """From q [N, K] (uint8, 0..63), sc [N, ceil(K / 16)] int8 and d [N, ceil(K / 256)]
        (cast to fp16)."""
        n, k = q.shape
        packed, scales = cls._empty(n, k)
        cls._pack_rows(packed, scales, 0, q.to(torch.uint8), sc.to(torch.int8),
                       d.to(torch.float16))
        return cls(packed, scales, n, k)

    @classmethod
    def quantize(cls, w: torch.Tensor, chunk_rows: int = 4096) -> Q6Weight:
        """``round_groups`` ``chunk_rows`` rows at a time."""
        return _quantize_in_chunks(cls, w, chunk_rows)

    @staticmethod
    def round_groups(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows [r, K] (any float dtype) rounded as Q6_K's numbers: (q [r, K32] uint8 0..63,
        sc [r, K32 / 16] int8, d [r, S] fp16), K32 being K rounded up to 32 (zeros). Each
        sub-block's step is at least max|w| / 31 (sc rounded up against the stored d =
        max step / 127, so no weight is clipped), q = round(w / (d * sc)) + 32."""
        r, k = w.shape
        kp = -(-k // 32) * 32
        g = kp // 32
        s = -(-g // Q6_SUPER)
        wp = F.pad(w.float().cpu(), (0, s * Q6_SUPER * 32 - k))  # whole super-blocks
        sub = wp.view(r, s, 16, 16)  # [r, S, sub-block, 16]
        step = sub.abs().amax(-1) / 31  # [r, S, 16]
        d16 = (step.amax(-1) / 127).clamp(max=65504).to(torch.float16)  # [r, S]
        d32 = d16.float()[..., None]
        sc = torch.where(d32 > 0, torch.ceil(step / d32.clamp(min=1e-30)), 0.0).clamp_(0, 127)
        e = (sc * d32)[..., None]  # [r, S, 16, 1]
        q = torch.where(e > 0, torch.round(sub / e.clamp(min=1e-30)), 0.0).clamp_(-32, 31) + 32
        q = q.to(torch.uint8).view(r, -1)[:, :kp]
        return q, sc.to(torch.int8).view(r, -1)[:, : kp // 16], d16

    @classmethod
    def from_gguf_blocks(cls, data: Any, shape: tuple[int, int]) -> Q6Weight:
        """From a GGUF Q6_K tensor's raw bytes (as ``Q4Weight.from_gguf_blocks`` takes them;
        ``shape`` (N, K) as transformers sees the weight), with no rounding.

        Raises:
            ValueError: K not a multiple of 256, or a size that does not match the shape.
        """
        return cls.from_groups(*cls.gguf_groups(data, shape))

    @staticmethod
    def gguf_groups(data: Any, shape: tuple[int, int]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A Q6_K tensor's (q [N, K] uint8, sc [N, K / 16] int8, d [N, K / 256] fp16), as
        llama.cpp's ``block_q6_K`` holds them (ql [128], qh [64], scales [16], d) and its
        ``dequantize_row_q6_K`` reads them."""
        n, k = shape
        if k % 256:
            raise ValueError(f"Q6_K rows of {k} weights are not whole blocks of 256")
        raw = _raw_bytes(data)
        if raw.numel() != n * k // 256 * 210:
            raise ValueError(f"Q6_K [{n}, {k}] takes {n * k // 256 * 210} bytes, got "
                             f"{raw.numel()}")
        blocks = raw.view(n, k // 256, 210)
        ql = blocks[..., :128].reshape(n, -1, 2, 64)  # two halves of 128 weights
        qh = blocks[..., 128:192].reshape(n, -1, 2, 1, 32)
        low = torch.cat([ql & 0x0F, ql >> 4], -1)  # [n, S, 2, 128]
        high = torch.cat([(qh >> (2 * c)) & 3 for c in range(4)], -2).reshape(n, -1, 2, 128)
        q = (low | (high << 4)).reshape(n, k)
        sc = blocks[..., 192:208].contiguous().view(torch.int8).reshape(n, k // 16)
        d = blocks[..., 208:210].contiguous().view(torch.float16)[..., 0]
        return q, sc, d

    @staticmethod
    def suits(shape: tuple[int, int]) -> bool:
        """Whether int4's output layer of this shape is held 6-bit: rows of whole super-blocks
        of 256, as llama.cpp's Q4_K_M decides (a Q6_K output layer there; Q8_0 otherwise,
        which the default model's 576-wide one gets, and keeps here as int8). Measured on the
        default model (``inference.quality``, its output layer alone rounded, everything else
        fp32): 6 bits cost it 3.8 points of top-1 agreement (96.2 %, ppl +0.67 %; an ideal
        6-bit rounding with an fp32 scale per 16 weights gives the same 96.2 %, 7 bits 98.8 %),
        where int4 as a whole must keep 97 %."""
        return shape[1] % 256 == 0

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.k)

    def _unpack(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows ``ids`` [n] as (q [n, G * 32] uint8, sc [n, 2G] int8, d [n, S] fp16). In numpy:
        a tied model looks its token's embedding row up here every decode step, and the same
        steps as torch ops took 0.18 ms a row (int8's lookup 0.04)."""
        import numpy as np

        flat = ids.reshape(-1).cpu().numpy().astype(np.int64)
        b, r = flat // q8kernel.ROWS, flat % q8kernel.ROWS
        at = np.arange(len(flat))
        blk = self.packed.numpy()[b]  # [n, G, 416]
        n, g = blk.shape[:2]
        low = blk[..., :256].reshape(n, g, 4, 16, 4)[at, :, :, r]  # [n, G, p, j]
        q = np.stack([low & 0x0F, low >> 4], -2).reshape(n, g * 32)  # column 8p + 4h + j
        hib = blk[..., 256:384].reshape(n, g, 2, 16, 4)[at, :, :, r]  # [n, G, a, j]
        shifts = np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]
        hi = ((hib[..., None, :] >> shifts) & 3).reshape(n, g * 32)  # column 16a + 4u + j
        sc = blk[..., 384:].reshape(n, g, 2, 16)[at, :, :, r].view(np.int8).reshape(n, 2 * g)
        d = self.scales.numpy()[b, :, r]
        return (torch.from_numpy(q | (hi << 4)), torch.from_numpy(np.ascontiguousarray(sc)),
                torch.from_numpy(np.ascontiguousarray(d)))

    def groups(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [N, K], sc [N, ceil(K / 32) * 2], d [N, S]): ``from_groups``' inverse."""
        q, sc, d = self._unpack(torch.arange(self.n))
        return q[:, : self.k], sc, d

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Dequantized rows (the tied embedding's lookup). ids: [...] -> [..., K]."""
        import numpy as np

        q, sc, d = (t.numpy() for t in self._unpack(ids))
        n, g2 = sc.shape
        step = sc.astype(np.float32) * np.repeat(d.astype(np.float32), 2 * Q6_SUPER, 1)[:, :g2]
        w = (q.astype(np.float32) - 32).reshape(n, g2, 16) * step[..., None]
        return torch.from_numpy(w.reshape(n, -1)[:, : self.k]).to(dtype).view(*ids.shape, self.k)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.rows(torch.arange(self.n), dtype)

    @property
    def nbytes(self) -> int:
        return self.packed.numel() + self.scales.numel() * self.scales.element_size()


def _raw_bytes(data: Any) -> torch.Tensor:
    """A GGUF tensor's bytes (bytes, a buffer, a numpy array or a tensor) as a flat uint8
    tensor, not copied."""
    if isinstance(data, torch.Tensor):
        raw = data
    elif hasattr(data, "__array_interface__"):  # a numpy array (a memory map of the file)
        with warnings.catch_warnings():  # read-only memory is only read here
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(data)  # type: ignore[arg-type]
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.frombuffer(data, dtype=torch.uint8)
    return raw.reshape(-1).view(torch.uint8)


@torch.library.custom_op("chatui::q6_matmul", mutates_args=())
def _q6_matmul_op(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
                  norm: torch.Tensor | None, eps: float) -> torch.Tensor:
    kernel = q8kernel.load_kernel()
    assert kernel is not None, "Q6Weight runs only where the kernel loads"
    out = x.new_empty((x.shape[0], n), dtype=torch.float32)
    kernel.run6(x, packed, scales, out, norm, eps, False)
    return out


@_q6_matmul_op.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
      norm: torch.Tensor | None, eps: float) -> torch.Tensor:
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


def q6_linear(x: torch.Tensor, w: Q6Weight, *, norm: torch.Tensor | None = None,
              eps: float = 0.0) -> torch.Tensor:
    """``q8_linear`` for a 6-bit ``Q6Weight`` (the fused norm too); x: [..., K] (any float
    dtype, CPU) -> [..., N] fp32."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.dtype is not torch.float32 or not flat.is_contiguous():
        flat = flat.float().contiguous()
    if norm is not None and (norm.dtype is not torch.float32 or not norm.is_contiguous()):
        norm = norm.float().contiguous()
    if torch.compiler.is_compiling():
        out = _q6_matmul_op(flat, w.packed, w.scales, w.n, norm, float(eps))
    else:
        kernel = q8kernel.load_kernel()
        assert kernel is not None, "Q6Weight runs only where the kernel loads"
        out = torch.empty((flat.shape[0], w.n), dtype=torch.float32)
        kernel.run6(flat, w.packed, w.scales, out, norm, eps, False)
    return out.view(*x.shape[:-1], w.n)


@dataclass
class PackedExperts:
    """A mixture's experts as one kernel call runs them (``q8_matmul_sel`` / ``q4_matmul_sel``):
    the data pointers of every expert's packed gate/up and down weights and scales, gathered
    once. A decode step then runs a token's k experts in two calls (every gate/up, then every
    down with SwiGLU fused), one thread team each, where a call per expert and projection (16
    for Qwen3-MoE's top 8) each started its own and quantized the same input again. The same
    pointer arrays go into ``decode.c``'s layer structs (``FastLlama._c_layers``), which run the
    router and these two calls inside the one C call for every layer; ``__call__`` serves the
    Python loop over the layers (a step the C call does not take).

    Only for experts that are all ``Q8Weight`` or all ``Q4Weight`` of one shape (``of``)."""

    experts: list[tuple[Any, Any]]
    """The (gate_up, down) weights the pointers point into (kept alive by this reference)."""
    bits: int
    gate_up: tuple[torch.Tensor, torch.Tensor]  # int64 [E] pointers: packed, scales
    down: tuple[torch.Tensor, torch.Tensor]
    n_gate_up: int  # 2 * the experts' intermediate size
    n_down: int  # hidden

    @classmethod
    def of(cls, experts: list[tuple[Any, Any]]) -> PackedExperts | None:
        """The experts' pointers, or None when they are not all of one kernel type and shape
        or the kernels did not load."""
        kinds = {type(w) for pair in experts for w in pair}
        if not experts or kinds not in ({Q8Weight}, {Q4Weight}) or q8kernel.load_kernel() is None:
            return None
        if len({(a.shape, b.shape) for a, b in experts}) != 1:
            return None
        gu, d = experts[0]
        if d.k * 2 != gu.n:
            return None

        def pointers(ws: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
            return (torch.tensor([w.packed.data_ptr() for w in ws], dtype=torch.int64),
                    torch.tensor([w.scales.data_ptr() for w in ws], dtype=torch.int64))

        return cls(experts, 8 if kinds == {Q8Weight} else 4, pointers([a for a, _ in experts]),
                   pointers([b for _, b in experts]), gu.n, d.n)

    def __call__(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """x [M, hidden] fp32 (normed), ids [M, k] the chosen experts, weights [M, k] fp32 their
        router weights -> [M, hidden] fp32: sum_j weights[m, j] * expert_{ids[m, j]}(x[m]).
        Reads each chosen expert once per row of x (for a decode step of one token)."""
        kernel = q8kernel.load_kernel()
        assert kernel is not None, "PackedExperts exist only where the kernel loads"
        m, k = ids.shape
        sel = ids.reshape(-1).to(torch.int64).contiguous()
        x = x.float().contiguous()
        gu = torch.empty((m * k, self.n_gate_up), dtype=torch.float32)
        kernel.matmul_sel(self.bits, x, k, *self.gate_up, sel, gu, False)
        y = torch.empty((m * k, self.n_down), dtype=torch.float32)
        kernel.matmul_sel(self.bits, gu, 1, *self.down, sel, y, True)
        return torch.bmm(weights.float().view(m, 1, k), y.view(m, k, self.n_down)).view(m, -1)
