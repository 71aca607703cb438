"""Every directory chatui's engine caches things in, read from the environment at call time.

One root (``$CHATUI_CACHE_DIR`` or the platform's user cache directory) holds one folder per
kind of artifact, so a user clears one kind by deleting its folder and tests point the whole
cache elsewhere with one environment variable. The Hugging Face hub cache is not ours: it is
only read (models named by repo id), never written.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """chatui's cache directory (``$CHATUI_CACHE_DIR`` or the platform's user cache dir)."""
    override = os.environ.get("CHATUI_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("chatui"))


def models_dir() -> Path:
    """Checkpoints converted from GGUF files (one folder per file and conversion version)."""
    return cache_root() / "models"


def kernels_dir() -> Path:
    """chatui's compiled C kernels (one shared library per source, compiler and CPU)."""
    return cache_root() / "kernels"


def quantized_dir() -> Path:
    """int8 / int4 weights quantized once per checkpoint."""
    return cache_root() / "quantized"


def inductor_dir() -> Path:
    """Where torch inductor keeps the compiled decode step between runs."""
    return cache_root() / "inductor"


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache, read from the environment at call time."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"
