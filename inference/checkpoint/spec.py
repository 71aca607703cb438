"""What the user typed after ``--ckpt`` resolved to a directory to load from: the default
model, a ``.gguf`` file, a checkpoint directory (or a file in one), or a model name in the local
Hugging Face cache (never fetched from the network)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..backend import ProgressCallback
from ..paths import hf_hub_cache
from .errors import CheckpointError
from .gguf import default_gguf_path, gguf_cache_dir
from .safety import PICKLE_SUFFIXES

_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")


@dataclass(frozen=True)
class Resolved:
    """Where to load from (``load_dir``), what the user named (``path``) and its short name;
    ``gguf`` is the GGUF file whose tensors are the weights (``load_dir`` then holds its config
    and tokenizer)."""

    load_dir: Path
    path: Path
    name: str
    gguf: Path | None = None


def resolve_spec(spec: str | None, progress: ProgressCallback | None, *,
                 convert: bool = True) -> Resolved:
    """Resolve ``spec`` (see the package's docstring); with ``convert=False`` a GGUF file is
    only found, not converted (its ``load_dir`` is then the file itself), so the whole
    resolution is a few file system lookups.

    Raises:
        CheckpointError: the spec names nothing loadable, in one sentence.
    """
    if spec is None or not spec.strip():
        gguf = default_gguf_path()
        load_dir = gguf_cache_dir(gguf, progress) if convert else gguf
        return Resolved(load_dir, gguf, gguf.stem, gguf)
    text = spec.strip()
    path = Path(os.path.expandvars(text)).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_file():
            if path.suffix.lower() == ".gguf":
                return _from_gguf(path, progress, convert)
            if (path.parent / "config.json").is_file():
                return Resolved(path.parent, path.parent, path.parent.name)
            raise CheckpointError(
                f"{path} is a file, not a checkpoint; pass a directory that holds config.json "
                "or a .gguf file.")
        return _from_directory(path, progress, convert)
    if _looks_like_path(text):
        raise CheckpointError(f"No such file or directory: {text}.")
    if _REPO_ID.match(text):
        return _from_hub_cache(text)
    raise CheckpointError(
        f"{text!r} is neither an existing path nor a Hugging Face model name (org/name).")


def _looks_like_path(text: str) -> bool:
    if text.startswith((".", "/", "~", "\\")) or text.lower().endswith(
            (".gguf", ".safetensors", ".json") + PICKLE_SUFFIXES):
        return True
    if os.sep in text.replace("/", "") or text.count("/") > 1:
        return True
    return bool(re.match(r"^[A-Za-z]:[\\/]", text))


def _from_gguf(path: Path, progress: ProgressCallback | None, convert: bool) -> Resolved:
    load_dir = gguf_cache_dir(path, progress) if convert else path
    return Resolved(load_dir, path, path.stem, path)


def _from_directory(path: Path, progress: ProgressCallback | None, convert: bool) -> Resolved:
    if (path / "config.json").is_file():
        name = path.name
        if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
            name = path.parent.parent.name.removeprefix("models--").replace("--", "/")
        return Resolved(path, path, name)
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _from_gguf(ggufs[0], progress, convert)
    if len(ggufs) > 1:
        names = ", ".join(g.name for g in ggufs[:5])
        raise CheckpointError(
            f"{path} holds several GGUF files ({names}); pass the one to load.")
    if path.name.startswith("models--") and (path / "snapshots").is_dir():
        return _snapshot_of(path, path.name.removeprefix("models--").replace("--", "/"), None)
    raise CheckpointError(
        f"{path} is not a Hugging Face checkpoint because it has no config.json; pass a "
        "directory with config.json and weights, a .gguf file, or a model name.")


def _from_hub_cache(spec: str) -> Resolved:
    repo_id, _, revision = spec.partition("@")
    cache = hf_hub_cache()
    repo_dir = cache / ("models--" + repo_id.replace("/", "--"))
    if not repo_dir.is_dir():
        raise CheckpointError(
            f"{repo_id!r} is not a local path and is not in the Hugging Face cache at {cache}; "
            f"download it on a machine with internet (`hf download {repo_id}`) or pass a "
            "checkpoint directory.")
    return _snapshot_of(repo_dir, repo_id, revision or None)


def _snapshot_of(repo_dir: Path, repo_id: str, revision: str | None) -> Resolved:
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
    return Resolved(snap, snap, repo_id)
