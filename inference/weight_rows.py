"""Weights read a block of rows at a time, so a model is quantized without ever being whole in
fp32.

A checkpoint's weight that has not been loaded (a GGUF tensor, a bf16 safetensors tensor) is a
``Rows``: its shape, and ``read(rows)`` giving those rows in fp32. Fusing and reordering (the
fast runner's q/k/v and gate/up concatenations, its RoPE row order, transformers' reverse of
llama.cpp's q/k permutation, one expert of a stack) are index arithmetic over ``Rows``, so
quantizing reads each weight once, ``CHUNK_ELEMENTS`` values at a time, straight into the
quantized layout. A GGUF Q8_0 tensor also gives its blocks as they are (``read_q8``): that is
chatui's int8 layout (int8 in groups of 32 along K, one fp16 scale each), packed with no
rounding at all.

``take``, ``cat``, ``split``, ``expert``, ``to_q8``, ``to_q4``, ``to_q6``, ``to_int8``,
``to_int4`` and ``dense`` accept a plain tensor or a ``Rows`` alike, so the fast runner has one
code path.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np
import torch

from .quant import GGUF_Q4_TYPES, Int4Weight, Int8Weight, Q4Weight, Q6Weight, Q8Weight

CHUNK_ELEMENTS = 8 << 20
"""Weights per block of rows read at once (32 MiB in fp32): the quantizing temporaries."""


class Rows:
    """A weight [N, K] (or a stack [E, N, K], read as E * N rows) read by rows.

    Subclasses implement ``read`` and may implement ``read_q8`` and ``read_blocks``."""

    shape: tuple[int, ...]

    @property
    def n_rows(self) -> int:
        return int(np.prod(self.shape[:-1]))

    @property
    def k(self) -> int:
        return self.shape[-1]

    def read(self, rows: np.ndarray) -> torch.Tensor:
        """fp32 [len(rows), K] of these (flattened) row numbers."""
        raise NotImplementedError

    def read_q8(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(int8 [r, K], fp16 scales [r, K / 32]) when the weight is stored that way (GGUF
        Q8_0), else None."""
        return None

    def read_blocks(self, rows: np.ndarray) -> tuple[str, np.ndarray] | None:
        """(GGUF block type, uint8 [r, bytes per row]) when stored in GGUF blocks, else None."""
        return None

    def q4_groups(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """These rows as ``Q4Weight``'s groups (q [r, K32] uint8, d and m [r, K32 / 32]
        fp16): a GGUF 4-bit tensor's own blocks (Q4_0 / Q4_1 / Q4_K, repacked with no
        requantization), anything else rounded by ``Q4Weight.round_groups``."""
        blocks = self.read_blocks(rows)
        if blocks is not None and blocks[0] in GGUF_Q4_TYPES and self.k % 32 == 0:
            q, d, m = Q4Weight.gguf_groups(torch.from_numpy(blocks[1]), blocks[0],
                                           (len(rows), self.k))
            return q, d.to(torch.float16), m.to(torch.float16)
        return Q4Weight.round_groups(self.read(rows))

    def q6_groups(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """These rows as ``Q6Weight``'s (q, sc, d): a GGUF Q6_K tensor's own blocks (the
        output layer of a Q4_K_M file, loaded with no rounding), anything else rounded by
        ``Q6Weight.round_groups``."""
        blocks = self.read_blocks(rows)
        if blocks is not None and blocks[0] == "Q6_K" and self.k % 256 == 0:
            return Q6Weight.gguf_groups(torch.from_numpy(blocks[1]), (len(rows), self.k))
        return Q6Weight.round_groups(self.read(rows))

    def chunk_rows(self) -> int:
        """Rows per read: ``CHUNK_ELEMENTS`` values, a multiple of 16 (the kernels' row block)."""
        return max(16, CHUNK_ELEMENTS // max(1, self.k) // 16 * 16)


class Taken(Rows):
    """Rows ``index`` of ``base`` (a reorder, a slice, one expert)."""

    def __init__(self, base: Rows, index: np.ndarray, shape: tuple[int, ...] | None = None):
        self.base, self.index = base, np.asarray(index, dtype=np.int64)
        self.shape = shape or (len(self.index), base.k)

    def read(self, rows: np.ndarray) -> torch.Tensor:
        return self.base.read(self.index[rows])

    def read_q8(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self.base.read_q8(self.index[rows])

    def read_blocks(self, rows: np.ndarray) -> tuple[str, np.ndarray] | None:
        return self.base.read_blocks(self.index[rows])

    def q4_groups(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.base.q4_groups(self.index[rows])

    def q6_groups(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.base.q6_groups(self.index[rows])


class Concat(Rows):
    """The rows of several weights with the same K, one after another."""

    def __init__(self, parts: Sequence[Rows]):
        self.parts = list(parts)
        ks = {p.k for p in self.parts}
        if len(ks) != 1:
            raise ValueError(f"cannot concatenate rows of different lengths {sorted(ks)}")
        self.starts = np.cumsum([0] + [p.n_rows for p in self.parts])
        self.shape = (int(self.starts[-1]), ks.pop())

    def _each(self, rows: np.ndarray, read: Callable[[Rows, np.ndarray], object]
              ) -> list[tuple[slice | torch.Tensor, object]]:
        """(where in ``rows``, what ``read`` gave) per part; a slice where the positions are a
        run (the usual case: rows in order), as an index copy of a block is far slower."""
        part = np.searchsorted(self.starts, rows, side="right") - 1
        out: list[tuple[slice | torch.Tensor, object]] = []
        for i in np.unique(part):
            where = np.nonzero(part == i)[0]
            got = read(self.parts[i], rows[where] - self.starts[i])
            run = where[-1] - where[0] + 1 == len(where)
            out.append((slice(int(where[0]), int(where[-1]) + 1) if run
                        else torch.from_numpy(where), got))
        return out

    def read(self, rows: np.ndarray) -> torch.Tensor:
        got = self._each(rows, lambda p, r: p.read(r))
        if len(got) == 1:
            return got[0][1]  # type: ignore[return-value]
        out = torch.empty((len(rows), self.k), dtype=torch.float32)
        for where, values in got:
            out[where] = values  # type: ignore[index]
        return out

    def read_q8(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        got = self._each(rows, lambda p, r: p.read_q8(r))
        if any(g is None for _, g in got):
            return None
        if len(got) == 1:
            return got[0][1]  # type: ignore[return-value]
        q = torch.empty((len(rows), self.k), dtype=torch.int8)
        s = torch.empty((len(rows), self.k // 32), dtype=torch.float16)
        for where, pair in got:
            q[where], s[where] = pair  # type: ignore[index, misc]
        return q, s

    def q4_groups(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each part's groups (its own 4-bit blocks where it has them: Q4_K_M mixes Q4_K and
        Q6_K tensors in one fused projection)."""
        got = self._each(rows, lambda p, r: p.q4_groups(r))
        if len(got) == 1:
            return got[0][1]  # type: ignore[return-value]
        q0, d0, _ = got[0][1]  # type: ignore[misc]
        q = torch.empty((len(rows), q0.shape[1]), dtype=torch.uint8)
        d = torch.empty((len(rows), d0.shape[1]), dtype=torch.float16)
        m = torch.empty_like(d)
        for where, (gq, gd, gm) in got:  # type: ignore[misc]
            q[where], d[where], m[where] = gq, gd, gm
        return q, d, m


Weight = Union[torch.Tensor, Rows]


def take(w: Weight, index: torch.Tensor) -> Weight:
    """``w[index]`` (rows)."""
    if isinstance(w, Rows):
        return Taken(w, index.cpu().numpy())
    return w[index]


def cat(ws: Sequence[Weight]) -> Weight:
    """The rows of each weight, one after another."""
    if any(isinstance(w, Rows) for w in ws):
        return Concat([w if isinstance(w, Rows) else TensorRows(w) for w in ws])
    return torch.cat(list(ws))  # type: ignore[arg-type]


def split(w: Weight, sizes: Sequence[int]) -> list[Weight]:
    """``w.split(sizes)`` along the rows."""
    if not isinstance(w, Rows):
        return list(w.split(list(sizes)))
    starts = np.cumsum([0, *sizes])
    return [Taken(w, np.arange(a, b)) for a, b in zip(starts[:-1], starts[1:])]


def expert(w: Weight, e: int) -> Weight:
    """Expert ``e`` [N, K] of a stack [E, N, K]."""
    if not isinstance(w, Rows):
        return w[e]
    n = w.shape[1]
    return Taken(w, np.arange(e * n, (e + 1) * n))


class TensorRows(Rows):
    """A tensor already in memory, as ``Rows``."""

    def __init__(self, t: torch.Tensor):
        self.t = t.detach().reshape(-1, t.shape[-1])
        self.shape = tuple(t.shape)

    def read(self, rows: np.ndarray) -> torch.Tensor:
        return self.t[torch.from_numpy(rows)].float()


def _blocks(w: Rows) -> list[np.ndarray]:
    step = w.chunk_rows()
    return [np.arange(r0, min(r0 + step, w.n_rows)) for r0 in range(0, w.n_rows, step)]


def dense(w: Weight, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """The weight as one tensor of ``dtype`` (read a block of rows at a time)."""
    if not isinstance(w, Rows):
        return w.detach().to(device, dtype)
    out = torch.empty((w.n_rows, w.k), dtype=dtype, device=device)
    for rows in _blocks(w):
        out[rows[0]:rows[-1] + 1] = w.read(rows).to(device, dtype)
    return out.view(w.shape)


def to_q8(w: Weight) -> Q8Weight:
    """chatui's group-wise int8: a Q8_0 tensor's blocks as they are, anything else rounded
    (``Q8Weight.round_groups``) a block of rows at a time."""
    if not isinstance(w, Rows):
        return Q8Weight.quantize(w)
    n, k = w.shape
    kp = -(-k // 32) * 32
    exact = k % 32 == 0 and w.read_q8(np.arange(min(n, 1))) is not None

    def groups(r0: int, r1: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = np.arange(r0, r1)
        if exact:
            got = w.read_q8(rows)
            assert got is not None
            return got
        x = w.read(rows)
        if kp != k:
            x = torch.nn.functional.pad(x, (0, kp - k))
        return Q8Weight.round_groups(x)

    return Q8Weight.from_groups(n, k, groups, w.chunk_rows())


def to_int8(w: Weight, scale_dtype: torch.dtype, device: torch.device) -> Int8Weight:
    """Per-output-channel int8 (torch's kernel), a block of rows at a time."""
    if not isinstance(w, Rows):
        q = Int8Weight.quantize(w, scale_dtype)
    else:
        parts = [Int8Weight.quantize(w.read(rows), scale_dtype) for rows in _blocks(w)]
        q = Int8Weight(torch.cat([p.q for p in parts]), torch.cat([p.scales for p in parts]))
    return Int8Weight(q.q.to(device), q.scales.to(device, scale_dtype))


def to_int4(w: Weight) -> Int4Weight:
    """int4 in groups of 32 (``Int4Weight``), a block of rows at a time."""
    if not isinstance(w, Rows):
        return Int4Weight.quantize(w)
    parts = [Int4Weight.quantize(w.read(rows)) for rows in _blocks(w)]
    q = torch.cat([p.q for p in parts])
    sz = torch.cat([p.scales_zeros for p in parts], dim=1)
    return Int4Weight(q, sz).pack()


def to_q4(w: Weight) -> Q4Weight:
    """chatui's int4 (``Q4Weight``: GGUF Q4_1-style groups of 32), a block of rows at a time:
    a GGUF Q4_0 / Q4_1 / Q4_K tensor from its own blocks (``Rows.q4_groups``: decoded as the
    file stores them, where dequantizing and rounding again to Q4_1 groups took a 1B Q4_K_M
    model's first start 84 s and added a second rounding), anything else rounded."""
    if not isinstance(w, Rows):
        return Q4Weight.quantize(w)
    n, k = w.shape
    packed, scales = Q4Weight._empty(n, k)
    for rows in _blocks(w):
        Q4Weight._pack_rows(packed, scales, int(rows[0]), *w.q4_groups(rows))
    return Q4Weight(packed, scales, n, k)


def to_q6(w: Weight) -> Q6Weight:
    """chatui's 6-bit (``Q6Weight``: GGUF Q6_K's numbers), a block of rows at a time: a GGUF
    Q6_K tensor from its own blocks (``Rows.q6_groups``), anything else rounded."""
    if not isinstance(w, Rows):
        return Q6Weight.quantize(w)
    n, k = w.shape
    packed, scales = Q6Weight._empty(n, k)
    for rows in _blocks(w):
        Q6Weight._pack_rows(packed, scales, int(rows[0]), *w.q6_groups(rows))
    return Q6Weight(packed, scales, n, k)
