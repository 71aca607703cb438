"""safetensors files written a tensor at a time and read as memory maps: the disk cache of
quantized weights.

``safetensors.torch.save_file`` turns every tensor into a bytes object before writing, so saving
a model's int8 weights held them twice (1.3 GB more at the peak of a 1B model's first start);
``save`` writes the header, then each tensor's bytes from its own memory. ``load_file`` copies
every tensor into new memory; ``load_mapped`` maps the file (copy-on-write, so the tensors are
writable as torch expects, though nothing writes them) and makes each tensor a view of its
bytes: a later start costs a header parse, and the pages are read when the weights are first
used. ``load_resident`` reads the file into one private buffer in huge pages instead (where the
kernel has them) and makes each tensor a view of that: one copy in memory as with the mapping,
but a decode step streaming the weights through it misses the TLB 512 times less often
(``hugepages``). Tensors are laid out by element size, largest first, after a header padded to
8 bytes, so each starts aligned to its element size.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO, Callable

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
        n, header = _header(f, size)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size > 8 + n else None
    return _views(header, mapped, 8 + n, size - 8 - n)


def load_resident(path: Path, stop: Callable[[], bool] | None = None
                  ) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file as a view of one private copy of the file's bytes in
    huge pages (``hugepages.read_file``: a decode step streaming the weights is 5-12% quicker
    there than on the file's 4 KB pages); ``load_mapped`` where the kernel gives no huge pages.

    ``stop`` is ``hugepages.read_file``'s.

    Raises:
        ValueError: not a safetensors file (or a truncated one).
        OSError: the file could not be read.
        hugepages.ReadStopped: ``stop()`` said so before the end.
    """
    from . import hugepages

    if not hugepages.huge_pages_available():
        return load_mapped(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        n, header = _header(f, size)
    if size <= 8 + n:
        return _views(header, None, 0, size - 8 - n)
    buf, start = hugepages.read_file(path, stop)
    return _views(header, buf, start + 8 + n, size - 8 - n)


def _header(f: BinaryIO, size: int) -> tuple[int, dict[str, Any]]:
    """(the header's length, the header) of the safetensors file ``f`` of ``size`` bytes."""
    (n,) = struct.unpack("<Q", f.read(8))
    if n > size - 8:
        raise ValueError("the header is longer than the file")
    return n, json.loads(f.read(n))


def _views(header: dict[str, Any], buf: Any, data: int, length: int
           ) -> dict[str, torch.Tensor]:
    """The header's tensors as views of ``buf``, whose byte ``data`` is the first of the file's
    ``length`` bytes of tensor data; empty tensors where ``buf`` is None.

    Raises:
        ValueError: a tensor lies past the end of the data.
    """
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES[info["dtype"]]
        start, stop = info["data_offsets"]
        if stop > length:
            raise ValueError(f"{name} lies past the end of the file")
        count = (stop - start) // torch.empty((), dtype=dtype).element_size()
        if count == 0 or buf is None:
            out[name] = torch.empty(info["shape"], dtype=dtype)
            continue
        t = torch.frombuffer(buf, dtype=dtype, count=count, offset=data + start)
        out[name] = t.view(info["shape"])
    return out
