"""A compact decoder with a preallocated KV cache for the Llama family and its relatives: the
fast path of the engine.

transformers' modules cost more in Python per layer than the int8 matmuls they wrap on a small
CPU model, so ``FastLlama`` re-implements the decoder (RMSNorm, RoPE, grouped-query attention
through ``F.scaled_dot_product_attention``, gated MLP) over weights taken from an already
loaded transformers model: fused QKV and gate/up projections, q/k rows permuted so RoPE is one
complex multiply, optional int8 weight-only linears (``inference.quant``). One decoder loop
serves Llama, Mistral, Qwen2 and Qwen3, Phi-3, Gemma 2 and 3, Mixtral and Qwen3-MoE; what each
does differently (q/k norms, sliding windows, Gemma's norms and soft-capping, partial rotary,
experts) is read from the model by ``fast_blocks``, and ``unsupported_reason`` names why another
checkpoint falls back to ``HFRunner``.

``FastRunner`` has ``HFRunner``'s interface over a ``kv_cache.StaticKVCache``. Which runner
a checkpoint gets (and in which precision) is ``runner.build_runner``'s policy, not this file's.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .decode_graph import DecodeStep, use_compile
from .fast_blocks import (SUPPORTED_MODEL_TYPES, MoE, RotaryTables, causal_mask, decoder,
                          interleave_index, norm_weight, read_arch, rope_specs,
                          softcap_attention, unsupported_reason, window_start)
from .kernel_abi import Layer
from .kv_cache import StaticKVCache
from .q8kernel import F32_MAX_ROWS, load_kernel
from . import weight_rows as rows
from .quant import (Int4Weight, Int8Weight, PackedExperts, Q4Weight, Q6Weight, Q8Weight,
                    int4_linear, int8_linear, q4_linear, q6_linear, q8_available, q8_linear)

__all__ = ["FastLlama", "FastRunner", "SUPPORTED_MODEL_TYPES", "unsupported_reason"]

Weight = Any  # torch.Tensor [N, K], Int8Weight, Q8Weight, Q4Weight, Q6Weight or Int4Weight


def _linear(x: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    if isinstance(w, Q8Weight):
        out = q8_linear(x, w)
    elif isinstance(w, Q4Weight):
        out = q4_linear(x, w)
    elif isinstance(w, Q6Weight):
        out = q6_linear(x, w)
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
    if isinstance(w, (Q8Weight, Q4Weight)) and x.dtype == torch.float32:
        f = q8_linear if isinstance(w, Q8Weight) else q4_linear
        out = f(x, w, norm=norm, eps=eps)
        return out if b is None else out + b
    if isinstance(w, Q6Weight):  # int4's output layer
        out = q6_linear(x, w, norm=norm, eps=eps)
        return out if b is None else out + b
    return _linear(F.rms_norm(x, (x.shape[-1],), norm, eps), w, b)


def _swiglu_linear(gate_up: torch.Tensor, w: Weight, b: torch.Tensor | None = None) -> torch.Tensor:
    """``_linear(F.silu(gate) * up, w, b)`` for gate_up = [gate | up]; one kernel call for int8
    on the CPU."""
    if isinstance(w, (Q8Weight, Q4Weight)) and gate_up.dtype == torch.float32:
        f = q8_linear if isinstance(w, Q8Weight) else q4_linear
        out = f(gate_up, w, swiglu=True)
        return out if b is None else out + b
    gate, up = gate_up.chunk(2, dim=-1)
    return _linear(F.silu(gate) * up, w, b)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in the weight's dtype (the norms transformers computes in fp32 and applies to a
    sub-layer's output: Gemma's post-attention and post-MLP norms)."""
    return F.rms_norm(x.to(w.dtype), (x.shape[-1],), w, eps)


class Interrupted(Exception):
    """A prefill stopped between two layers (``FastLlama.forward``'s ``should_stop``); the
    cache is as it was before the call. A chunk of 512 prompt tokens deep in a long context
    takes seconds on a CPU (1.3 s at 5,000 tokens here): Esc waited for it."""


@dataclass
class _Layer:
    ln1: torch.Tensor  # [hidden]
    wqkv: Weight  # [(H + 2KV) * D, hidden]; q and k rows permuted to interleaved RoPE pairs
    bqkv: torch.Tensor | None
    wo: Weight  # [hidden, H * D]
    bo: torch.Tensor | None
    ln2: torch.Tensor  # the MLP's input norm (Gemma: pre_feedforward_layernorm)
    wgu: Weight | None  # [2 * I, hidden]: gate rows, then up rows (None for experts)
    bgu: torch.Tensor | None
    wd: Weight | None  # [hidden, I]
    bd: torch.Tensor | None
    q_norm: torch.Tensor | None = None  # [D] fp32, per head before RoPE (Qwen3, Gemma 3)
    k_norm: torch.Tensor | None = None
    post_attn: torch.Tensor | None = None  # Gemma: norm of the attention output
    post_mlp: torch.Tensor | None = None  # Gemma: norm of the MLP output
    window: int | None = None  # sliding window (keys within this many positions)
    rope: str = "default"  # which RotaryTables
    moe: MoE | None = None


def _same_shapes(a: Any, b: Any) -> bool:
    """Whether two weights' tensors have the same shapes and dtypes, field by field."""
    fa, fb = vars(a), vars(b)
    return fa.keys() == fb.keys() and all(
        (x.shape, x.dtype) == (fb[k].shape, fb[k].dtype) if isinstance(x, torch.Tensor)
        else x == fb[k] for k, x in fa.items())


def _qkv_parts(att: Any, sizes: list[int], full: Callable[[torch.Tensor], rows.Weight]
               ) -> list[tuple[rows.Weight, torch.Tensor | None]]:
    """(weight, bias) of q, k and v: separate projections, or Phi-3's fused ``qkv_proj``."""
    if hasattr(att, "qkv_proj"):
        w = full(att.qkv_proj.weight)
        b = att.qkv_proj.bias
        bs = b.detach().split(sizes) if b is not None else (None,) * 3
        return list(zip(rows.split(w, sizes), bs))
    mods = (att.q_proj, att.k_proj, att.v_proj)
    return [(full(m.weight), None if m.bias is None else m.bias.detach()) for m in mods]


def _gate_up(mlp: Any, full: Callable[[torch.Tensor], rows.Weight]) -> rows.Weight:
    """[gate rows | up rows] (Phi-3's ``gate_up_proj`` already is)."""
    if hasattr(mlp, "gate_up_proj"):
        return full(mlp.gate_up_proj.weight)
    return rows.cat([full(mlp.gate_proj.weight), full(mlp.up_proj.weight)])


def _full_weights(model: Any) -> Callable[[torch.Tensor], rows.Weight]:
    """A parameter as a tensor, or, while it is still in the checkpoint file (a meta tensor of
    a ``lazy_model``), as the rows to read it from."""
    source = getattr(model, "chatui_weights", None)
    names = {id(p): n for n, p in model.named_parameters()} if source is not None else {}

    def full(t: torch.Tensor) -> rows.Weight:
        if t.is_meta:
            assert source is not None, "a meta parameter with no checkpoint to read it from"
            return source.rows(names[id(t)])
        return t.detach()

    return full


def model_device(model: Any) -> torch.device:
    """The device of the model's loaded parameters (a lazy model's others are meta)."""
    for p in model.parameters():
        if not p.is_meta:
            return p.device
    return torch.device("cpu")


class FastLlama:
    """The decoder over weights copied (and fused) from a transformers model of a supported
    type (``fast_blocks.SUPPORTED_MODEL_TYPES``).

    Args:
        model: the loaded transformers model (see ``unsupported_reason``).
        dtype: dtype of matmul inputs and the KV cache (bf16 for int8 weights on CPU).
        quantize: "none", "int8" (weight-only: on a CPU where chatui's kernel builds, groups of
            32 along K with 8-bit activations, ``Q8Weight``; elsewhere per output channel,
            ``Int8Weight``) or "int4" (groups of 32 with an fp16 scale and min: chatui's
            ``Q4Weight`` kernel where it builds, with the output layer (and so a tied
            embedding) 6-bit, ``Q6Weight``; else torch's ``Int4Weight`` one, the output layer
            int8; an untied embedding and shapes torch's kernel cannot take stay int8).
            Routers of experts stay in the model's precision (they are small, and pick which
            weights are read).
        residual_dtype: dtype of the residual stream and norms (default: ``dtype``); fp32
            keeps int8's top-1 agreement with an fp32 checkpoint high at little cost.
        int8_weights: previously quantized weights by name (the disk cache), or None.
    """

    def __init__(self, model: Any, *, dtype: torch.dtype, quantize: str = "none",
                 int8_weights: dict[str, Any] | None = None,
                 residual_dtype: torch.dtype | None = None, half_kv: bool = True) -> None:
        cfg, stack = decoder(model)
        self.device = model_device(model)
        full = _full_weights(model)
        self.dtype = dtype
        self.rdtype = rdtype = residual_dtype or dtype
        self.quantize = quantize
        self.arch = arch = read_arch(model)
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.hidden = cfg.hidden_size
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden // self.n_heads
        self.inter = cfg.intermediate_size
        self.eps = float(cfg.rms_norm_eps)
        self.vocab = cfg.vocab_size
        self.ropes = {kind: RotaryTables(spec, self.head_dim, self.device)
                      for kind, spec in rope_specs(model).items()}
        rotated = 2 * next(iter(self.ropes.values())).rotated_pairs  # dims RoPE turns
        self.sdpa_scale: float | None = arch.attn_scale
        """The attention scale SDPA is given (None: 1/sqrt(D)); folded into the q norm where
        there is one, so the C attention kernel (which has no scale) computes it too."""
        self._c_layer_array: Any = None
        self._c_layers_of: list[_Layer] | None = None
        self._c_experts_of: list[Any] | None = None
        self.quantized: dict[str, Int8Weight | Int4Weight | Q8Weight | Q4Weight | Q6Weight] = {}
        self.q8 = quantize in ("int8", "int4") and q8_available(self.device)
        """int8 weights use chatui's group-wise CPU kernel (else torch's per-channel one)."""
        stored = int8_weights or {}

        def weight(name: str, make: Callable[[], rows.Weight], shape: tuple[int, int]) -> Weight:
            """The weight ``name`` as run; ``make`` gives it in full precision (a tensor, or the
            rows of a weight still in the checkpoint file, quantized a block of rows at a
            time), and is not called when the disk cache has it (so a cached start never reads
            the checkpoint's full-precision pages of that weight)."""
            # int4 for the decoder; the output layer (often the tied embedding, kept above
            # 4 bits in GGUFs too: Q6_K in a Q4_K_M file) is 6-bit with chatui's kernels
            # where its rows are whole Q6_K super-blocks (``Q6Weight.suits``; int4 there costs
            # 4 points of top-1 agreement), else int8. An untied embedding stays int8 (only a
            # few rows of it are read a token)
            if quantize == "int4" and name == "lm_head" and self.q8 and Q6Weight.suits(shape):
                q6 = stored.get(name)
                if not isinstance(q6, Q6Weight) or q6.shape != shape:
                    q6 = rows.to_q6(make())
                self.quantized[name] = q6
                return q6
            if quantize == "int4" and name not in ("lm_head", "embed") and self.q8:
                q4c = stored.get(name)
                if not isinstance(q4c, Q4Weight) or q4c.shape != shape:
                    q4c = rows.to_q4(make())
                self.quantized[name] = q4c
                return q4c
            if (quantize == "int4" and name not in ("lm_head", "embed")
                    and Int4Weight.supports_shape(shape, self.device)):
                q4 = stored.get(name)
                if not isinstance(q4, Int4Weight) or tuple(q4.q.shape) != shape:
                    q4 = rows.to_int4(make())
                self.quantized[name] = q4
                return q4
            if quantize not in ("int8", "int4"):
                return rows.dense(make(), dtype, self.device).contiguous()
            if self.q8:
                q8 = stored.get(name)
                if not isinstance(q8, Q8Weight) or q8.shape != shape:
                    q8 = rows.to_q8(make())
                self.quantized[name] = q8
                return q8
            q = stored.get(name)
            if not isinstance(q, Int8Weight) or tuple(q.q.shape) != shape:
                q = rows.to_int8(make(), dtype, self.device)
            q = Int8Weight(q.q.to(self.device), q.scales.to(self.device, dtype))
            self.quantized[name] = q
            return q

        def bias(*bs: torch.Tensor | None, sizes: list[int]) -> torch.Tensor | None:
            """Biases of fused rows (zeros where a part has none), or None when none has."""
            if all(b is None for b in bs):
                return None
            parts = [b.detach().float() if b is not None else torch.zeros(n, device=self.device)
                     for b, n in zip(bs, sizes)]
            return torch.cat(parts).to(dtype)

        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        q_rows = interleave_index(H, D, rotated).to(self.device)
        k_rows = interleave_index(KV, D, rotated).to(self.device)
        head_rows = interleave_index(1, D, rotated).to(self.device)
        sizes = [H * D, KV * D, KV * D]
        offset = arch.norm_offset
        self.layers: list[_Layer] = []
        for i, layer in enumerate(stack.layers):
            att, mlp = layer.self_attn, layer.mlp
            (wq, bq), (wk, bk), (wv, bv) = _qkv_parts(att, sizes, full)
            bqkv = bias(None if bq is None else bq[q_rows], None if bk is None else bk[k_rows],
                        bv, sizes=sizes)

            def qkv(wq: rows.Weight = wq, wk: rows.Weight = wk,
                    wv: rows.Weight = wv) -> rows.Weight:
                return rows.cat([rows.take(wq, q_rows), rows.take(wk, k_rows), wv])

            q_norm = k_norm = None
            if hasattr(att, "q_norm"):
                q_norm = norm_weight(att.q_norm, offset, torch.float32)[head_rows]
                k_norm = norm_weight(att.k_norm, offset, torch.float32)[head_rows]
                if arch.attn_scale is not None:
                    q_norm = q_norm * (arch.attn_scale * math.sqrt(D))
                    self.sdpa_scale = None
            gemma = hasattr(layer, "pre_feedforward_layernorm")
            mlp_norm = layer.pre_feedforward_layernorm if gemma else layer.post_attention_layernorm
            L = _Layer(
                ln1=norm_weight(layer.input_layernorm, offset, rdtype),
                wqkv=weight(f"layers.{i}.qkv", qkv, ((H + 2 * KV) * D, self.hidden)),
                bqkv=bqkv,
                wo=weight(f"layers.{i}.o", lambda att=att: full(att.o_proj.weight),
                          (self.hidden, H * D)),
                bo=None if att.o_proj.bias is None else att.o_proj.bias.detach().to(dtype),
                ln2=norm_weight(mlp_norm, offset, rdtype),
                wgu=None, bgu=None, wd=None, bd=None,
                q_norm=q_norm, k_norm=k_norm,
                post_attn=norm_weight(layer.post_attention_layernorm, offset, rdtype)
                if gemma else None,
                post_mlp=norm_weight(layer.post_feedforward_layernorm, offset, rdtype)
                if gemma else None,
                window=arch.windows[i], rope=arch.rope_kinds[i])
            if hasattr(mlp, "experts"):
                L.moe = self._experts(i, mlp, weight, full)
            else:
                inter = mlp.down_proj.weight.shape[1]
                up_bias = getattr(getattr(mlp, "up_proj", None), "bias", None)
                gate_bias = getattr(getattr(mlp, "gate_proj", None), "bias", None)
                L.wgu = weight(f"layers.{i}.gate_up", lambda mlp=mlp: _gate_up(mlp, full),
                               (2 * inter, self.hidden))
                L.bgu = bias(gate_bias, up_bias, sizes=[inter, inter])
                L.wd = weight(f"layers.{i}.down", lambda mlp=mlp: full(mlp.down_proj.weight),
                              (self.hidden, inter))
                L.bd = None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach().to(dtype)
            self.layers.append(L)
        self.norm = norm_weight(stack.norm, offset, rdtype)
        emb = stack.embed_tokens.weight
        head = model.lm_head.weight
        tied = head is emb or (not emb.is_meta and head.data_ptr() == emb.data_ptr())
        self.lm_head = weight("lm_head", lambda: full(head), tuple(head.shape))
        lm_bias = model.lm_head.bias
        self.lm_bias = None if lm_bias is None else lm_bias.detach().to(dtype)
        if tied:
            self.embed: Weight = self.lm_head
        else:
            self.embed = weight("embed", lambda: full(emb), tuple(emb.shape))
        self.tied = tied
        self.c_attention = (self.device.type == "cpu" and dtype == torch.float32
                            and q8_available(self.device) and arch.attn_softcap is None
                            and self.sdpa_scale is None)
        """One-token attention (RoPE, cache write, attention) in chatui's C kernel: fp32 on a
        CPU where the kernels build, for attention without soft-capping or its own scale."""
        self.c_prefill = self.c_attention
        """A prompt's RoPE, cache writes and attention (T > 1, one row, no padding) in chatui's
        C kernel too (``attn_prefill``: each token's key and output a decode step's bits) rather
        than torch's ``scaled_dot_product_attention``: the default model's 138 / 1,010-token
        prefills 13-19% quicker (``benchmarks/bench_prefill_attention.py``, which turns this off
        for its comparison)."""
        self.kv_dtype = (torch.float16 if half_kv and self.c_attention and self.q8
                         and quantize in ("int8", "int4") else dtype)
        """The KV cache's dtype: fp16 where the C attention kernel decodes int8 or int4 weights
        (their rounding is ~100x the cache's; ``half_kv`` False keeps the matmul dtype, for the
        compiled step, which attends in torch), else the matmul dtype. Half the cache's memory,
        and half its reading: a batched step reads every row's own keys and values, which at 8
        rows of the default model were 24 MB a step in fp32, more than the L3 keeps beside the
        weights streaming through; docs/batched-decode.md, issue 18's seventh pass, for what
        it measured."""

    def _experts(self, i: int, mlp: Any, weight: Callable[..., Weight],
                 full: Callable[[torch.Tensor], rows.Weight]) -> MoE:
        """A sparse MLP's router and experts (each expert's weights quantized on their own)."""
        gate_up, down = mlp.experts.gate_up_proj, mlp.experts.down_proj  # [E, 2I, h], [E, h, I]
        moe = MoE(router=mlp.gate.weight.detach(), top_k=int(mlp.gate.top_k),
                  normalize=bool(getattr(mlp.gate, "norm_topk_prob", True)))
        for e in range(gate_up.shape[0]):
            moe.experts.append((
                weight(f"layers.{i}.experts.{e}.gate_up",
                       lambda e=e: rows.expert(full(gate_up), e), tuple(gate_up.shape[1:])),
                weight(f"layers.{i}.experts.{e}.down", lambda e=e: rows.expert(full(down), e),
                       tuple(down.shape[1:]))))
        return moe

    def adopt(self, weights: dict[str, Any]) -> None:
        """Run on ``weights`` (by name, as ``quantized`` holds them: another copy of the same
        values, e.g. read into huge pages) where they match the runner's own in kind and shape;
        a mixture's experts keep theirs. The C step's layer structs are built again for the new
        layers at the next step."""
        swap: dict[int, Any] = {}
        for name, old in self.quantized.items():
            new = weights.get(name)
            if type(new) is type(old) and _same_shapes(new, old):
                swap[id(old)] = new
                self.quantized[name] = new
        if not swap:
            return

        def mine(w: Any) -> Any:
            return swap.get(id(w), w)

        self.layers = [dataclasses.replace(L, wqkv=mine(L.wqkv), wo=mine(L.wo), wgu=mine(L.wgu),
                                           wd=mine(L.wd)) for L in self.layers]
        self.lm_head, self.embed = mine(self.lm_head), mine(self.embed)

    # ---- sizes ----

    @property
    def has_experts(self) -> bool:
        return any(L.moe is not None for L in self.layers)

    def weight_bytes(self) -> int:
        """Bytes the decode step reads per token (each tensor once; of a mixture of experts,
        the router and top_k experts' worth)."""
        seen: set[int] = set()

        def size(t: Any) -> int:
            if t is None:
                return 0
            if isinstance(t, Int8Weight):
                return size(t.q) + size(t.scales)
            if isinstance(t, (Q8Weight, Q4Weight, Q6Weight)):
                return size(t.packed) + size(t.scales)
            if isinstance(t, Int4Weight):
                return size(t.packed) + size(t.scales_zeros)
            if t.data_ptr() in seen:
                return 0
            seen.add(t.data_ptr())
            return t.numel() * t.element_size()

        total = 0
        for L in self.layers:
            for t in (L.ln1, L.wqkv, L.bqkv, L.wo, L.bo, L.ln2, L.wgu, L.bgu, L.wd, L.bd,
                      L.q_norm, L.k_norm, L.post_attn, L.post_mlp):
                total += size(t)
            if L.moe is not None:
                experts = sum(size(w) for pair in L.moe.experts for w in pair)
                total += size(L.moe.router) + experts * L.moe.top_k // len(L.moe.experts)
        for t in (self.norm, self.lm_head, self.lm_bias):
            total += size(t)
        return total

    def new_cache(self, batch: int = 1) -> StaticKVCache:
        return StaticKVCache(len(self.layers), self.n_kv, self.head_dim, dtype=self.kv_dtype,
                             device=self.device, batch=batch)

    # ---- pieces of a layer ----

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if (isinstance(self.embed, Q8Weight) and self.rdtype is torch.float32
                and not torch.compiler.is_compiling() and (kernel := load_kernel()) is not None):
            # one C pass (vocab.c), the same values as rows() and the scale below
            return kernel.q8_rows(ids, self.embed.packed, self.embed.scales, self.embed.k,
                                  1.0 if self.arch.embed_scale is None else self.arch.embed_scale)
        if isinstance(self.embed, (Int8Weight, Q8Weight, Q6Weight)):
            x = self.embed.rows(ids, self.rdtype)
        else:
            x = F.embedding(ids, self.embed).to(self.rdtype)
        return x if self.arch.embed_scale is None else x * self.arch.embed_scale

    def _qk_norm(self, qk: torch.Tensor, L: _Layer) -> torch.Tensor:
        """Per-head RMSNorm of q and k before RoPE. qk: [..., H + KV, D] fp32."""
        H, D = self.n_heads, self.head_dim
        q = F.rms_norm(qk[..., :H, :], (D,), L.q_norm, self.eps)
        k = F.rms_norm(qk[..., H:, :], (D,), L.k_norm, self.eps)
        return torch.cat([q, k], dim=-2)

    def _glu_down(self, gate_up: torch.Tensor, w: Weight, b: torch.Tensor | None) -> torch.Tensor:
        """The down projection of ``act(gate) * up`` (SiLU: fused in the int8 kernel)."""
        if self.arch.act == "silu":
            return _swiglu_linear(gate_up, w, b)
        gate, up = gate_up.chunk(2, dim=-1)
        return _linear(self.arch.act_fn(gate) * up, w, b)

    def _expert(self, x: torch.Tensor, wgu: Weight, wd: Weight) -> torch.Tensor:
        return self._glu_down(_linear(x, wgu), wd, None)

    @staticmethod
    def _packed_experts(moe: MoE) -> PackedExperts | None:
        """The experts' one-call kernel form (int8 or int4 experts on a CPU whose kernels
        load), built on first use for the current ``moe.experts``."""
        cached = moe.kernel_experts
        if cached is None or cached[0] is not moe.experts:
            cached = moe.kernel_experts = (moe.experts, PackedExperts.of(moe.experts))
        return cached[1]

    def _after_attention(self, x: torch.Tensor, o: torch.Tensor, L: _Layer) -> torch.Tensor:
        """The rest of a layer once attention gave ``o`` [B, T, H * D]: output projection
        (and Gemma's post-attention norm) into the residual, then the MLP block."""
        a = _linear(o, L.wo, L.bo)
        if L.post_attn is not None:
            a = _rms(a, L.post_attn, self.eps)
        x = x + a
        if L.moe is not None:
            xn = F.rms_norm(x, (self.hidden,), L.ln2, self.eps).reshape(-1, self.hidden)
            packed = self._packed_experts(L.moe) if xn.shape[0] == 1 else None
            if packed is not None:  # one token: its k experts in two kernel calls
                weights, ids = L.moe.route(xn)
                y = packed(xn, ids, weights).view(x.shape)
            else:
                y = L.moe.forward(xn, self._expert).view(x.shape)
        else:
            y = self._glu_down(_norm_linear(x, L.ln2, self.eps, L.wgu, L.bgu), L.wd, L.bd)
        if L.post_mlp is not None:
            y = _rms(y, L.post_mlp, self.eps)
        return x + y  # promotes to the residual dtype

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        logits = _norm_linear(x, self.norm, self.eps, self.lm_head, self.lm_bias).float()
        cap = self.arch.final_softcap
        if cap is None:
            return logits
        if (logits.device.type == "cpu" and logits.is_contiguous()
                and not torch.compiler.is_compiling() and (kernel := load_kernel()) is not None):
            return kernel.softcap(logits, cap)  # one pass in C, in place (torch's: 0.8 ms)
        return torch.tanh(logits / cap) * cap

    # ---- forward ----

    def rope_tables(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) x scale for positions [0, n) of the one-token ``step``: [n, R * D/2] fp32
        each, the R RoPE kinds side by side (in ``self.ropes``' order); the real arithmetic of
        the complex multiply of ``forward``."""
        tables = [rope.step_table(n) for rope in self.ropes.values()]
        if len(tables) == 1:
            return tables[0]
        return (torch.cat([c for c, _ in tables], dim=-1).contiguous(),
                torch.cat([s for _, s in tables], dim=-1).contiguous())

    def step(self, ks: list[torch.Tensor], vs: list[torch.Tensor], ids: torch.Tensor,
             pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """One decode step with fixed shapes, for ``torch.compile`` and graph capture.

        ks, vs: each layer's cache [B, KV, C, D] (position ``pos`` is written in place);
        ids: [B, 1]; pos: [1] long, the position of the new token in every row (no padding);
        cos, sin: ``rope_tables`` of at least C positions. Attention covers the whole capacity
        with a mask (keys after ``pos``, and before a layer's window, are hidden), so the
        shapes never change while the cache does not grow. Returns logits [B, V] fp32.
        Not for mixtures of experts (their expert choice is data-dependent).
        """
        B = ids.shape[0]
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        G, half = H // KV, D // 2
        C = ks[0].shape[2]
        kinds = {kind: r for r, kind in enumerate(self.ropes)}
        c = cos[pos].view(1, 1, len(kinds), half)
        s = sin[pos].view(1, 1, len(kinds), half)
        slots = torch.arange(C, device=ids.device)
        masks: dict[int | None, torch.Tensor] = {}
        x = self._embed(ids)  # [B, 1, hidden]
        nqk = (H + KV) * D
        for i, L in enumerate(self.layers):
            if L.window not in masks:
                m = slots <= pos
                if L.window is not None:
                    m = m & (slots > pos - L.window)
                masks[L.window] = m.view(1, 1, 1, C)
            qkv = _norm_linear(x, L.ln1, self.eps, L.wqkv, L.bqkv)[:, 0]  # [B, (H + 2KV) * D]
            qk = qkv[:, :nqk].float().view(B, H + KV, D)
            if L.q_norm is not None:
                qk = self._qk_norm(qk, L)
            qk = qk.view(B, H + KV, half, 2)
            cr, sr = c[:, :, kinds[L.rope]], s[:, :, kinds[L.rope]]
            a, b = qk[..., 0], qk[..., 1]
            qk = torch.stack([a * cr - b * sr, a * sr + b * cr], dim=-1).view(B, H + KV, D)
            q = qk[:, :H].to(self.dtype).view(B, KV, G, D)
            ks[i].index_copy_(2, pos, qk[:, H:].to(ks[i].dtype).view(B, KV, 1, D))
            vs[i].index_copy_(2, pos, qkv[:, nqk:].to(vs[i].dtype).view(B, KV, 1, D))
            # (the cache itself unless it is fp16 under fp32 matmuls: FastRunner keeps a
            # compiled step's cache in the matmul dtype, ``kv_dtype``)
            keys, values = ks[i].to(self.dtype), vs[i].to(self.dtype)
            if self.arch.attn_softcap is not None:
                o = softcap_attention(q, keys, values, masks[L.window],
                                      self.sdpa_scale or D ** -0.5, self.arch.attn_softcap)
            else:
                o = F.scaled_dot_product_attention(q, keys, values, attn_mask=masks[L.window],
                                                   scale=self.sdpa_scale)
            x = self._after_attention(x, o.reshape(B, 1, H * D), L)
        return self._logits(x[:, -1])  # [B, V]

    @torch.inference_mode()
    def forward(self, cache: StaticKVCache, input_ids: torch.Tensor, *,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None,
                all_logits: bool = False,
                should_stop: Callable[[], bool] | None = None) -> torch.Tensor:
        """input_ids: [B, T] -> logits of the last position [B, V] fp32 (every position
        [B, T, V] with ``all_logits``); the cache grows by T.

        attention_mask: [B, >= length + T] (1 = a real token) for left-padded batches;
        position_ids: [B, >= T] (the last T are used). Without them, positions continue from
        the cache length for every row. Sliding windows count cache slots, as transformers'
        masks do. ``should_stop``: asked before each layer of a prefill (T > 1); True raises
        :class:`Interrupted` with the cache as it was (its length unchanged).
        """
        B, T = input_ids.shape
        H, KV, D = self.n_heads, self.n_kv, self.head_dim
        G = H // KV
        start = cache.length
        end = start + T
        cache.reserve(end, B)
        if T == 1 and self.c_attention and not all_logits:
            return self._decode_c(cache, self._embed(input_ids), attention_mask, position_ids)
        last = end - 1 if position_ids is None else int(position_ids.max())
        rots: dict[str, torch.Tensor] = {}
        for kind, rope in self.ropes.items():
            table = rope.table(last + 1, rope.use_long(last))
            if position_ids is None:
                rots[kind] = table[start:end][None, :, None, :]  # [1, T, 1, D/2]
            else:
                rots[kind] = table[position_ids[:, -T:]][:, :, None, :]  # [B, T, 1, D/2]
        softcap = self.arch.attn_softcap
        masks: dict[int | None, tuple[int, torch.Tensor | None, bool]] = {}

        def mask_for(window: int | None) -> tuple[int, torch.Tensor | None, bool]:
            """(first key slot, mask or None, causal) of the layers with this window."""
            if window not in masks:
                lo = window_start(start, window)
                mask, causal = None, False
                if T == 1:
                    if attention_mask is not None:
                        mask = attention_mask[:, None, None, lo:end].bool()  # [B, 1, 1, S]
                elif (attention_mask is None and start == 0 and softcap is None
                      and (window is None or T <= window)):
                    causal = True
                else:
                    mask = causal_mask(start, end, lo, attention_mask, window, self.device)
                masks[window] = (lo, mask, causal)
            return masks[window]

        x = self._embed(input_ids)  # [B, T, hidden]
        nqk = (H + KV) * D
        # a prompt's RoPE, cache writes and causal attention in chatui's C kernel (attn_prefill),
        # where one-token steps attend there too; a sliding window that hides keys keeps a
        # layer in torch
        c_prefill = (T > 1 and B == 1 and self.c_prefill and attention_mask is None
                     and position_ids is None)
        tables = ({kind: rope.cos_sin(end, rope.use_long(end - 1))
                   for kind, rope in self.ropes.items()} if c_prefill else {})
        for i, L in enumerate(self.layers):
            if should_stop is not None and should_stop():
                raise Interrupted  # (the cache's length is set only after the last layer)
            qkv = _norm_linear(x, L.ln1, self.eps, L.wqkv, L.bqkv)  # [B, T, (H + 2KV) * D]
            if c_prefill and (L.window is None or end <= L.window):
                flat = qkv[0]  # [T, (H + 2KV) * D]: RoPE, the cache writes and attention in C
                if L.q_norm is not None:
                    flat[:, :nqk] = self._qk_norm(flat[:, :nqk].view(T, H + KV, D), L).view(T, nqk)
                cos, sin = tables[L.rope]
                o = load_kernel().prefill_attention(  # type: ignore[union-attr]
                    flat, cache.k[i][0], cache.v[i][0], start, cos, sin, H)
                x = self._after_attention(x, o.view(B, T, H * D), L)
                continue
            qk = qkv[..., :nqk].float().view(B, T, H + KV, D)
            if L.q_norm is not None:
                qk = self._qk_norm(qk, L)
            qk = qk.view(B, T, H + KV, D // 2, 2)
            qk = torch.view_as_real(torch.view_as_complex(qk) * rots[L.rope]).view(B, T, H + KV, D)
            kc, vc = cache.k[i], cache.v[i]  # [B, KV, C, D]
            kc[:, :, start:end] = qk[:, :, H:].transpose(1, 2)
            vc[:, :, start:end] = qkv[..., nqk:].view(B, T, KV, D).transpose(1, 2)
            lo, mask, causal = mask_for(L.window)
            keys, values = kc[:, :, lo:end].to(self.dtype), vc[:, :, lo:end].to(self.dtype)
            if T == 1:  # the G query heads of a KV head act as G query rows: no K/V copies
                q = qk[:, :, :H].to(self.dtype).view(B, KV, G, D)
                if softcap is not None:
                    o = softcap_attention(q, keys, values, mask, self.sdpa_scale or D ** -0.5,
                                          softcap)
                else:
                    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                       scale=self.sdpa_scale)
                o = o.reshape(B, 1, H * D)
            else:
                q = qk[:, :, :H].to(self.dtype).transpose(1, 2)  # [B, H, T, D]
                if softcap is not None:
                    o = softcap_attention(q, keys, values, mask, self.sdpa_scale or D ** -0.5,
                                          softcap)
                else:
                    o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                       is_causal=causal, enable_gqa=G > 1,
                                                       scale=self.sdpa_scale)
                o = o.transpose(1, 2).reshape(B, T, H * D)
            x = self._after_attention(x, o, L)
        cache.length = end
        return self._logits(x if all_logits else x[:, -1])  # [B, V] or [B, T, V]

    def _c_layers(self) -> Any:
        """The layers as ``kernel_abi.Layer`` structs for ``decode_layers`` (built once for
        these layers and experts), or None when a layer has a weight or a step the C kernel
        does not take. Qwen3's q/k norms and a mixture of experts (Qwen3-MoE, Mixtral: the
        router in fp32, every expert packed like the layer's other weights) are in the C step
        too, so those models no longer leave it for a Python loop over the layers; so are
        sliding windows (Mistral, Qwen2, Gemma) and Gemma 3's post-attention and post-MLP
        norms, tanh GELU and per-layer RoPE bases."""
        experts = [None if L.moe is None else L.moe.experts for L in self.layers]
        built = (self._c_layers_of is self.layers and self._c_experts_of is not None
                 and all(a is b for a, b in zip(self._c_experts_of, experts)))
        if built or not self.c_attention:
            return self._c_layer_array or None  # built for these layers (or none possible)
        self._c_layers_of, self._c_experts_of = self.layers, experts

        def ptr(t: Any) -> int | None:
            return None if t is None else t.data_ptr()

        def fp32(v: torch.Tensor | None) -> bool:
            return v is None or (v.dtype == torch.float32 and v.is_contiguous())

        if self.arch.act not in C_ACTS:
            self._c_layer_array = ()
            return None
        rope_index = {kind: r for r, kind in enumerate(self.ropes)}
        structs = []
        for L in self.layers:
            moe = L.moe
            packed = None if moe is None else self._packed_experts(moe)
            ws = (L.wqkv, L.wo) + ((L.wgu, L.wd) if moe is None else ())
            kinds = {type(w) for w in ws}
            bits = 4 if kinds == {Q4Weight} else 8
            vectors = (L.ln1, L.ln2, L.bqkv, L.bo, L.bgu, L.bd, L.q_norm, L.k_norm,
                       None if moe is None else moe.router, L.post_attn, L.post_mlp)
            shaped = ((L.q_norm is None) == (L.k_norm is None)
                      and (moe is None or L.post_mlp is None))
            if (not shaped or kinds not in ({Q8Weight}, {Q4Weight}) or not all(map(fp32, vectors))
                    or (moe is not None and (packed is None or packed.bits != bits))):
                self._c_layer_array = ()
                return None
            layer = Layer(ptr(L.ln1), ptr(L.ln2), *(
                p for w, b in ((L.wqkv, L.bqkv), (L.wo, L.bo), (L.wgu, L.bgu), (L.wd, L.bd))
                for p in ((None, None) if w is None else (w.packed.data_ptr(),
                                                          w.scales.data_ptr())) + (ptr(b),)),
                bits, ptr(L.q_norm), ptr(L.k_norm))
            layer.post_attn, layer.post_mlp = ptr(L.post_attn), ptr(L.post_mlp)
            layer.window, layer.act = L.window or 0, C_ACTS[self.arch.act]
            layer.rope = rope_index[L.rope]
            if moe is not None and packed is not None:
                layer.router = moe.router.data_ptr()
                layer.egu_w, layer.egu_s = (t.data_ptr() for t in packed.gate_up)
                layer.ed_w, layer.ed_s = (t.data_ptr() for t in packed.down)
                layer.n_experts, layer.top_k = len(moe.experts), moe.top_k
                layer.norm_topk, layer.moe_inter = int(moe.normalize), packed.n_gate_up // 2
            structs.append(layer)
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
        last = int(positions.max())
        tables = {kind: rope.cos_sin(last + 1, rope.use_long(last))
                  for kind, rope in self.ropes.items()}
        mask = None
        if attention_mask is not None:
            mask = attention_mask[:, : start + 1].to(torch.uint8).contiguous()
        layers = self._c_layers()
        if layers is not None:  # every layer in one C call
            x = x[:, 0].contiguous()
            kernel.decode_layers(x, layers, cache.k, cache.v, n_heads=self.n_heads,
                                 inter=self.inter, write=start, positions=positions,
                                 cos=[c for c, _ in tables.values()],
                                 sin=[s for _, s in tables.values()], mask=mask, eps=self.eps,
                                 shared=cache.shared)
            x = x[:, None]
        else:
            masks: dict[int | None, torch.Tensor | None] = {None: mask}
            nqk = (self.n_heads + self.n_kv) * self.head_dim
            for i, L in enumerate(self.layers):
                qkv = _norm_linear(x, L.ln1, self.eps, L.wqkv, L.bqkv)[:, 0].contiguous()
                if L.q_norm is not None:
                    qk = qkv[:, :nqk].view(B, self.n_heads + self.n_kv, self.head_dim)
                    qkv[:, :nqk] = self._qk_norm(qk, L).view(B, nqk)
                if L.window not in masks:
                    masks[L.window] = _window_mask(B, start, L.window, mask)
                cos, sin = tables[L.rope]
                o = kernel.attention(qkv, cache.k[i], cache.v[i], start, positions, cos, sin,
                                     masks[L.window], self.n_heads, cache.shared)
                x = self._after_attention(x, o[:, None], L)
        cache.length = start + 1
        return self._logits(x[:, -1])


C_ACTS = {"silu": 0, "gelu_tanh": 1}
"""The MLP activations ``decode.c`` computes (``Layer.act``); another keeps the Python loop."""


def _window_mask(batch: int, write: int, window: int | None,
                 mask: torch.Tensor | None) -> torch.Tensor | None:
    """The C attention's mask [B, write + 1] uint8 for a layer with this sliding window: the
    padding mask with slots older than the window cleared (None: every slot)."""
    lo = window_start(write, window)
    if lo == 0:
        return mask
    m = torch.ones((batch, write + 1), dtype=torch.uint8) if mask is None else mask.clone()
    m[:, :lo] = 0
    return m


class FastRunner:
    """``HFRunner``'s interface over ``FastLlama`` (the transformers model stays as ``model``
    for reference comparisons)."""

    name = "fast"

    def __init__(self, model: Any, *, dtype: torch.dtype | None = None, quantize: str = "none",
                 int8_weights: dict[str, Any] | None = None,
                 residual_dtype: torch.dtype | None = None, compile: str = "off",
                 compile_dir: Any = None) -> None:
        self.model = model
        self.device = model_device(model)
        model_dtype = next(model.parameters()).dtype
        if dtype is None:  # torch's int8 and int4 kernels want bf16 activations, chatui's fp32
            bf16 = quantize in ("int8", "int4") and not q8_available(self.device)
            dtype = torch.bfloat16 if bf16 and model_dtype == torch.float32 else model_dtype
        compiled = use_compile(compile, self.device)
        self.fast = FastLlama(model, dtype=dtype, quantize=quantize, int8_weights=int8_weights,
                              residual_dtype=residual_dtype, half_kv=not compiled)
        self.dtype = dtype
        self.int8_path: Any = None
        """Where the int8 weights are cached on disk (None when not quantized)."""
        self.decode: DecodeStep | None = None
        """The compiled (and on CUDA graph-captured) one-token step, when in use."""
        self.pending: Any = None
        """Another copy of the weights on its way (a ``runner.ResidentWeights``: its ``ready()``
        None until they are, then the weights by name), taken in at the next ``forward``."""
        if compiled and not self.fast.has_experts:
            # experts are chosen per token: no fixed-shape step (they decode eagerly)
            self.decode = DecodeStep(self.fast, compile=True, cache_dir=compile_dir)

    def new_cache(self) -> StaticKVCache:
        return self.fast.new_cache()

    def _adopt_pending(self) -> None:
        """The weights ``pending`` gives, once it gives them, in place of the runner's own (the
        same values: a forward before and one after give the same bits)."""
        weights = self.pending.ready()
        if weights is not None:
            self.pending = None
            self.fast.adopt(weights)

    def settle(self) -> None:
        """Wait for ``pending`` and take it in now (a benchmark times the steady state)."""
        if self.pending is not None:
            self.pending.wait()
            self._adopt_pending()

    def close(self) -> None:
        """Stop a copy of the weights still on its way (``ResidentWeights.close``); the runner
        goes on with its own."""
        if self.pending is not None:
            self.pending.close()
            self.pending = None

    @staticmethod
    def can_crop(cache: Any) -> bool:
        return True

    def forward(self, cache: StaticKVCache, input_ids: torch.Tensor, *,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, all_logits: bool = False,
                should_stop: Callable[[], bool] | None = None) -> torch.Tensor:
        if self.pending is not None:
            self._adopt_pending()
        if (self.decode is not None and input_ids.shape[1] == 1 and attention_mask is None
                and position_ids is None and not all_logits):
            return self.decode(cache, input_ids)
        return self.fast.forward(cache, input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, all_logits=all_logits,
                                 should_stop=should_stop)

    def weight_bytes(self) -> int:
        return self.fast.weight_bytes()
