"""Whether a model's weights fit in memory, asked before they are loaded.

A model too large for the machine used to be loaded until the kernel's OOM killer ended the
process (a 7B Q4_K_M GGUF on a 24 GB machine, through the fp32 detour). Now the size the
weights will take (``weight_bytes``: per parameter, at the precision or quantization they will
be held in) is compared with the memory available (``available_bytes``: the kernel's
MemAvailable, or the cgroup's limit less its usage when that is lower, as in a container) and
a model that does not fit gets one sentence saying what it needs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterable

import torch

WORKING_ROOM = 512 << 20
"""Bytes beyond the weights a load needs: a block of rows being quantized, the tokenizer, the
KV cache of a short chat."""

_GB = 1e9


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def available_bytes() -> int | None:
    """Memory this process can still use, or None where it cannot be told (not Linux)."""
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        return None
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_file), _read_int(usage_file)
        if limit is not None and usage is not None and limit < (1 << 60):
            room = max(0, limit - usage)
            avail = room if avail is None else min(avail, room)
            break
    return avail


@functools.lru_cache(maxsize=None)
def bytes_per_weight(kind: str) -> float:
    """Bytes a weight takes held as ``kind`` ("int8", "int8-per-channel", "int4", "int6"),
    measured on a sample weight through the quantizers the runner uses (every tensor the
    quantized object holds, so a layout change is followed)."""
    from .. import weight_rows

    sample = torch.randn(256, 1024)
    if kind == "int8":
        q: Any = weight_rows.to_q8(sample)
    elif kind == "int8-per-channel":
        q = weight_rows.to_int8(sample, torch.bfloat16, torch.device("cpu"))
    elif kind == "int6":
        q = weight_rows.to_q6(sample)
    else:
        q = weight_rows.to_int4(sample)
    held = sum(t.numel() * t.element_size() for t in vars(q).values()
               if isinstance(t, torch.Tensor))
    return held / sample.numel()


def weight_bytes(params: Iterable[tuple[str, tuple[int, ...], torch.dtype]], quantize: str,
                 q8: bool) -> int:
    """Bytes of (name, shape, dtype) parameters held as the runner will hold them:
    ``quantize`` "none" keeps each in its dtype; "int8" / "int4" quantize the large ones
    (``lazy_model.LAZY``), int4 keeping the embedding int8 and the output layer 6-bit (int8
    without chatui's kernels, or rows not a multiple of 256) as the fast runner does; ``q8``
    says chatui's group-wise int8 kernel is used."""
    from .lazy_model import LAZY

    int8 = "int8" if q8 else "int8-per-channel"
    total = 0.0
    for name, shape, dtype in params:
        n = 1
        for d in shape:
            n *= d
        if quantize == "none" or len(shape) < 2 or not LAZY.search(name):
            total += n * torch.empty((), dtype=dtype).element_size()
        elif quantize == "int4" and not name.endswith(("embed_tokens.weight", "lm_head.weight")):
            total += n * bytes_per_weight("int4")
        elif quantize == "int4" and q8 and name.endswith("lm_head.weight") and shape[-1] % 256 == 0:
            total += n * bytes_per_weight("int6")
        else:
            total += n * bytes_per_weight(int8)
    return int(total)


def fits_sentence(need: int, what: str) -> str | None:
    """None when ``need`` bytes (plus ``WORKING_ROOM``) fit in the memory available, else the
    sentence saying they do not."""
    avail = available_bytes()
    if avail is None or need + WORKING_ROOM <= avail:
        return None
    return (f"This model needs {need / _GB:.1f} GB of memory for {what} but only "
            f"{avail / _GB:.1f} GB is available, so it was not loaded; close other programs, "
            "or pick a smaller model or a smaller quantization (--quantize int8 or int4).")
