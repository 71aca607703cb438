"""Loading a resolved, checked checkpoint: tokenizer and model through transformers, the chat
template, every end-of-turn id, the pad token and the context limit."""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..backend import ProgressCallback
from ..chat import GENERIC_CHAT_TEMPLATE  # ChatML, installed on tokenizers without a template
from .device import DeviceChoice, resolve_device
from . import lazy_model
from .errors import CheckpointError, reason, report
from .gguf_tensors import GGUFWeights, lazy_supported, read_layout
from .memory import fits_sentence
from .st_tensors import NotPlain, SafetensorsWeights
from .safety import (check_model_type, check_safetensors, gguf_weights_hash, read_config,
                     weight_files, weights_hash)
from .spec import resolve_spec

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_CONTEXT_LIMIT = 2048

END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|END_OF_TURN_TOKEN|>",
    "<|end_of_turn|>", "<|endofturn|>", "<|return|>", "</s>", "<|endoftext|>",
)
"""Spellings of end-of-turn tokens; one counts as EOS when the chat template writes it and the
tokenizer has it as a special token."""

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                 "n_ctx", "max_seq_len", "model_max_length")


@dataclass
class LoadedCheckpoint:
    """A model and tokenizer ready for inference, with what the engine needs to know."""

    model: PreTrainedModel
    """In eval mode, gradients off, on ``device`` in ``dtype``."""
    tokenizer: PreTrainedTokenizerBase
    """Has a chat template (maybe the generic one) and a pad token."""
    generation_config: GenerationConfig | None
    eos_token_ids: tuple[int, ...]
    """Every EOS / end-of-turn id the checkpoint declares, first the main one."""
    name: str
    """Short human name: directory name, GGUF stem or hub repo id."""
    path: str
    """Resolved path of what the user named (the GGUF file, the directory, the snapshot)."""
    weights_hash: str
    """sha256 (16 hex chars) over the weight files' names and contents and the shard index
    (``safety.weights_hash``); it keys the int8/int4 weights cached on disk."""
    chat_template_warning: str
    """"" or a sentence saying a generic chat template was installed."""
    device: torch.device
    dtype: torch.dtype
    context_limit: int
    """Most tokens the model was trained to attend over (``max_position_embeddings``)."""
    load_dir: str = ""
    """The directory the weights were actually loaded from (the cache entry for a GGUF)."""


def load_checkpoint(spec: str | None, *, device: str | None = None, dtype: str | None = None,
                    device_map: str | None = None, trust_remote_code: bool = False,
                    allow_pickle: bool = False, lazy: bool = False,
                    progress: ProgressCallback | None = None) -> LoadedCheckpoint:
    """Load a checkpoint for chat.

    Args:
        spec: None for the default model, a ``.gguf`` file, a checkpoint directory or a model
            name in the local Hugging Face cache.
        device: ``cpu``, ``cuda``, ``cuda:1``, ``mps``; None picks CUDA when available.
        dtype: ``float32``/``bfloat16``/``float16`` (or short forms) or ``auto``.
        device_map: passed to ``from_pretrained`` (``"auto"`` spreads over GPUs; needs
            accelerate); the model then stays where it was placed.
        trust_remote_code: allow checkpoints that ship their own Python code.
        allow_pickle: allow ``pytorch_model.bin`` weights (pickle can run code).
        lazy: on the CPU, leave the large weights of a GGUF file or safetensors checkpoint in
            the file (``lazy_model``): the fast runner quantizes them from there a block of rows
            at a time, anything else loads them first (``lazy_model.materialize``). Otherwise
            the model is loaded whole in ``dtype``.
        progress: called with :class:`Progress` as loading goes on.

    Raises:
        CheckpointError: with one sentence for anything the user can fix.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    choice = resolve_device(device, dtype)
    resolved = resolve_spec(spec, progress)
    directory = resolved.load_dir
    stage = "Loading checkpoint"
    report(progress, stage, 0, 3)

    config = read_config(directory)
    gguf = resolved.gguf
    files, is_pickle = ([gguf], False) if gguf is not None else weight_files(directory,
                                                                             allow_pickle)
    if gguf is None and not is_pickle:
        for f in files:
            check_safetensors(f)
    check_model_type(config, directory, trust_remote_code)
    whash = gguf_weights_hash(gguf) if gguf is not None else weights_hash(directory, files)

    tokenizer = _load_tokenizer(directory, trust_remote_code)
    report(progress, stage, 1, 3)
    _check_vocab(tokenizer, config.get("vocab_size"), directory)

    from_file = device_map is None and choice.device.type == "cpu" and not is_pickle
    if gguf is not None and from_file and _gguf_readable(gguf):
        model = _from_source(directory, choice, trust_remote_code, lazy,
                             lambda m: GGUFWeights(gguf, m))
    elif gguf is not None:
        if choice.device.type == "cpu":
            _check_fits((i.shape for i in read_layout(gguf).tensors.values()), choice.dtype)
        model = _load_model(gguf.parent, choice, device_map=device_map,
                            trust_remote_code=trust_remote_code, is_pickle=False,
                            gguf_file=gguf.name)
    else:
        model = None
        if lazy and from_file:
            try:
                model = _from_source(directory, choice, trust_remote_code, lazy,
                                     lambda m: SafetensorsWeights(files, m))
            except NotPlain:  # names or shapes transformers converts on load: its loader
                model = None
        if model is None:
            if not is_pickle and choice.device.type == "cpu":
                _check_fits(_safetensors_shapes(files), choice.dtype)
            model = _load_model(directory, choice, device_map=device_map,
                                trust_remote_code=trust_remote_code, is_pickle=is_pickle)
    report(progress, stage, 2, 3)
    embeddings = model.get_input_embeddings()
    rows = getattr(getattr(embeddings, "weight", None), "shape", (None,))[0]
    _check_vocab(tokenizer, rows, directory)

    warning = ""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = GENERIC_CHAT_TEMPLATE
        warning = ("This checkpoint has no chat template, so a generic ChatML-style one is used "
                   "and replies may be poor.")
    generation_config = getattr(model, "generation_config", None)
    eos_ids = collect_eos_token_ids(model.config, generation_config, tokenizer)
    _ensure_pad_token(tokenizer, eos_ids)

    device_actual = choice.device if device_map is None else _first_param_device(model)
    report(progress, stage, 3, 3)
    return LoadedCheckpoint(
        model=model, tokenizer=tokenizer, generation_config=generation_config,
        eos_token_ids=eos_ids, name=resolved.name, path=str(resolved.path),
        weights_hash=whash, chat_template_warning=warning, device=device_actual,
        dtype=choice.dtype, context_limit=context_limit_of(model.config),
        load_dir=str(directory))


def _load_tokenizer(directory: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    names = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json",
             "spiece.model", "vocab.txt")
    if not any((directory / n).is_file() for n in names):
        raise CheckpointError(
            f"{directory} has no tokenizer (no tokenizer.json or tokenizer.model); copy the "
            "tokenizer files next to config.json.")
    try:
        return AutoTokenizer.from_pretrained(
            str(directory), local_files_only=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - reported as one sentence
        raise CheckpointError(
            f"Cannot load the tokenizer in {directory} ({reason(exc)}).") from exc


def _gguf_readable(gguf: Path) -> bool:
    """Whether chatui reads this GGUF's tensors itself (else transformers dequantizes it)."""
    return lazy_supported(read_layout(gguf).architecture)


def _from_source(directory: Path, choice: DeviceChoice, trust_remote_code: bool, lazy: bool,
                 source: Any) -> PreTrainedModel:
    """The model built from its config with weights read from ``source(model)``: the large
    ones left in the file when ``lazy``, else loaded one tensor at a time (when they fit)."""
    model = lazy_model.build(directory, source, choice.dtype, trust_remote_code=trust_remote_code)
    if lazy:
        return model
    _check_fits((tuple(p.shape) for p in model.parameters() if p.is_meta), choice.dtype)
    return lazy_model.materialize(model)


def _check_fits(shapes: Any, dtype: torch.dtype) -> None:
    """Refuse weights of these shapes in ``dtype`` that do not fit in memory (one sentence)."""
    need = sum(math.prod(s) for s in shapes) * torch.empty((), dtype=dtype).element_size()
    sentence = fits_sentence(need, f"its {str(dtype).replace('torch.', '')} weights")
    if sentence:
        raise CheckpointError(sentence)


def _safetensors_shapes(files: list[Path]) -> list[tuple[int, ...]]:
    """The shapes of every tensor in these safetensors files (from their headers)."""
    shapes = []
    for f in files:
        with f.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        shapes += [tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"]
    return shapes


def _load_model(directory: Path, choice: DeviceChoice, *, device_map: str | None,
                trust_remote_code: bool, is_pickle: bool,
                gguf_file: str | None = None) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = dict(dtype=choice.dtype, local_files_only=True,
                                  trust_remote_code=trust_remote_code,
                                  use_safetensors=not is_pickle)
    if gguf_file is not None:
        kwargs = dict(dtype=choice.dtype, gguf_file=gguf_file)
    if device_map is not None:
        kwargs["device_map"] = device_map
    elif choice.device.type != "cpu":
        kwargs["device_map"] = str(choice.device)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(directory), **kwargs)
    except CheckpointError:
        raise
    except ImportError as exc:
        raise CheckpointError(
            f"Loading {directory} needs a missing package ({reason(exc)}).") from exc
    except torch.cuda.OutOfMemoryError as exc:
        raise CheckpointError(
            f"The model does not fit in {choice.device} memory; try --dtype bfloat16, "
            "--device cpu or --device-map auto.") from exc
    except Exception as exc:  # noqa: BLE001 - reported as one sentence
        raise CheckpointError(
            f"Cannot load the model weights in {directory} ({reason(exc)}).") from exc
    model.eval()
    model.requires_grad_(False)
    return model


def _check_vocab(tokenizer: Any, model_vocab: Any, directory: Path) -> None:
    if not isinstance(model_vocab, int) or model_vocab <= 0:
        return
    size = len(tokenizer)
    if size > model_vocab:
        raise CheckpointError(
            f"The tokenizer in {directory} has {size} tokens but the model only has {model_vocab} "
            "embedding rows, so they do not belong together; use the tokenizer the model was "
            "trained with.")


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, (list, tuple)):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def collect_eos_token_ids(config: Any, generation_config: Any, tokenizer: Any) -> tuple[int, ...]:
    """Every EOS / end-of-turn id: generation config, model config (and its text config),
    the tokenizer's EOS, and end-of-turn tokens the chat template writes, in that order."""
    found: list[int] = []
    found += _ids(getattr(generation_config, "eos_token_id", None))
    found += _ids(getattr(config, "eos_token_id", None))
    text_config = getattr(config, "text_config", None)
    if text_config is not None:
        found += _ids(getattr(text_config, "eos_token_id", None))
    found += _ids(getattr(tokenizer, "eos_token_id", None))
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = "\n".join(str(v) for v in template.values())
    special = set(getattr(tokenizer, "all_special_tokens", []) or [])
    added = {str(t) for t in (getattr(tokenizer, "added_tokens_decoder", {}) or {}).values()
             if getattr(t, "special", True)}
    vocab_size = len(tokenizer)
    for token in END_OF_TURN_TOKENS:
        if token in template and (token in special or token in added):
            token_id = tokenizer.convert_tokens_to_ids(token)
            if isinstance(token_id, int) and token_id != getattr(tokenizer, "unk_token_id", None):
                found.append(token_id)
    result: list[int] = []
    for i in found:
        if 0 <= i < max(vocab_size, 1) and i not in result:
            result.append(i)
    return tuple(result)


def _ensure_pad_token(tokenizer: Any, eos_ids: tuple[int, ...]) -> None:
    if getattr(tokenizer, "pad_token_id", None) is not None:
        return
    if getattr(tokenizer, "eos_token", None) is not None:
        tokenizer.pad_token = tokenizer.eos_token
    elif eos_ids:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos_ids[0])


def context_limit_of(config: Any) -> int:
    """``max_position_embeddings`` (or a similar field) of the config, else 2048."""
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is None:
            continue
        for key in _CONTEXT_KEYS:
            value = getattr(cfg, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10**8:
                return value
    return DEFAULT_CONTEXT_LIMIT


def _first_param_device(model: Any) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")
