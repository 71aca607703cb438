"""Which device and dtype a model runs in: ``--device`` / ``--dtype`` checked against this
machine, without loading anything."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import CheckpointError


@dataclass(frozen=True)
class DeviceChoice:
    """Where the model runs and in which precision, chosen once and passed down."""

    device: torch.device
    dtype: torch.dtype


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
