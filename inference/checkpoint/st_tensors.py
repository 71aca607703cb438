"""A safetensors checkpoint's tensors, read a block of rows at a time (bf16 and fp16 files
quantized tensor by tensor, never the model in fp32).

``from_pretrained(dtype=float32)`` of a bf16 checkpoint holds the whole model in fp32 (twice
the file) before anything is quantized. Here each parameter is a ``weight_rows.Rows`` over its
bytes in the file: rows are contiguous, so a block of rows is one ``readinto`` (not a memory
map, whose touched pages would count as resident until unmapped), converted to fp32 only for
that block. Only checkpoints whose tensor names and shapes are the model's own are read this
way; one that transformers renames or reshapes on load (per-expert MoE weights it stacks,
legacy names) raises ``NotPlain`` and is loaded by ``from_pretrained`` as before.
"""

from __future__ import annotations

import json
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..weight_rows import Rows, dense

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64}


class NotPlain(Exception):
    """The checkpoint's tensors are not the model's parameters as they are."""


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute, in the file


def _header(path: Path) -> dict[str, _Entry]:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info["dtype"])
        if dtype is None:
            raise NotPlain(f"{name} is stored as {info['dtype']}")
        out[name] = _Entry(path, dtype, tuple(info["shape"]), 8 + n + info["data_offsets"][0])
    return out


class _Files:
    """Open files, read at offsets by any thread."""

    def __init__(self) -> None:
        self.handles: dict[Path, Any] = {}
        self.lock = threading.Lock()

    def read_into(self, path: Path, out: np.ndarray, offset: int) -> None:
        view = memoryview(out).cast("B")
        with self.lock:
            f = self.handles.get(path)
            if f is None:
                f = self.handles[path] = path.open("rb", buffering=0)
            f.seek(offset)
            got = 0
            while got < len(view):
                n = f.readinto(view[got:])
                if not n:
                    raise OSError(f"{path} is truncated")
                got += n


class SafetensorsRows(Rows):
    """One tensor [..., K] of a safetensors file."""

    def __init__(self, files: _Files, entry: _Entry):
        self.files, self.entry = files, entry
        self.shape = entry.shape if len(entry.shape) > 1 else (1, entry.shape[0])
        self.row_bytes = self.k * torch.empty((), dtype=entry.dtype).element_size()

    def read(self, rows: np.ndarray) -> torch.Tensor:
        out = torch.empty((len(rows), self.k), dtype=torch.float32)
        if len(rows) == 0:
            return out
        lo, hi = int(rows.min()), int(rows.max()) + 1
        if hi - lo <= 2 * len(rows) + 64:
            runs = [(lo, hi, np.arange(len(rows)), rows - lo)]
        else:
            runs = [(int(r), int(r) + 1, np.array([i]), np.array([0])) for i, r in enumerate(rows)]
        for a, b, where, pick in runs:
            raw = np.empty((b - a) * self.row_bytes, dtype=np.uint8)
            self.files.read_into(self.entry.file, raw, self.entry.offset + a * self.row_bytes)
            block = torch.from_numpy(raw).view(self.entry.dtype).view(b - a, self.k)
            out[torch.from_numpy(where)] = block[torch.from_numpy(pick)].float()
        return out


class SafetensorsWeights:
    """A checkpoint's tensors by parameter name, for ``model`` (a skeleton: names and shapes).

    Raises:
        NotPlain: a parameter is missing or has another shape (transformers converts it on
            load), or a tensor's dtype is not a float type.
    """

    def __init__(self, files: list[Path], model: Any):
        self.entries: dict[str, _Entry] = {}
        for f in files:
            self.entries.update(_header(f))
        self.files = _Files()
        for name, p in model.named_parameters():
            entry = self.entries.get(name)
            if entry is None or entry.shape != tuple(p.shape):
                raise NotPlain(f"{name} is not in the checkpoint as the model has it")

    def rows(self, name: str) -> Rows:
        return SafetensorsRows(self.files, self.entries[name])

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dense(self.rows(name), dtype).view(self.entries[name].shape)
