"""safetensors files written a tensor at a time and read as memory maps: the disk cache of
quantized weights.

``safetensors.torch.save_file`` turns every tensor into a bytes object before writing, so saving
a model's int8 weights held them twice (1.3 GB more at the peak of a 1B model's first start);
``save`` writes the header, then each tensor's bytes from its own memory. ``load_file`` copies
every tensor into new memory; ``load_mapped`` maps the file (copy-on-write, so the tensors are
writable as torch expects, though nothing writes them) and makes each tensor a view of its
bytes: a later start costs a header parse, and the pages are read when the weights are first
used. Tensors are laid out by element size, largest first, after a header padded to 8 bytes,
so each starts aligned to its element size.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import torch

_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
          torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
          torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_DTYPES = {v: k for k, v in _NAMES.items()}


def save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write ``tensors`` (CPU) as a safetensors file, one tensor's bytes at a time."""
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for name in order:
        t = tensors[name]
        n = t.numel() * t.element_size()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in order:
            t = tensors[name].detach().contiguous().cpu()
            if t.numel():
                f.write(memoryview(t.view(torch.uint8).reshape(-1).numpy()))
        f.flush()
        os.fsync(f.fileno())


def load_mapped(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file as a view of the file mapped into memory.

    Raises:
        ValueError: not a safetensors file (or a truncated one).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise ValueError("the header is longer than the file")
        header = json.loads(f.read(n))
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 8 + n else None
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        start, stop = info["data_offsets"]
        if 8 + n + stop > size:
            raise ValueError(f"{name} lies past the end of the file")
        count = (stop - start) // torch.empty((), dtype=dtype).element_size()
        if count == 0 or mapped is None:
            out[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        t = torch.frombuffer(mapped, dtype=dtype, count=count, offset=8 + n + start)
        out[name] = t.view(info["shape"])
    return out
