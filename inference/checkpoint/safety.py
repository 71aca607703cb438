"""Checks of a checkpoint directory before transformers sees it: config, weight files (pickles
refused unless allowed), safetensors headers against file sizes, a model type transformers can
generate with; and the weights hash that keys caches derived from the weights (from the files'
contents: ``digest``)."""

from __future__ import annotations

import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any, Iterable

from .digest import file_digest
from .errors import CheckpointError, reason

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({reason(exc)}).") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not valid JSON for a model config (not an object).")
    return data


def weight_files(directory: Path, allow_pickle: bool) -> tuple[list[Path], bool]:
    """The weight files to load and whether they are pickles; raises when there are none."""
    safetensors = sorted(directory.glob("*.safetensors"))
    index_path = directory / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            shards = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"{index_path} is not a valid shard index ({reason(exc)}).") from exc
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(
                f"The checkpoint in {directory} is incomplete: its shard index lists "
                f"{missing[0]}, which is missing ({len(missing)} of {len(shards)} shards absent).")
        return [directory / s for s in shards], False
    if safetensors:
        return safetensors, False
    pickles = sorted(p for p in directory.iterdir()
                     if p.is_file() and p.suffix.lower() in PICKLE_SUFFIXES
                     and p.name != "training_args.bin")
    if not pickles:
        raise CheckpointError(
            f"{directory} has a config.json but no weights (no *.safetensors file); copy the "
            "weight files next to it.")
    if not allow_pickle:
        raise CheckpointError(
            f"{directory} only has pickle weights ({pickles[0].name}), which can run arbitrary "
            "code when loaded; pass --allow-pickle if you trust this checkpoint, or convert it "
            "to safetensors.")
    loadable = [p for p in pickles if re.fullmatch(r"pytorch_model(-\d+-of-\d+)?\.bin", p.name)]
    if not loadable:
        raise CheckpointError(
            f"{directory} has pickle weights named {pickles[0].name}, but only "
            "pytorch_model.bin (or its shards with pytorch_model.bin.index.json) can be loaded; "
            "rename or convert it.")
    return loadable, True


def check_safetensors(path: Path) -> None:
    """Read a safetensors header and check the file is as long as it says (cheap)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ValueError("the file is too short")
            (n,) = struct.unpack("<Q", head)
            if n <= 0 or n > min(size - 8, 100_000_000):
                raise ValueError("the header length is invalid")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        end = 0
        for key, info in header.items():
            if key == "__metadata__":
                continue
            start, stop = info["data_offsets"]
            if not 0 <= start <= stop:
                raise ValueError(f"tensor {key!r} has invalid offsets")
            end = max(end, stop)
        if 8 + n + end != size:
            raise ValueError(f"expected {8 + n + end} bytes, found {size}; it may be truncated")
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            f"The weights file {path} is corrupt or not a safetensors file ({reason(exc)}).") \
            from exc


def hash_entries(entries: Iterable[tuple[str, str]], extra: bytes = b"") -> str:
    """sha256 (16 hex chars) of sorted (file name, content digest) pairs and ``extra``."""
    h = hashlib.sha256()
    for name, digest in sorted(entries):
        h.update(f"{name}\0{digest}\n".encode())
    h.update(extra)
    return h.hexdigest()[:16]


def weights_hash(directory: Path, files: Iterable[Path]) -> str:
    """sha256 (16 hex chars) of the weight files' names and contents plus the shard index: two
    checkpoints of the same shape (a base model and its fine-tune) never share it."""
    extra = b""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            extra += index.read_bytes()
    return hash_entries(((f.name, file_digest(f)) for f in files), extra)


def gguf_weights_hash(gguf: Path) -> str:
    """The weights hash of a GGUF file (its name and contents)."""
    return hash_entries([(gguf.name, file_digest(gguf))], b"gguf")


def check_model_type(config: dict[str, Any], directory: Path, trust_remote_code: bool) -> None:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = config.get("model_type")
    if config.get("auto_map") and not trust_remote_code:
        raise CheckpointError(
            f"The checkpoint in {directory} needs its own Python code to load (auto_map in "
            "config.json); pass --trust-remote-code only if you trust its author.")
    if trust_remote_code and config.get("auto_map"):
        return
    if not model_type:
        raise CheckpointError(
            f"{directory / 'config.json'} has no model_type, so transformers cannot tell which "
            "architecture it is.")
    if model_type not in CONFIG_MAPPING_NAMES:
        if trust_remote_code:
            raise CheckpointError(
                f"Model type {model_type!r} is unknown to this transformers version and the "
                "checkpoint ships no custom code (no auto_map), so it cannot be loaded.")
        raise CheckpointError(
            f"Model type {model_type!r} is unknown to this transformers version and would need "
            "custom code; pass --trust-remote-code only if you trust the checkpoint's author.")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise CheckpointError(
            f"Model type {model_type!r} cannot generate text with chatui because transformers has "
            "no causal language model for it.")
