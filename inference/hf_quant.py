"""Weight-only int8 for models the fast runner does not know: transformers' own modules with
each ``nn.Linear`` replaced by ``Int8Linear``, which runs chatui's int8 kernel (``quant``).

The fast runner (``fast_llama``) is faster still, because it also removes transformers' Python
per layer; this is what ``--quantize int8`` does for every other architecture, instead of
refusing. The checkpoint's model is left as it was: the quantized model is a copy that shares
every other tensor with it (embeddings, norms, experts stored as 3-D tensors stay as they are).
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
from torch import nn

from .quant import Int8Weight, Q8Weight, int8_linear, q8_available, q8_linear


class Int8Linear(nn.Module):
    """``nn.Linear``'s forward over an int8 weight: chatui's group-wise ``Q8Weight`` kernel on
    a CPU where it builds (any float input, computed in fp32), else per-channel ``Int8Weight``
    (torch's CPU kernel with bf16 activations, or dequantized on the fly elsewhere). The output
    has the input's dtype, as the Linear's had."""

    def __init__(self, weight: Q8Weight | Int8Weight, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.q8 = isinstance(weight, Q8Weight)
        if isinstance(weight, Q8Weight):
            self.out_features, self.in_features = weight.shape
            self.register_buffer("packed", weight.packed)
            self.register_buffer("scales", weight.scales)
        else:
            self.out_features, self.in_features = weight.q.shape
            self.register_buffer("packed", weight.q)
            self.register_buffer("scales", weight.scales)
        self.register_buffer("bias", bias)

    @property
    def weight_int8(self) -> Q8Weight | Int8Weight:
        if self.q8:
            return Q8Weight(self.packed, self.scales, self.out_features, self.in_features)
        return Int8Weight(self.packed, self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight_int8
        out = q8_linear(x, w) if isinstance(w, Q8Weight) else int8_linear(x, w)
        out = out.to(x.dtype)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        kind = "int8 groups of 32" if self.q8 else "int8 per channel"
        return f"in_features={self.in_features}, out_features={self.out_features}, {kind}"


def _shared_copy(model: nn.Module) -> nn.Module:
    """A copy of the module tree that shares every parameter and buffer with ``model``."""
    memo = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


def quantize_linears(model: nn.Module, stored: dict[str, Any] | None = None
                     ) -> tuple[nn.Module, dict[str, Q8Weight | Int8Weight]]:
    """A copy of ``model`` whose ``nn.Linear`` layers are ``Int8Linear``, and the int8 weights
    by module name (for the disk cache; ``stored`` is a previous such dict, used where its
    weights have the right shape, so a cached start does not quantize again)."""
    device = next(model.parameters()).device
    q8 = q8_available(device)
    # torch's per-channel CPU kernel wants bf16 activations; elsewhere the model's dtype
    scale_dtype = torch.bfloat16 if device.type == "cpu" else next(model.parameters()).dtype
    out = _shared_copy(model)
    stored = stored or {}
    weights: dict[str, Q8Weight | Int8Weight] = {}
    for name, module in list(out.named_modules()):
        if type(module) is not nn.Linear:
            continue
        shape = tuple(module.weight.shape)
        w = stored.get(name)
        if q8:
            if not isinstance(w, Q8Weight) or w.shape != shape:
                w = Q8Weight.quantize(module.weight)
        else:
            if not isinstance(w, Int8Weight) or tuple(w.q.shape) != shape:
                w = Int8Weight.quantize(module.weight, scale_dtype)
            w = Int8Weight(w.q.to(device), w.scales.to(device, scale_dtype))
        weights[name] = w
        bias = None if module.bias is None else module.bias.detach()
        parent_name, _, child = name.rpartition(".")
        parent = out.get_submodule(parent_name) if parent_name else out
        setattr(parent, child, Int8Linear(w, bias))
    return out, weights
