"""Model runners: one forward over a KV cache, whatever the model implementation.

The engine only needs: a new cache, a forward that returns the last position's logits, and
the cache operations crop / repeat / select. ``HFRunner`` drives any transformers causal LM
with a ``DynamicCache``.
"""

from __future__ import annotations

from typing import Any

import torch


class HFRunner:
    """A transformers causal LM with a dynamic KV cache."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @staticmethod
    def can_crop(cache: Any) -> bool:
        """Only full-attention layers can be cut back to a shorter prefix exactly."""
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", []))

    @torch.inference_mode()
    def forward(self, cache: Any, input_ids: torch.Tensor, *,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids: [B, T] -> logits of the last position [B, V] (the cache grows by T)."""
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            if position_ids.shape[-1] != input_ids.shape[-1]:
                position_ids = position_ids[:, -input_ids.shape[-1]:]
            kwargs["position_ids"] = position_ids
        out = self.model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                         logits_to_keep=1, **kwargs)
        return out.logits[:, -1, :]
