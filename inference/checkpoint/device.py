"""Which device and dtype a model runs in: ``--device`` / ``--dtype`` checked against this
machine, without loading anything.

torch is imported only where a device is resolved, so that the UI process can refuse a bad
``--dtype`` or ``--device cpu`` command line without paying for torch (about 1.3 s and 180 MB,
kept for the app's lifetime)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import CheckpointError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DeviceChoice:
    """Where the model runs and in which precision, chosen once and passed down."""

    device: torch.device
    dtype: torch.dtype


#: Every ``--dtype`` spelling, to the name of its torch dtype.
DTYPE_NAMES: dict[str, str] = {
    "float32": "float32", "fp32": "float32", "f32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
}


def check_dtype(dtype: str | None) -> None:
    """Refuse an unknown ``--dtype`` (no torch needed)."""
    if dtype is None or dtype.strip().lower() in ("", "auto"):
        return
    if dtype.strip().lower().removeprefix("torch.") not in DTYPE_NAMES:
        raise CheckpointError(
            f"Unknown dtype {dtype!r}; choose one of: auto, float32 (fp32), "
            f"bfloat16 (bf16), float16 (fp16).")


def _available_devices() -> list[str]:
    import torch

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
    import torch

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
    import torch

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
        check_dtype(dtype)
        dt = getattr(torch, DTYPE_NAMES[dtype.strip().lower().removeprefix("torch.")])
    return DeviceChoice(device=dev, dtype=dt)
