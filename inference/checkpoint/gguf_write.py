"""Writing GGUF files in the block types people download (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K):
a transformers model as llama.cpp's converter lays it out, or tensors made up on the fly.

chatui never needs this to chat: the tests write tiny models with it (to check that chatui
reads every block type as transformers' GGUF reader does) and ``benchmarks/make_checkpoints.py``
writes real-size random ones. The ``gguf`` package quantizes Q8_0/Q4_0/Q4_1 but not the
k-quants; ``quantize_blocks`` here writes valid Q4_K/Q5_K/Q6_K blocks with plain min/max
scales (llama.cpp searches for better ones; a reader only needs the layout to be right).

Tensors are written one at a time after the header (``GGUFWriter``'s streaming calls), a
block of rows at a time, so a multi-gigabyte file never has all its blocks in memory.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

QK_K = 256

ARCH_OF_MODEL_TYPE = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
                      "phi3": "phi3", "gemma2": "gemma2", "gemma3_text": "gemma3",
                      "qwen3_moe": "qwen3moe"}
"""GGUF architecture of each transformers model type this writer lays out (Mistral is a llama
whose ``general.name`` says mistral, as transformers' reader expects)."""

_CONFIG_TABLE = {"gemma3_text": "gemma3"}
"""transformers' GGUF config mapping table of a model type where the names differ."""


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(x.shape[0], 2)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins (the inverse of gguf's
    ``Q4_K.get_scale_min``)."""
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, :4] & 0x3F) | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = (m[:, :4] & 0x3F) | ((m[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return out


def _k_min_max(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Eight sub-blocks of 32 with a 6-bit scale and min each under fp16 super-scales:
    (d16, dmin16, sc, m, q) with x ~ d * sc * q - dmin * m."""
    n = blocks.shape[0]
    x = blocks.reshape(n, 8, 32)
    lo = np.minimum(x.min(-1), 0.0)
    scale, minv = (x.max(-1) - lo) / levels, -lo
    d16 = (scale.max(-1) / 63).astype(np.float16)
    dmin16 = (minv.max(-1) / 63).astype(np.float16)
    d, dmin = d16.astype(np.float32)[:, None], dmin16.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.round(scale / d), 0).clip(0, 63).astype(np.uint8)
        m = np.where(dmin > 0, np.round(minv / dmin), 0).clip(0, 63).astype(np.uint8)
        step = (d * sc)[..., None]
        q = np.where(step > 0, np.round((x + (dmin * m)[..., None]) / step), 0)
    return d16, dmin16, sc, m, q.clip(0, levels).astype(np.uint8)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d16, dmin16, sc, m, q = _k_min_max(blocks, 15)
    qs = q.reshape(n, 4, 2, 32)
    qs = (qs[:, :, 0] | (qs[:, :, 1] << 4)).reshape(n, 128)
    return np.concatenate([_f16_bytes(d16), _f16_bytes(dmin16), _pack_k_scales(sc, m), qs], 1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    d16, dmin16, sc, m, q = _k_min_max(blocks, 31)
    lo = (q & 0x0F).reshape(n, 4, 2, 32)
    qs = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(n, 128)
    hi = ((q >> 4) & 1).reshape(n, 8, 32).astype(np.uint8)
    qh = np.zeros((n, 32), dtype=np.uint8)
    for i in range(8):
        qh |= hi[:, i] << i
    return np.concatenate([_f16_bytes(d16), _f16_bytes(dmin16), _pack_k_scales(sc, m), qh, qs],
                          1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    n = blocks.shape[0]
    x = blocks.reshape(n, 16, 16)
    scale = np.abs(x).max(-1) / 31
    d16 = (scale.max(-1) / 127).astype(np.float16)
    d = d16.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d > 0, np.round(scale / d), 0).clip(-128, 127).astype(np.int8)
        step = (d * sc)[..., None]
        q = np.where(step > 0, np.round(x / step), 0)
    q = (q.clip(-32, 31) + 32).astype(np.uint8).reshape(n, 256)
    qv = q.reshape(n, 2, 2, 64)
    ql = ((qv[:, :, 0] & 0x0F) | ((qv[:, :, 1] & 0x0F) << 4)).reshape(n, 128)
    hi = ((q >> 4) & 3).reshape(n, 2, 4, 32)
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6))
    return np.concatenate([ql, qh.reshape(n, 64), sc.view(np.uint8), _f16_bytes(d16)], 1)


_K_QUANTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k}


def quantize(data: np.ndarray, qtype: str) -> np.ndarray:
    """``data`` [..., K] fp32 as GGUF blocks of ``qtype`` (uint8 [..., bytes per row]); K must
    be a multiple of the type's block size (``block_size``)."""
    from gguf import GGMLQuantizationType, quants

    kind = GGMLQuantizationType[qtype]
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype not in _K_QUANTS:
        return quants.quantize(data, kind)
    from gguf.constants import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[kind]
    if data.shape[-1] % block:
        raise ValueError(f"rows of {data.shape[-1]} cannot be split into {qtype} blocks")
    out = _K_QUANTS[qtype](data.reshape(-1, block))
    return out.reshape(*data.shape[:-1], data.shape[-1] // block * size)


def block_size(qtype: str) -> int:
    from gguf import GGMLQuantizationType
    from gguf.constants import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][0]


def _value_type(value: Any) -> Any:
    from gguf import GGUFValueType

    if isinstance(value, bool):
        return GGUFValueType.BOOL
    if isinstance(value, int):
        return GGUFValueType.UINT32
    if isinstance(value, float):
        return GGUFValueType.FLOAT32
    if isinstance(value, str):
        return GGUFValueType.STRING
    raise TypeError(f"no GGUF type for {value!r}")


TokenizerField = tuple[str, Any, Any, Any]
"""A ``tokenizer.*`` field as (key, value, type, array sub-type)."""


def tokenizer_fields(gguf_path: Path, vocab: int | None = None) -> list[TokenizerField]:
    """Every ``tokenizer.*`` field of a GGUF file as (key, value, type, array sub-type), to give
    a written model an existing model's tokenizer; with ``vocab``, its first ``vocab`` tokens
    only (``truncate_tokenizer``). The file is parsed once per process while it is unchanged:
    ``GGUFReader`` took 2.5 s on the default model's 49,152-token header, once per model a
    test wrote."""
    st = Path(gguf_path).stat()
    fields = [(key, list(value) if isinstance(value, tuple) else value, main, sub)
              for key, value, main, sub in _read_tokenizer_fields(str(gguf_path),
                                                                   st.st_mtime_ns, st.st_size)]
    return fields if vocab is None else truncate_tokenizer(fields, vocab)


@functools.lru_cache(maxsize=4)
def _read_tokenizer_fields(path: str, mtime_ns: int, size: int) -> tuple[TokenizerField, ...]:
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            main = field.types[0]
            sub = field.types[-1] if main == GGUFValueType.ARRAY else None
            value = field.contents()
            fields.append((key, tuple(value) if isinstance(value, list) else value, main, sub))
    return tuple(fields)


def truncate_tokenizer(fields: list[TokenizerField], vocab: int) -> list[TokenizerField]:
    """A BPE tokenizer's fields cut to its first ``vocab`` tokens: the merges kept are those
    whose two parts and result are all among them (a byte-level vocabulary keeps every byte, so
    any text still encodes). A tiny test model with the default model's whole vocabulary spent
    most of its GGUF round trip in readers parsing 98,000 strings of header. Raises ValueError
    when a special token's id is not below ``vocab``."""
    values = {key: value for key, value, _, _ in fields}
    kept = set(values["tokenizer.ggml.tokens"][:vocab])
    out = []
    for key, value, main, sub in fields:
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
            value = value[:vocab]
        elif key == "tokenizer.ggml.merges":
            value = [m for m in value
                     if (parts := m.split(" ", 1))[0] in kept and len(parts) == 2
                     and parts[1] in kept and parts[0] + parts[1] in kept]
        elif key.endswith("_token_id") and int(value) >= vocab:
            raise ValueError(f"{key} is {value}, not below the {vocab} tokens kept")
        out.append((key, value, main, sub))
    return out


RowMaker = Callable[[int, int], np.ndarray]
"""A tensor's values by rows: ``rows(r0, r1)`` is fp32 [r1 - r0, ..., K] (first dimension)."""


class _Chunked:
    """A tensor ``GGUFWriter.write_tensor_data`` writes by ``tofile``: made, quantized and
    written ``CHUNK_ROWS`` rows at a time (a real-size output layer never whole in fp32)."""

    CHUNK_ROWS = 4096

    def __init__(self, shape: tuple[int, ...], qtype: str, rows: RowMaker, nbytes: int):
        self.shape, self.qtype, self.rows, self.nbytes = shape, qtype, rows, nbytes

    def tofile(self, fout: Any) -> None:
        for r0 in range(0, self.shape[0], self.CHUNK_ROWS):
            r1 = min(r0 + self.CHUNK_ROWS, self.shape[0])
            values = np.asarray(self.rows(r0, r1), dtype=np.float32)
            if self.qtype == "F32":
                data = values
            elif self.qtype == "F16":
                data = values.astype(np.float16)
            else:
                data = quantize(values, self.qtype)
            np.ascontiguousarray(data).tofile(fout)


def write_gguf(path: Path, arch: str, metadata: dict[str, Any],
               tokenizer: list[tuple[str, Any, Any, Any]],
               tensors: Iterable[tuple[str, tuple[int, ...], str, RowMaker]]) -> Path:
    """Write a GGUF file: ``metadata`` (key -> int, float, bool or str), the tokenizer fields
    and ``tensors`` as (name, numpy-order shape, block type, ``RowMaker``); each tensor is made,
    quantized and written a block of rows at a time."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quant_shape_to_byte_shape

    writer = GGUFWriter(str(path), arch)
    for key, value in metadata.items():
        writer.add_key_value(key, value, _value_type(value))
    for key, value, main, sub in tokenizer:
        writer.add_key_value(key, value, main, sub_type=sub)
    plan = []
    for name, shape, qtype, rows in tensors:
        kind = GGMLQuantizationType[qtype]
        if qtype in ("F32", "F16"):
            dtype = np.dtype(np.float32 if qtype == "F32" else np.float16)
            nbytes = int(np.prod(shape)) * dtype.itemsize
            writer.add_tensor_info(name, shape, dtype, nbytes)
        else:
            byte_shape = quant_shape_to_byte_shape(shape, kind)
            nbytes = int(np.prod(byte_shape))
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=kind)
        plan.append(_Chunked(shape, qtype, rows, nbytes))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for chunked in plan:
        writer.write_tensor_data(chunked)  # type: ignore[arg-type]
    writer.close()
    return path


def config_metadata(config: Any, arch: str) -> dict[str, Any]:
    """The config as the GGUF keys transformers' reader maps back onto it."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    table = GGUF_CONFIG_MAPPING[_CONFIG_TABLE.get(config.model_type, config.model_type)]
    out: dict[str, Any] = {"general.name": config.model_type}
    for key, hf_key in table.items():
        value = getattr(config, hf_key, None) if hf_key else None
        if value is None or isinstance(value, (list, dict)):
            continue
        out[f"{arch}.{key}"] = float(value) if isinstance(value, float) else value
    if "rope_theta" in table.values() and f"{arch}.rope.freq_base" not in out:
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
        if theta is not None:
            out[f"{arch}.rope.freq_base"] = float(theta)
    return out


def _llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order (pairs of RoPE dimensions interleaved)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def model_tensors(model: Any, qtype: str | Callable[[str, tuple[int, ...]], str]
                  ) -> Iterator[tuple[str, tuple[int, ...], str, RowMaker]]:
    """A transformers model's tensors under their GGUF names, laid out as llama.cpp's converter
    writes them (llama q/k rows permuted, Gemma norms stored as 1 + weight, MoE experts as
    stacked gate/up/down tensors), each in ``qtype`` (a type, or a function of the GGUF name and
    shape) where its rows split into that type's blocks, else F32."""
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          get_gguf_hf_weights_map)

    cfg = model.config
    arch = ARCH_OF_MODEL_TYPE[cfg.model_type]
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=cfg.to_dict())
    gguf_of: dict[str, list[str]] = {}
    for gguf_name, hf_name in get_gguf_hf_weights_map(model, processor).items():
        if not gguf_name.endswith((".weight", ".bias")):  # stacked experts: as llama.cpp names
            gguf_name += ".weight"
        gguf_of.setdefault(hf_name, []).append(gguf_name)
    state = model.state_dict()
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    for hf_name, tensor in state.items():
        if tied and hf_name == "lm_head.weight":
            continue
        names = sorted(gguf_of.get(hf_name, []))
        if not names:
            raise ValueError(f"no GGUF name for {hf_name}")
        w = tensor.detach().float().numpy()
        parts: list[tuple[str, np.ndarray]]
        if len(names) == 2:  # an MoE gate_up_proj: ffn_gate_exps, then ffn_up_exps
            gate, up = np.split(w, 2, axis=1)
            parts = [(n, gate if "gate_exps" in n else up) for n in names]
        else:
            parts = [(names[0], w)]
        for name, values in parts:
            if arch == "llama" and ".attn_q." in name:
                values = _llama_permute(values, cfg.num_attention_heads)
            elif arch == "llama" and ".attn_k." in name:
                values = _llama_permute(values, cfg.num_key_value_heads)
            if arch.startswith("gemma") and name.endswith("norm.weight"):
                values = values + 1
            shape = tuple(values.shape)
            kind = qtype(name, shape) if callable(qtype) else qtype
            if len(shape) < 2 or shape[-1] % block_size(kind):
                kind = "F32"
            yield name, shape, kind, (lambda r0, r1, v=values: v[r0:r1])


def write_model(model: Any, path: Path, qtype: str | Callable[[str, tuple[int, ...]], str],
                tokenizer_from: Path, vocab: int | None = None) -> Path:
    """A transformers model (of ``ARCH_OF_MODEL_TYPE``) as a GGUF file with the tokenizer of
    the GGUF file ``tokenizer_from`` (its first ``vocab`` tokens only, when given)."""
    cfg = model.config
    arch = ARCH_OF_MODEL_TYPE[cfg.model_type]
    meta = config_metadata(cfg, arch)
    if cfg.model_type == "mistral":
        meta["general.name"] = "mistral"
    return write_gguf(path, arch, meta, tokenizer_fields(tokenizer_from, vocab),
                      model_tensors(model, qtype))
