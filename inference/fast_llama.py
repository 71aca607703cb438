"""A compact Llama-family forward with a preallocated KV cache: the fast path of the engine.

transformers' modules cost more in Python per layer than the int8 matmuls they wrap on a small
CPU model, so ``FastLlama`` re-implements the decoder (RMSNorm, RoPE, grouped-query attention
through ``F.scaled_dot_product_attention``, SwiGLU) over weights taken from an already loaded
transformers model: fused QKV and gate/up projections, q/k rows permuted so RoPE is one complex
multiply, optional int8 weight-only linears (``inference.quant``). Any checkpoint whose modules
have the Llama shape (llama, mistral without a sliding window, qwen2) works without custom
code; ``unsupported_reason`` names why another one falls back to ``HFRunner``.

``FastRunner`` has ``HFRunner``'s interface over a ``kv_cache.StaticKVCache``. Which runner
a checkpoint gets (and in which precision) is ``runner.build_runner``'s policy, not this file's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .decode_graph import DecodeStep, use_compile
from .kernel_abi import Layer
from .kv_cache import StaticKVCache
from .q8kernel import F32_MAX_ROWS, load_kernel
from .quant import (Int4Weight, Int8Weight, Q8Weight, int4_linear, int8_linear, q8_available,
                    q8_linear)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

Weight = Any  # torch.Tensor [N, K], Int8Weight, Q8Weight or Int4Weight


def _linear(x: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(w, Q8Weight):
        out = q8_linear(x, w)
    elif isinstance(w, Int8Weight):
        out = int8_linear(x, w)
    elif isinstance(w, Int4Weight):
        out = int4_linear(x, w)
    elif (w.dtype is torch.float32 and x.dtype is torch.float32 and w.device.type == "cpu"
          and x.numel() <= F32_MAX_ROWS * x.shape[-1] and x.is_contiguous()
          and not torch.compiler.is_compiling() and (kernel := load_kernel()) is not None):
        out = kernel.f32_linear(x, w)  # decode: chatui's GEMV reads W about twice as fast
    else:
        out = F.linear(x.to(w.dtype), w)
    return out if b is None else out + b


def _norm_linear(x: torch.Tensor, norm: torch.Tensor, eps: float, w: Weight,
                 b: torch.Tensor | None = None) -> torch.Tensor:
    """``_linear(F.rms_norm(x, ..., norm, eps), w, b)``; one kernel call for int8 on the CPU."""
    if isinstance(w, Q8Weight) and x.dtype == torch.float32:
        out = q8_linear(x, w, norm=norm, eps=eps)
        return out if b is None else out + b
    return _linear(F.rms_norm(x, (x.shape[-1],), norm, eps), w, b)


def _swiglu_linear(gate_up: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """``_linear(F.silu(gate) * up, w, b)`` for gate_up = [gate | up]; one kernel call for int8
    on the CPU."""
    if isinstance(w, Q8Weight) and gate_up.dtype == torch.float32:
        out = q8_linear(gate_up, w, swiglu=True)
        return out if b is None else out + b
    gate, up = gate_up.chunk(2, dim=-1)
    return _linear(F.silu(gate) * up, w, b)


def unsupported_reason(model: Any) -> str | None:
    """None when ``FastLlama`` can run this transformers model exactly, else why not."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "no config"
    if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model type {getattr(cfg, 'model_type', None)!r} is not Llama-shaped"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type", "default")) in ("dynamic", "longrope"):
        return "position-dependent RoPE scaling"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention"
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "non-full attention layers"
    if len({p.device for p in model.parameters()}) != 1:
        return "model is sharded over several devices"
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or not hasattr(inner, "embed_tokens") or not hasattr(model, "lm_head"):
        return "unexpected module layout"
    for layer in layers:
        att, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if att is None or mlp is None or hasattr(att, "q_norm"):
            return "unexpected attention layout"
        if not all(hasattr(att, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
            return "unexpected attention layout"
        if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            return "unexpected MLP layout"
        if not (hasattr(layer, "input_layernorm") and hasattr(layer, "post_attention_layernorm")):
            return "unexpected norm layout"
    return None


def _rope_parameters(model: Any) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies recomputed in fp32 from the config, the way the model's own
    rotary module computes them (its buffer is rounded when a model is cast to bf16)."""
    rot = model.model.rotary_emb
    try:
        rope_type = getattr(rot, "rope_type", "default")
        if rope_type == "default":
            fn = type(rot).compute_default_rope_parameters
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            fn = ROPE_INIT_FUNCTIONS[rope_type]
        inv_freq, scale = fn(model.config)
        return inv_freq.float().cpu(), float(scale)
    except Exception:  # noqa: BLE001 - an unusual rotary module: trust its buffer
        return rot.inv_freq.detach().float().cpu(), float(getattr(rot, "attention_scaling", 1.0))


@dataclass
class _Layer:
    ln1: torch.Tensor  # [hidden]
    wqkv: Weight  # [(H + 2KV) * D, hidden]; q and k rows permuted to interleaved RoPE pairs
    bqkv: torch.Tensor | None
    wo: Weight  # [hidden, H * D]
    bo: torch.Tensor | None
    ln2: torch.Tensor
    wgu: Weight  # [2 * I, hidden]: gate rows, then up rows
    bgu: torch.Tensor | None
    wd: Weight  # [hidden, I]
    bd: torch.Tensor | None


def _interleave_rows(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Reorder each head's rows from rotate-half order (pairs i, i + D/2) to adjacent pairs
    (2i, 2i + 1), so RoPE becomes a complex multiply. q.k is unchanged when both q and k are
    permuted alike. w: [n_heads * D, ...] (or a bias [n_heads * D])."""
    half = head_dim // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).reshape(-1)
    idx = (torch.arange(n_heads)[:, None] * head_dim + perm[None, :]).reshape(-1)
    return w[idx.to(w.device)]


class FastLlama:
    """The decoder over weights copied (and fused) from a transformers Llama-family model.

    Args:
        model: the loaded transformers model (see ``unsupported_reason``).
        dtype: dtype of matmul inputs and the KV cache (bf16 for int8 weights on CPU).
        quantize: "none", "int8" (weight-only: on a CPU where chatui's kernel builds, groups of
            32 along K with int16 activations, ``Q8Weight``; elsewhere per output channel,
            ``Int8Weight``) or "int4" (groups of 32 with scale and zero point, CPU kernel; the
            output layer and shapes the kernel cannot take stay int8).
        residual_dtype: dtype of the residual stream and norms (default: ``dtype``); fp32
            keeps int8's top-1 agreement with an fp32 checkpoint high at little cost.
        int8_weights: previously quantized weights by name (the disk cache), or None.
    """

    def __init__(self, model: Any, *, dtype: torch.dtype, quantize: str = "none",
                 int8_weights: dict[str, Any] | None = None,
                 residual_dtype: torch.dtype | None = None) -> None:
        cfg = model.config
        self.device = next(model.parameters()).device
        self.dtype = dtype
        self.rdtype = rdtype = residual_dtype or dtype
        self.quantize = quantize
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.hidden = cfg.hidden_size
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden // self.n_heads
        self.inter = cfg.intermediate_size
        self.eps = float(cfg.rms_norm_eps)
        self.vocab = cfg.vocab_size
        inv_freq, self.rope_scale = _rope_parameters(model)
        self.inv_freq = inv_freq.to(self.device)  # [D/2] fp32
        self._rope = torch.empty(0, self.head_dim // 2, dtype=torch.complex64, device=self.device)
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        self._c_layer_array: Any = None
        self._c_layers_of: list[_Layer] | None = None
        self.quantized: dict[str, Int8Weight | Int4Weight | Q8Weight] = {}
        self.q8 = quantize in ("int8", "int4") and q8_available(self.device)
        """int8 weights use chatui's group-wise CPU kernel (else torch's per-channel one)."""
        self.c_attention = (self.device.type == "cpu" and dtype == torch.float32
                            and q8_available(self.device))
        """One-token attention (RoPE, cache write, attention) in chatui's C kernel: fp32 on a
        CPU where the kernels build."""
        stored = int8_weights or {}

        def weight(name: str, make: Callable[[], torch.Tensor], shape: tuple[int, int]) -> Weight:
            """The weight ``name`` as run; ``make`` builds it in full precision, and is not
            called when the disk cache has it (so a cached start never reads the checkpoint's
            full-precision pages of that weight)."""
            # int4 for the decoder; the output layer (often the tied embedding, kept above
            # 4 bits in GGUFs too) stays int8: int4 there costs 4 points of top-1 agreement
            if quantize == "int4" and name != "lm_head" and Int4Weight.supports_shape(
                    shape, self.device):
                q4 = stored.get(name)
                if not isinstance(q4, Int4Weight) or tuple(q4.q.shape) != shape:
                    q4 = Int4Weight.quantize(make())
                self.quantized[name] = q4
                return q4
            if quantize not in ("int8", "int4"):
                return make().detach().to(dtype).contiguous()
            if self.q8:
                q8 = stored.get(name)
                if not isinstance(q8, Q8Weight) or q8.shape != shape:
                    q8 = Q8Weight.quantize(make())
                self.quantized[name] = q8
                return q8
            q = stored.get(name)
            if not isinstance(q, Int8Weight) or tuple(q.q.shape) != shape:
                q = Int8Weight.quantize(make(), dtype)
            q = Int8Weight(q.q.to(self.device), q.scales.to(self.device, dtype))
            self.quantized[name] = q
            return q

        def bias(*mods: Any) -> torch.Tensor | None:
            bs = [getattr(m, "bias", None) for m in mods]
            if all(b is None for b in bs):
                return None
            parts = [b if b is not None else torch.zeros(m.weight.shape[0], device=self.device)
                     for b, m in zip(bs, mods)]
            return torch.cat([p.detach().float() for p in parts]).to(dtype)

        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        self.layers: list[_Layer] = []
        for i, layer in enumerate(model.model.layers):
            att, mlp = layer.self_attn, layer.mlp
            bqkv = bias(att.q_proj, att.k_proj, att.v_proj)
            if bqkv is not None:
                bq, bk, bv = bqkv.split([H * D, KV * D, KV * D])
                bqkv = torch.cat([_interleave_rows(bq, H, D), _interleave_rows(bk, KV, D), bv])

            def qkv(att: Any = att) -> torch.Tensor:
                return torch.cat([_interleave_rows(att.q_proj.weight.detach(), H, D),
                                  _interleave_rows(att.k_proj.weight.detach(), KV, D),
                                  att.v_proj.weight.detach()])

            def gate_up(mlp: Any = mlp) -> torch.Tensor:
                return torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()])

            self.layers.append(_Layer(
                ln1=layer.input_layernorm.weight.detach().to(rdtype),
                wqkv=weight(f"layers.{i}.qkv", qkv, ((H + 2 * KV) * D, self.hidden)),
                bqkv=bqkv,
                wo=weight(f"layers.{i}.o", lambda att=att: att.o_proj.weight,
                          (self.hidden, H * D)),
                bo=bias(att.o_proj),
                ln2=layer.post_attention_layernorm.weight.detach().to(rdtype),
                wgu=weight(f"layers.{i}.gate_up", gate_up, (2 * self.inter, self.hidden)),
                bgu=bias(mlp.gate_proj, mlp.up_proj),
                wd=weight(f"layers.{i}.down", lambda mlp=mlp: mlp.down_proj.weight,
                          (self.hidden, self.inter)),
                bd=bias(mlp.down_proj)))
        self.norm = model.model.norm.weight.detach().to(rdtype)
        emb = model.model.embed_tokens.weight
        tied = model.lm_head.weight.data_ptr() == emb.data_ptr()
        self.lm_head = weight("lm_head", lambda: model.lm_head.weight,
                              tuple(model.lm_head.weight.shape))
        self.lm_bias = bias(model.lm_head)
        if tied:
            self.embed: Weight = self.lm_head
        else:
            self.embed = weight("embed", lambda: emb, tuple(emb.shape))
        self.tied = tied

    # ---- sizes ----

    def weight_bytes(self) -> int:
        """Bytes the decode step reads per token (each tensor once)."""
        seen: set[int] = set()
        total = 0

        def add(t: Any) -> None:
            nonlocal total
            if t is None:
                return
            if isinstance(t, Int8Weight):
                add(t.q)
                add(t.scales)
                return
            if isinstance(t, Q8Weight):
                add(t.packed)
                add(t.scales)
                return
            if isinstance(t, Int4Weight):
                add(t.packed)
                add(t.scales_zeros)
                return
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()

        for L in self.layers:
            for t in (L.ln1, L.wqkv, L.bqkv, L.wo, L.bo, L.ln2, L.wgu, L.bgu, L.wd, L.bd):
                add(t)
        for t in (self.norm, self.lm_head, self.lm_bias):
            add(t)
        return total

    def new_cache(self, batch: int = 1) -> StaticKVCache:
        return StaticKVCache(len(self.layers), self.n_kv, self.head_dim, dtype=self.dtype,
                             device=self.device, batch=batch)

    # ---- forward ----

    def _rotations(self, n: int) -> torch.Tensor:
        """scale * exp(i * pos * inv_freq) for positions [0, n): [n, D/2] complex64."""
        if self._rope.shape[0] < n:
            size = max(n, 2 * self._rope.shape[0], 1024)
            pos = torch.arange(size, device=self.device, dtype=torch.float32)
            angles = pos[:, None] * self.inv_freq[None, :]
            self._rope = torch.polar(torch.full_like(angles, self.rope_scale), angles)
            self._cos_sin = None
        return self._rope

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.embed, (Int8Weight, Q8Weight)):
            return self.embed.rows(ids, self.rdtype)
        return F.embedding(ids, self.embed).to(self.rdtype)

    def rope_tables(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) x scale for positions [0, n): [n, D/2] fp32 each (the step's RoPE as
        real arithmetic, the same products as the complex multiply of ``forward``); views of
        tables kept until the rotations grow."""
        table = self._rotations(n)
        if self._cos_sin is None:
            self._cos_sin = (table.real.contiguous(), table.imag.contiguous())
        cos, sin = self._cos_sin
        return cos[:n], sin[:n]

    def step(self, ks: list[torch.Tensor], vs: list[torch.Tensor], ids: torch.Tensor,
             pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One decode step with fixed shapes, for ``torch.compile`` and graph capture.

        ks, vs: each layer's cache [B, KV, C, D] (position ``pos`` is written in place);
        ids: [B, 1]; pos: [1] long, the position of the new token in every row (no padding);
        cos, sin: ``rope_tables`` of at least C positions. Attention covers the whole capacity
        with a mask (keys after ``pos`` are hidden), so the shapes never change while the cache
        does not grow. Returns logits [B, V] fp32.
        """
        B = ids.shape[0]
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        G, half = H // KV, D // 2
        C = ks[0].shape[2]
        c, s = cos[pos].view(1, 1, half), sin[pos].view(1, 1, half)  # [1, 1, D/2]
        mask = (torch.arange(C, device=ids.device) <= pos).view(1, 1, 1, C)
        x = self._embed(ids)  # [B, 1, hidden]
        nqk = (H + KV) * D
        for i, L in enumerate(self.layers):
            qkv = _norm_linear(x, L.ln1, self.eps, L.wqkv, L.bqkv)[:, 0]  # [B, (H + 2KV) * D]
            qk = qkv[:, :nqk].float().view(B, H + KV, half, 2)
            a, b = qk[..., 0], qk[..., 1]
            qk = torch.stack([a * c - b * s, a * s + b * c], dim=-1).view(B, H + KV, D)
            q = qk[:, :H].to(self.dtype).view(B, KV, G, D)
            k_new = qk[:, H:].to(self.dtype).view(B, KV, 1, D)
            v_new = qkv[:, nqk:].to(self.dtype).view(B, KV, 1, D)
            ks[i].index_copy_(2, pos, k_new)
            vs[i].index_copy_(2, pos, v_new)
            o = F.scaled_dot_product_attention(q, ks[i], vs[i], attn_mask=mask)
            x = x + _linear(o.reshape(B, 1, H * D), L.wo, L.bo)
            gate_up = _norm_linear(x, L.ln2, self.eps, L.wgu, L.bgu)
            x = x + _swiglu_linear(gate_up, L.wd, L.bd)
        return _norm_linear(x[:, -1], self.norm, self.eps, self.lm_head,
                            self.lm_bias).float()  # [B, V]

    @torch.inference_mode()
    def forward(self, cache: StaticKVCache, input_ids: torch.Tensor, *,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                all_logits: bool = False) -> torch.Tensor:
        """input_ids: [B, T] -> logits of the last position [B, V] fp32 (every position
        [B, T, V] with ``all_logits``); the cache grows by T.

        attention_mask: [B, >= length + T] (1 = a real token) for left-padded batches;
        position_ids: [B, >= T] (the last T are used). Without them, positions continue from
        the cache length for every row.
        """
        B, T = input_ids.shape
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        G = H // KV
        start = cache.length
        end = start + T
        cache.reserve(end, B)
        if T == 1 and self.c_attention and not all_logits:
            return self._decode_c(cache, self._embed(input_ids), attention_mask, position_ids)
        table = self._rotations(end if position_ids is None else int(position_ids.max()) + 1)
        if position_ids is None:
            rot = table[start:end][None, :, None, :]  # [1, T, 1, D/2]
        else:
            rot = table[position_ids[:, -T:]][:, :, None, :]  # [B, T, 1, D/2]

        mask: torch.Tensor | None = None
        causal = False
        if attention_mask is not None or (T > 1 and start > 0):
            if T == 1:
                mask = attention_mask[:, None, None, :end].bool()  # [B, 1, 1, S]
            else:
                q_pos = torch.arange(start, end, device=self.device)[:, None]
                k_pos = torch.arange(end, device=self.device)[None, :]
                m = (k_pos <= q_pos)[None]  # [1, T, S]
                if attention_mask is not None:  # padding; a position always sees itself
                    m = (m & attention_mask[:, None, :end].bool()) | (k_pos == q_pos)[None]
                mask = m[:, None]  # [B or 1, 1, T, S]
        elif T > 1:
            causal = True

        x = self._embed(input_ids)  # [B, T, hidden]
        nqk = (H + KV) * D
        for i, L in enumerate(self.layers):
            qkv = _norm_linear(x, L.ln1, self.eps, L.wqkv, L.bqkv)  # [B, T, (H + 2KV) * D]
            qk = qkv[..., :nqk].float().view(B, T, H + KV, D // 2, 2)
            qk = torch.view_as_real(torch.view_as_complex(qk) * rot).view(B, T, H + KV, D)
            kc, vc = cache.k[i], cache.v[i]  # [B, KV, C, D]
            kc[:, :, start:end] = qk[:, :, H:].transpose(1, 2)
            vc[:, :, start:end] = qkv[..., nqk:].view(B, T, KV, D).transpose(1, 2)
            keys, values = kc[:, :, :end], vc[:, :, :end]
            if T == 1:  # the G query heads of a KV head act as G query rows: no K/V copies
                q = qk[:, :, :H].to(self.dtype).view(B, KV, G, D)
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
                o = o.reshape(B, 1, H * D)
            else:
                q = qk[:, :, :H].to(self.dtype).transpose(1, 2)  # [B, H, T, D]
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                   is_causal=causal, enable_gqa=G > 1)
                o = o.transpose(1, 2).reshape(B, T, H * D)
            x = x + _linear(o, L.wo, L.bo)
            gate_up = _norm_linear(x, L.ln2, self.eps, L.wgu, L.bgu)
            x = x + _swiglu_linear(gate_up, L.wd, L.bd)  # promotes to the residual dtype
        cache.length = end
        return _norm_linear(x if all_logits else x[:, -1], self.norm, self.eps, self.lm_head,
                            self.lm_bias).float()  # [B, V] or [B, T, V]


    def _c_layers(self) -> Any:
        """The layers as ``kernel_abi.Layer`` structs for ``decode_layers`` (built once), or None
        when a layer has a weight the C kernel does not take."""
        if self._c_layers_of is self.layers or not self.c_attention:
            return self._c_layer_array or None  # built for these layers (or none possible)
        self._c_layers_of = self.layers

        def ptr(t: Any) -> int | None:
            return None if t is None else t.data_ptr()

        structs = []
        for L in self.layers:
            ws = (L.wqkv, L.wo, L.wgu, L.wd)
            vectors = (L.ln1, L.ln2, L.bqkv, L.bo, L.bgu, L.bd)
            if not all(isinstance(w, Q8Weight) for w in ws) or not all(
                    v is None or (v.dtype == torch.float32 and v.is_contiguous()) for v in vectors):
                self._c_layer_array = ()
                return None
            structs.append(Layer(ptr(L.ln1), ptr(L.ln2), *(
                p for w, b in ((L.wqkv, L.bqkv), (L.wo, L.bo), (L.wgu, L.bgu), (L.wd, L.bd))
                for p in (w.packed.data_ptr(), w.scales.data_ptr(), ptr(b)))))
        self._c_layer_array = (Layer * len(structs))(*structs)
        return self._c_layer_array

    def _decode_c(self, cache: StaticKVCache, x: torch.Tensor,
                  attention_mask: torch.Tensor | None,
                  position_ids: torch.Tensor | None) -> torch.Tensor:
        """``forward`` for one token per row with attention in chatui's C kernel (the cache
        already reserved). x: [B, 1, hidden] fp32 -> logits [B, V] fp32."""
        kernel = load_kernel()
        assert kernel is not None
        B = x.shape[0]
        start = cache.length
        if position_ids is None:
            positions = torch.full((B,), start, dtype=torch.long)
        else:
            positions = position_ids[:, -1].to(torch.long).contiguous()
        cos, sin = self.rope_tables(int(positions.max()) + 1)
        mask = None
        if attention_mask is not None:
            mask = attention_mask[:, : start + 1].to(torch.uint8).contiguous()
        layers = self._c_layers()
        if layers is not None:  # every layer in one C call
            x = x[:, 0].contiguous()
            kernel.decode_layers(x, layers, cache.k, cache.v, n_heads=self.n_heads,
                                 inter=self.inter, write=start, positions=positions, cos=cos,
                                 sin=sin, mask=mask, eps=self.eps)
            x = x[:, None]
        else:
            for i, L in enumerate(self.layers):
                qkv = _norm_linear(x, L.ln1, self.eps, L.wqkv, L.bqkv)[:, 0].contiguous()
                o = kernel.attention(qkv, cache.k[i], cache.v[i], start, positions, cos, sin,
                                     mask, self.n_heads)
                x = x + _linear(o[:, None], L.wo, L.bo)
                gate_up = _norm_linear(x, L.ln2, self.eps, L.wgu, L.bgu)
                x = x + _swiglu_linear(gate_up, L.wd, L.bd)
        cache.length = start + 1
        return _norm_linear(x[:, -1], self.norm, self.eps, self.lm_head, self.lm_bias).float()


class FastRunner:
    """``HFRunner``'s interface over ``FastLlama`` (the transformers model stays as ``model``
    for reference comparisons)."""

    name = "fast"

    def __init__(self, model: Any, *, dtype: torch.dtype | None = None, quantize: str = "none",
                 int8_weights: dict[str, Any] | None = None,
                 residual_dtype: torch.dtype | None = None, compile: str = "off",
                 compile_dir: Any = None) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        model_dtype = next(model.parameters()).dtype
        if dtype is None:  # torch's int8 and int4 kernels want bf16 activations, chatui's fp32
            bf16 = quantize == "int4" or (quantize == "int8" and not q8_available(self.device))
            dtype = torch.bfloat16 if bf16 and model_dtype == torch.float32 else model_dtype
        self.fast = FastLlama(model, dtype=dtype, quantize=quantize, int8_weights=int8_weights,
                              residual_dtype=residual_dtype)
        self.dtype = dtype
        self.int8_path: Any = None
        """Where the int8 weights are cached on disk (None when not quantized)."""
        self.decode: DecodeStep | None = None
        """The compiled (and on CUDA graph-captured) one-token step, when in use."""
        if use_compile(compile, self.device):
            self.decode = DecodeStep(self.fast, compile=True, cache_dir=compile_dir)

    def new_cache(self) -> StaticKVCache:
        return self.fast.new_cache()

    @staticmethod
    def can_crop(cache: Any) -> bool:
        return True

    def forward(self, cache: StaticKVCache, input_ids: torch.Tensor, *,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        if (self.decode is not None and input_ids.shape[1] == 1 and attention_mask is None
                and position_ids is None):
            return self.decode(cache, input_ids)
        return self.fast.forward(cache, input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids)

    def weight_bytes(self) -> int:
        return self.fast.weight_bytes()
