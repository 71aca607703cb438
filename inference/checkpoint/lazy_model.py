"""A transformers model whose large weights stay in the checkpoint file until something needs
them in full precision.

``build`` makes the model from its config with every parameter on the meta device
(``accelerate.init_empty_weights``: no memory), then loads the small ones (norms, biases,
routers: a few MB) and leaves the large ones (embeddings, output layer, attention and MLP
projections, stacked experts: ``LAZY``) as meta tensors. The source of the weights
(``GGUFWeights`` or ``SafetensorsWeights``: ``rows(name)``, ``tensor(name)``) rides on the model
as ``chatui_weights``, so the fast runner quantizes each large weight from its rows
(``weight_rows``) without ever holding the model in fp32, and whatever needs the model's own
modules (transformers' runner, no quantization) calls ``materialize`` first, which loads the
rest one tensor at a time.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

import torch

from ..weight_rows import Rows
from .errors import CheckpointError, reason

LAZY = re.compile(r"(^|\.)(embed_tokens|lm_head|q_proj|k_proj|v_proj|o_proj|qkv_proj|gate_proj"
                  r"|up_proj|down_proj|gate_up_proj)\.weight$|\.experts\.(gate_up_proj|down_proj)$")
"""Parameters left in the file: the ones the fast runner quantizes."""

SOURCE_ATTR = "chatui_weights"


class WeightSource(Protocol):
    """Where a lazy model's weights are read from."""

    def rows(self, name: str) -> Rows: ...

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor: ...


def _groups(model: Any) -> list[tuple[list[str], torch.nn.Parameter]]:
    """Each parameter once, with every name it has (a tied embedding has two)."""
    by_id: dict[int, tuple[list[str], torch.nn.Parameter]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), ([], p))[0].append(name)
    return list(by_id.values())


def _set(model: Any, names: list[str], value: torch.Tensor) -> None:
    param = torch.nn.Parameter(value, requires_grad=False)
    for name in names:
        owner, _, attr = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, attr, param)


def build(directory: Path, source_of: Any, dtype: torch.dtype, *,
          trust_remote_code: bool = False) -> Any:
    """The model of ``directory``'s config with its small parameters loaded from the source
    ``source_of(model)`` makes, and its large ones (``LAZY``) left to it.

    Raises:
        CheckpointError: the model cannot be built, or the source does not fit it.
    """
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    try:
        config = AutoConfig.from_pretrained(str(directory), local_files_only=True,
                                            trust_remote_code=trust_remote_code)
        with init_empty_weights():
            model = AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                     trust_remote_code=trust_remote_code)
        model.tie_weights()  # not done on meta parameters: a tied output layer is the embedding
    except Exception as exc:  # noqa: BLE001 - reported as one sentence
        raise CheckpointError(
            f"Cannot build the model of {directory} ({reason(exc)}).") from exc
    source = source_of(model)
    for names, p in _groups(model):
        if not (p.is_meta and p.dim() >= 2 and any(LAZY.search(n) for n in names)):
            _set(model, names, source.tensor(names[0], dtype))
    if (directory / "generation_config.json").is_file():
        try:
            model.generation_config = GenerationConfig.from_pretrained(str(directory))
        except Exception:  # noqa: BLE001 - as transformers does: keep the config's defaults
            pass
    model.eval()
    model.requires_grad_(False)
    setattr(model, SOURCE_ATTR, source)
    return model


def lazy_names(model: Any) -> list[str]:
    """Names of the parameters still in the checkpoint file (one name per tensor)."""
    return [n for n, p in model.named_parameters() if p.is_meta]


def source_of(model: Any) -> WeightSource | None:
    return getattr(model, SOURCE_ATTR, None)


def materialize(model: Any) -> Any:
    """Load every parameter still in the file, one tensor at a time, in the model's dtype
    (the model then runs as transformers' own; idempotent)."""
    source = source_of(model)
    groups = [(names, p) for names, p in _groups(model) if p.is_meta]
    if groups and source is None:
        raise CheckpointError("The model's weights are not loaded and nothing says where "
                              "they are; load the checkpoint again.")
    for names, p in groups:
        _set(model, names, source.tensor(names[0], p.dtype))  # type: ignore[union-attr]
    return model


def is_lazy(model: Any) -> bool:
    return any(p.is_meta for p in model.parameters())
