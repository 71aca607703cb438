"""A GGUF file's tensors under transformers' parameter names, read a block of rows at a time.

Before, a GGUF was dequantized whole by transformers into an fp32 safetensors copy (a 1.1 GB
Q4_K_M file of a 1.5B model took 87 s, peaked at 10.1 GB and left 8.4 GB in the cache). Here
each weight is a ``weight_rows.Rows`` over the file: its blocks are read with ``readinto`` (not
a memory map: mapped pages a process has touched count as its resident memory until unmapped)
and dequantized with the ``gguf`` package's numpy code a block of rows at a time, or, for
Q8_0, handed over as they are.

Names and layout are transformers' own (``get_gguf_hf_weights_map`` and its tensor
processors), so the weights equal its GGUF reader's: llama.cpp's converter permutes llama's q
and k rows (RoPE pairs interleaved), which transformers reverses, and here that reverse is a row
index; Qwen2/3-MoE's stacked gate and up experts become one ``gate_up_proj``, also an index; small
tensors (norms, biases) go through transformers' processor itself (Gemma's norms are stored as
1 + weight). Architectures whose processor reshapes large tensors some other way (BLOOM, GPT-2,
T5, Mamba, ...) are not read here (``lazy_supported``): transformers loads them as before.

The header is parsed here too, with ``struct`` over the file's first bytes: ``GGUFReader``
builds a numpy array per vocabulary entry and took 2.4 s on the default model's 49k-token
header, where this takes a fraction of that; the tokenizer and config are transformers'
reader's business, once, when the GGUF is first opened (``gguf.py``).
"""

from __future__ import annotations

import contextlib
import functools
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..weight_rows import Concat, Rows, Taken, dense
from .errors import CheckpointError, reason

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_LAZY_PROCESSORS = ("llama", "qwen2moe", "qwen3moe", "gemma2", "gemma3", "nemotron")
"""Architectures with a transformers tensor processor whose effect on large tensors is
mirrored here (or that only touch norms); every architecture without a processor is plain."""


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor's blocks are: numpy-order shape ([..., K]), GGML type, absolute offset."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.ggml_type).name

    @property
    def row_bytes(self) -> int:
        from gguf.constants import GGML_QUANT_SIZES
        from gguf import GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        return self.shape[-1] // block * size


@dataclass(frozen=True)
class Layout:
    """A GGUF file's architecture and tensors."""

    architecture: str
    tensors: dict[str, TensorInfo]


def read_layout(path: Path) -> Layout:
    """Parse the header (metadata skipped, except the architecture and alignment).

    Raises:
        CheckpointError: not a GGUF file, or a truncated one.
    """
    try:
        with path.open("rb") as f:
            return _parse(f)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise CheckpointError(f"Cannot read the GGUF file {path} ({reason(exc)}).") from exc


class _Reader:
    """Buffered little-endian reads from the start of a file."""

    def __init__(self, f: Any):
        self.f, self.buf, self.pos = f, b"", 0

    def take(self, n: int) -> bytes:
        while self.pos + n > len(self.buf):
            more = self.f.read(max(1 << 20, n))
            if not more:
                raise ValueError("the file ends inside its header")
            self.buf = self.buf[self.pos:] + more
            self.pos = 0
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("<Q")).decode("utf-8")

    def skip_value(self, kind: int) -> None:
        if kind == _STRING:
            self.take(self.unpack("<Q"))
        elif kind == _ARRAY:
            sub, count = self.unpack("<I"), self.unpack("<Q")
            if sub in _SCALAR:
                self.take(struct.calcsize(_SCALAR[sub]) * count)
            else:
                for _ in range(count):
                    self.skip_value(sub)
        elif kind in _SCALAR:
            self.take(struct.calcsize(_SCALAR[kind]))
        else:
            raise ValueError(f"unknown metadata type {kind}")


def _parse(f: Any) -> Layout:
    r = _Reader(f)
    if r.take(4) != b"GGUF":
        raise ValueError("it does not start with GGUF")
    version = r.unpack("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old")
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    arch, alignment = "", 32
    for _ in range(n_kv):
        key, kind = r.string(), r.unpack("<I")
        if key == "general.architecture" and kind == _STRING:
            arch = r.string()
        elif key == "general.alignment" and kind in _SCALAR:
            alignment = int(r.unpack(_SCALAR[kind]))
        else:
            r.skip_value(kind)
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        kind, offset = r.unpack("<I"), r.unpack("<Q")
        infos.append((name, tuple(reversed(dims)), kind, offset))
    header_end = f.tell() - (len(r.buf) - r.pos)
    start = -(-header_end // alignment) * alignment
    tensors = {name: TensorInfo(name, shape, kind, start + offset)
               for name, shape, kind, offset in infos}
    return Layout(arch, tensors)


class _File:
    """One open file, read at offsets by any thread."""

    def __init__(self, path: Path):
        self.path = path
        self.f = path.open("rb", buffering=0)
        self.lock = threading.Lock()

    def read_into(self, out: np.ndarray, offset: int) -> None:
        view = memoryview(out).cast("B")
        with self.lock:
            self.f.seek(offset)
            got = 0
            while got < len(view):
                n = self.f.readinto(view[got:])
                if not n:
                    raise CheckpointError(f"The GGUF file {self.path} is truncated.")
                got += n


class GGUFRows(Rows):
    """One GGUF tensor [N, K] (a stack [E, N, K] as E * N rows)."""

    def __init__(self, file: _File, info: TensorInfo):
        self.file, self.info = file, info
        self.shape = info.shape if len(info.shape) > 1 else (1, info.shape[0])

    def _raw(self, rows: np.ndarray) -> np.ndarray:
        """uint8 [len(rows), bytes per row]; one read for a span of nearby rows."""
        nbytes = self.info.row_bytes
        out = np.empty((len(rows), nbytes), dtype=np.uint8)
        if len(rows) == 0:
            return out
        lo, hi = int(rows.min()), int(rows.max()) + 1
        if hi - lo == len(rows) and rows[0] == lo and (np.diff(rows) == 1).all():
            self.file.read_into(out, self.info.offset + lo * nbytes)  # a run: read in place
            return out
        if hi - lo <= 2 * len(rows) + 64:
            span = np.empty((hi - lo, nbytes), dtype=np.uint8)
            self.file.read_into(span, self.info.offset + lo * nbytes)
            out[:] = span[rows - lo]
            return out
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        breaks = np.nonzero(np.diff(sorted_rows) != 1)[0] + 1
        for run in np.split(np.arange(len(rows)), breaks):
            first = int(sorted_rows[run[0]])
            chunk = np.empty((len(run), nbytes), dtype=np.uint8)
            self.file.read_into(chunk, self.info.offset + first * nbytes)
            out[order[run]] = chunk
        return out

    def read(self, rows: np.ndarray) -> torch.Tensor:
        from gguf import GGMLQuantizationType, dequantize

        raw = self._raw(rows)
        values = dequantize(raw, GGMLQuantizationType(self.info.ggml_type))
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(
            len(rows), self.k)

    def read_q8(self, rows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.info.type_name != "Q8_0":
            return None
        blocks = self._raw(rows).reshape(len(rows), self.k // 32, 34)
        scales = np.ascontiguousarray(blocks[..., :2]).view(np.float16)[..., 0]
        q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(len(rows), self.k)
        return torch.from_numpy(q), torch.from_numpy(np.ascontiguousarray(scales))

    def read_blocks(self, rows: np.ndarray) -> tuple[str, np.ndarray] | None:
        return self.info.type_name, self._raw(rows)


@contextlib.contextmanager
def _name_maps_cached() -> Iterator[None]:
    """``get_gguf_hf_weights_map`` builds gguf's ``TensorNameMap`` for every submodule it
    visits (215 for a 16-layer llama: 3.4 s of a cached start's 10 s); it is the same map each
    time, so it is built once while the function runs."""
    import gguf

    real = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(real)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = real


def lazy_supported(architecture: str) -> bool:
    """Whether this GGUF architecture's tensors are read here (else transformers loads it)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    return architecture not in TENSOR_PROCESSORS or architecture in _LAZY_PROCESSORS


def _reverse_permutation(n_rows: int, n_head: int) -> np.ndarray:
    """transformers' ``LlamaTensorProcessor._reverse_permute_weights`` as a row index:
    its output row r is the file's row index[r]."""
    dim = n_rows // n_head // 2
    return np.arange(n_rows).reshape(n_head, dim, 2).swapaxes(2, 1).reshape(n_rows)


class GGUFWeights:
    """The tensors of a GGUF file by transformers parameter name, for ``model`` (a skeleton of
    the file's architecture: only its names, shapes and config are used).

    Raises:
        CheckpointError: a parameter the file lacks, or of another shape.
    """

    def __init__(self, path: Path, model: Any, layout: Layout | None = None):
        from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS,
                                                              TensorProcessor,
                                                              get_gguf_hf_weights_map)

        self.path = path
        self.layout = layout or read_layout(path)
        self.arch = self.layout.architecture
        cfg = model.config.get_text_config()
        self.processor = TENSOR_PROCESSORS.get(self.arch, TensorProcessor)(config=cfg.to_dict())
        self.heads = (getattr(cfg, "num_attention_heads", None),
                      getattr(cfg, "num_key_value_heads", None))
        self.file = _File(path)
        with _name_maps_cached():
            to_hf = get_gguf_hf_weights_map(model, self.processor)
        self.gguf_names: dict[str, list[str]] = {}
        for gguf_name, hf_name in to_hf.items():
            # stacked experts are mapped without their ".weight" (transformers' processor
            # matches the file's names with it)
            for candidate in (gguf_name, gguf_name + ".weight"):
                if candidate in self.layout.tensors:
                    self.gguf_names.setdefault(hf_name, []).append(candidate)
                    break
        for hf_name in self.gguf_names:
            self.gguf_names[hf_name].sort()
        self._check(model)

    def _check(self, model: Any) -> None:
        for name, p in model.named_parameters():
            if name not in self.gguf_names:
                raise CheckpointError(
                    f"The GGUF file {self.path} has no tensor for {name}, so it does not hold "
                    f"a complete {model.config.model_type} model.")
            got = self.shape(name)
            if got != tuple(p.shape):
                raise CheckpointError(
                    f"The GGUF file {self.path} stores {name} as {list(got)} where its config "
                    f"says {list(p.shape)}, so it cannot be loaded.")

    def _process(self, values: np.ndarray, name: str) -> np.ndarray:
        """transformers' tensor processor on a small (1-D) tensor: Gemma's norms minus 1, a
        shared-expert gate given its row dimension."""
        return self.processor.process(weights=values, name=name, tensor_key_mapping=None,
                                      parsed_parameters={"tensors": {}}).weights

    def shape(self, hf_name: str) -> tuple[int, ...]:
        """The parameter's shape as transformers' reader gives it."""
        names = self.gguf_names[hf_name]
        shape = self.layout.tensors[names[0]].shape
        if len(names) == 2:  # stacked experts' gate and up: [E, 2I, K]
            e, i, k = shape
            return (e, 2 * i, k)
        if len(shape) == 1:
            return tuple(self._process(np.zeros(shape, dtype=np.float32), names[0]).shape)
        return shape

    def rows(self, hf_name: str) -> Rows:
        """The parameter as rows (2 or 3 dimensions), laid out as transformers' reader does."""
        names = self.gguf_names[hf_name]
        parts = [GGUFRows(self.file, self.layout.tensors[n]) for n in names]
        if len(parts) == 2:  # ffn_gate_exps, ffn_up_exps -> gate_up_proj [E, 2I, K]
            gate, up = (parts if "gate_exps" in names[0] else parts[::-1])
            e, i, k = gate.shape
            j = np.arange(i)
            index = np.concatenate([np.concatenate([x * i + j, e * i + x * i + j])
                                    for x in range(e)])
            return Taken(Concat([gate, up]), index, (e, 2 * i, k))
        rows = parts[0]
        name = names[0]
        if self.arch == "llama" and None not in self.heads:
            heads, kv = self.heads
            if ".attn_q." in name:
                return Taken(rows, _reverse_permutation(rows.shape[0], heads))
            if ".attn_k." in name:
                return Taken(rows, _reverse_permutation(rows.shape[0], kv))
        return rows

    def tensor(self, hf_name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole parameter, as transformers' GGUF reader gives it (the processor's changes
        of large tensors are ``rows``' index arithmetic; it runs itself on 1-D ones)."""
        names = self.gguf_names[hf_name]
        info = self.layout.tensors[names[0]]
        if len(names) == 1 and len(info.shape) == 1:
            values = GGUFRows(self.file, info).read(np.arange(1)).numpy().reshape(info.shape)
            return torch.from_numpy(np.ascontiguousarray(self._process(values, info.name))
                                    ).to(dtype)
        return dense(self.rows(hf_name), dtype)
