"""What the fast decoder's architectures do differently from Llama, each in a small piece.

``fast_llama.FastLlama`` runs one decoder loop for every supported model type; this module
holds what that loop consults per architecture, read once from the loaded transformers model
(its config and its modules, never guessed from names alone):

* ``Arch``: the per-model switches (activation, Gemma's ``1 + weight`` norms and scaled
  embeddings, the attention scale, logit soft-capping, sliding windows per layer);
* ``RopeSpec`` / ``RotaryTables``: RoPE per layer kind (Gemma 3's local and global bases),
  partial rotary (Phi-3), LongRoPE's short and long factors;
* the attention masks with windows, attention with soft-capping (which SDPA cannot do);
* ``MoE``: a router's top-k experts, only the chosen experts computed (Mixtral, Qwen3-MoE).

Everything here is checked against transformers' own forward in ``tests/test_architectures.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

LLAMA_LIKE = ("llama", "mistral", "qwen2", "qwen3", "phi3")
GEMMA = ("gemma2", "gemma3_text")
MOE = ("mixtral", "qwen3_moe")
MULTIMODAL = {"gemma3": "gemma3_text"}
"""Multimodal model types whose text decoder the fast runner runs (for text-only prompts):
Gemma 3 4B and up are ``gemma3`` (a vision tower, then ``model.language_model``)."""
SUPPORTED_MODEL_TYPES = LLAMA_LIKE + GEMMA + MOE + tuple(MULTIMODAL)

ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
               "gelu_python_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
               "gelu_fast": "gelu_tanh", "gelu": "gelu"}
"""transformers' activation names -> the function the MLP gate uses (the tanh GELU variants
are one function up to rounding, as transformers' own docstrings say)."""

PARTIAL_ROTARY = ("phi3",)
"""Model types whose attention rotates only the first dims of a head (the rest pass through)."""


# ---- the per-model switches ----


@dataclass(frozen=True)
class Arch:
    """The ways one checkpoint's decoder differs from Llama's."""

    model_type: str
    act: str = "silu"
    """"silu", "gelu_tanh" or "gelu": the gate's activation (``act(gate) * up``)."""
    norm_offset: float = 0.0
    """Gemma's RMSNorms multiply by ``1 + weight`` (in fp32): the offset folded into weights."""
    embed_scale: float | None = None
    """Gemma multiplies embeddings by sqrt(hidden), rounded to the weights' dtype."""
    attn_scale: float | None = None
    """Scores' scale when it is not 1/sqrt(head_dim) (Gemma: query_pre_attn_scalar ** -0.5)."""
    attn_softcap: float | None = None
    """Gemma 2: scores = cap * tanh(scores / cap) before the mask and softmax."""
    final_softcap: float | None = None
    """Gemma 2 and 3: logits = cap * tanh(logits / cap)."""
    windows: tuple[int | None, ...] = ()
    """Per layer: keys older than this many positions (the query's own included) are hidden."""
    rope_kinds: tuple[str, ...] = ()
    """Per layer: which ``RopeSpec`` it uses (Gemma 3: "sliding_attention"/"full_attention")."""

    @property
    def act_fn(self) -> Callable[[torch.Tensor], torch.Tensor]:
        if self.act == "gelu_tanh":
            return lambda g: F.gelu(g, approximate="tanh")
        if self.act == "gelu":
            return F.gelu
        return F.silu


def _act_name(cfg: Any) -> str | None:
    name = getattr(cfg, "hidden_activation", None) or getattr(cfg, "hidden_act", "silu")
    return ACTIVATIONS.get(name) if isinstance(name, str) else None


def layer_window(cfg: Any, attention: Any) -> int | None:
    """The sliding window of one attention layer, as transformers applies it: the module's own
    ``sliding_window`` where it has one (Qwen2/3 and Gemma set it per layer type), else the
    config's for every layer (Mistral, Mixtral, Phi-3 build a windowed mask whenever
    ``config.sliding_window`` is set)."""
    if hasattr(attention, "sliding_window"):
        window = attention.sliding_window
    else:
        window = getattr(cfg, "sliding_window", None)
    return int(window) if window else None


def decoder(model: Any) -> tuple[Any, Any]:
    """(config, decoder module) of the model's text decoder: ``model.model`` and its config,
    or a multimodal model's language model and text config. Its ``layers``, ``embed_tokens``,
    ``norm`` and ``rotary_emb`` are what the fast runner reads; the output layer is always
    ``model.lm_head``."""
    cfg = model.config
    if getattr(cfg, "model_type", None) in MULTIMODAL:
        return cfg.get_text_config(), model.model.language_model
    return cfg, model.model


def read_arch(model: Any) -> Arch:
    """The switches of a supported model (see ``unsupported_reason`` first)."""
    cfg, stack = decoder(model)
    mt = cfg.model_type
    layers = stack.layers
    windows = tuple(layer_window(cfg, layer.self_attn) for layer in layers)
    if mt == "gemma3_text":
        kinds = tuple(cfg.layer_types[: len(layers)])
    else:
        kinds = ("default",) * len(layers)
    att = layers[0].self_attn
    head_dim = _head_dim(cfg)
    scale = float(getattr(att, "scaling", head_dim ** -0.5))
    emb = stack.embed_tokens
    embed_scale = None
    if getattr(emb, "embed_scale", None) is not None:
        embed_scale = float(torch.as_tensor(emb.embed_scale).to(emb.weight.dtype).float())
    return Arch(
        model_type=mt, act=_act_name(cfg) or "silu",
        norm_offset=1.0 if mt in GEMMA else 0.0,
        embed_scale=embed_scale,
        attn_scale=None if math.isclose(scale, head_dim ** -0.5, rel_tol=1e-7) else scale,
        # Gemma 3's config has attn_logit_softcapping but its attention never applies it
        attn_softcap=getattr(cfg, "attn_logit_softcapping", None) if mt == "gemma2" else None,
        # Gemma3ForConditionalGeneration's forward does not cap the logits its text model's does
        final_softcap=getattr(cfg, "final_logit_softcapping", None)
        if mt in GEMMA and model.config.model_type not in MULTIMODAL else None,
        windows=windows, rope_kinds=kinds)


def _head_dim(cfg: Any) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _rope_types(model: Any) -> dict[str, str]:
    """Each RoPE kind's rope_type (one kind, "default", except Gemma 3's per layer type)."""
    rot = decoder(model)[1].rotary_emb
    rope_type = getattr(rot, "rope_type", "default")
    if isinstance(rope_type, dict):
        return dict(rope_type)
    return {"default": rope_type}


def unsupported_reason(model: Any) -> str | None:
    """None when ``FastLlama`` can run this transformers model exactly, else why not."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return "no config"
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        return f"model type {mt!r} is not one the fast runner knows"
    if mt in MULTIMODAL:
        if not hasattr(getattr(model, "model", None), "language_model"):
            return "unexpected module layout"
        cfg = cfg.get_text_config()
        mt = cfg.model_type
    if _act_name(cfg) is None:
        return f"activation {getattr(cfg, 'hidden_activation', None) or cfg.hidden_act!r}"
    if len({p.device for p in model.parameters() if not p.is_meta}) > 1:  # meta: in the file
        return "model is sharded over several devices"
    inner = decoder(model)[1]
    layers = getattr(inner, "layers", None)
    if (layers is None or not hasattr(inner, "embed_tokens") or not hasattr(model, "lm_head")
            or not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm")):
        return "unexpected module layout"
    for kind, rope_type in _rope_types(model).items():
        if rope_type not in ("default", "linear", "llama3", "longrope", "yarn"):
            return f"RoPE scaling {rope_type!r}"
        if rope_type == "longrope" and mt not in PARTIAL_ROTARY:
            return "LongRoPE outside Phi-3"
    rotated = {2 * spec.inv_freq.numel() for spec in rope_specs(model).values()}
    if len(rotated) != 1 or (rotated != {_head_dim(cfg)} and mt not in PARTIAL_ROTARY):
        return "partial rotary embeddings"
    if getattr(cfg, "use_bidirectional_attention", False):
        return "bidirectional attention"
    if mt not in ("qwen2", "qwen3", "gemma2", "gemma3_text") and any(
            t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return "non-full attention layers"
    for layer in layers:
        reason = _layer_reason(mt, layer)
        if reason:
            return reason
    return None


def _layer_reason(mt: str, layer: Any) -> str | None:
    att, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if att is None or mlp is None:
        return "unexpected attention layout"
    fused = hasattr(att, "qkv_proj")
    if not (fused or all(hasattr(att, n) for n in ("q_proj", "k_proj", "v_proj"))) \
            or not hasattr(att, "o_proj"):
        return "unexpected attention layout"
    if hasattr(att, "q_norm") != (mt in ("qwen3", "qwen3_moe", "gemma3_text")):
        return "unexpected attention layout"
    if hasattr(mlp, "experts"):
        if mt not in MOE or not hasattr(mlp, "gate") or hasattr(mlp, "shared_expert"):
            return "unexpected mixture-of-experts layout"
        experts = mlp.experts
        if not (hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj")
                and getattr(experts.gate_up_proj, "dim", lambda: 0)() == 3):
            return "unexpected mixture-of-experts layout"
    elif not (hasattr(mlp, "gate_up_proj") or all(hasattr(mlp, n) for n in ("gate_proj",
                                                                              "up_proj"))) \
            or not hasattr(mlp, "down_proj"):
        return "unexpected MLP layout"
    norms = ("input_layernorm", "post_attention_layernorm")
    if mt in GEMMA:
        norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
    if not all(hasattr(layer, n) for n in norms):
        return "unexpected norm layout"
    return None


def norm_weight(module: Any, offset: float, dtype: torch.dtype) -> torch.Tensor:
    """An RMSNorm's weight as ``F.rms_norm`` takes it: Gemma's ``1 + weight`` computed in fp32
    (as its norm does) before the cast."""
    return (module.weight.detach().float() + offset).to(dtype)


# ---- RoPE ----


@dataclass
class RopeSpec:
    """One RoPE kind: inverse frequencies of the rotated pairs and the scale of cos and sin.

    LongRoPE has two sets: transformers uses the long one for a whole forward whose last
    position is beyond ``long_after`` (the original context), else the short one, and never
    recomputes cached keys; ``long_inv_freq`` is None for other kinds.
    """

    inv_freq: torch.Tensor  # [R/2] fp32, R = rotated dims of a head
    scale: float
    long_inv_freq: torch.Tensor | None = None
    long_after: int | None = None


def rope_specs(model: Any) -> dict[str, RopeSpec]:
    """Each RoPE kind's frequencies recomputed in fp32 from the config, the way the model's own
    rotary module computes them (its buffer is rounded when a model is cast to bf16)."""
    cfg, stack = decoder(model)
    rot = stack.rotary_emb
    out: dict[str, RopeSpec] = {}
    for kind, rope_type in _rope_types(model).items():
        kw = {} if kind == "default" else {"layer_type": kind}
        try:
            if rope_type == "default":
                fn = type(rot).compute_default_rope_parameters
            else:
                from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

                fn = ROPE_INIT_FUNCTIONS[rope_type]
            inv_freq, scale = fn(cfg, **kw)
            spec = RopeSpec(inv_freq.float().cpu(), float(scale))
            if rope_type == "longrope":
                params = cfg.rope_parameters if kind == "default" else cfg.rope_parameters[kind]
                after = int(params["original_max_position_embeddings"])
                long_freq, _ = fn(cfg, None, seq_len=after + 1, **kw)
                spec.long_inv_freq, spec.long_after = long_freq.float().cpu(), after
        except Exception:  # noqa: BLE001 - an unusual rotary module: trust its buffer
            prefix = "" if kind == "default" else f"{kind}_"
            buf = getattr(rot, f"{prefix}inv_freq")
            scale = getattr(rot, f"{prefix}attention_scaling", 1.0)
            spec = RopeSpec(buf.detach().float().cpu(), float(scale))
        out[kind] = spec
    return out


class RotaryTables:
    """scale * exp(i * pos * inv_freq) per position for one ``RopeSpec``, grown on demand.

    A head's D dims are D/2 complex pairs; pairs past the rotated ones (partial rotary) get
    angle 0 and magnitude 1, so every path multiplies all D/2 pairs alike.
    """

    def __init__(self, spec: RopeSpec, head_dim: int, device: torch.device) -> None:
        half = head_dim // 2
        self.spec = spec
        self.device = device
        self.rotated_pairs = spec.inv_freq.numel()
        pad = half - self.rotated_pairs
        self._freqs = {False: F.pad(spec.inv_freq, (0, pad)).to(device)}
        if spec.long_inv_freq is not None:
            self._freqs[True] = F.pad(spec.long_inv_freq, (0, pad)).to(device)
        self._mag = torch.cat([torch.full((self.rotated_pairs,), spec.scale),
                               torch.ones(pad)]).to(device)
        self._tables: dict[bool, torch.Tensor] = {}
        self._cos_sin: dict[bool, tuple[torch.Tensor, torch.Tensor]] = {}

    def use_long(self, last_position: int) -> bool:
        """Whether a forward whose largest position is ``last_position`` uses the long
        factors (transformers' choice: its sequence length then exceeds the original)."""
        after = self.spec.long_after
        return after is not None and last_position + 1 > after

    def table(self, n: int, long: bool = False) -> torch.Tensor:
        """[>= n, D/2] complex64."""
        t = self._tables.get(long)
        if t is None or t.shape[0] < n:
            size = max(n, 2 * (0 if t is None else t.shape[0]), 1024)
            pos = torch.arange(size, device=self.device, dtype=torch.float32)
            angles = pos[:, None] * self._freqs[long][None, :]
            t = self._tables[long] = torch.polar(self._mag.expand_as(angles).contiguous(), angles)
            self._cos_sin.pop(long, None)
        return t

    def cos_sin(self, n: int, long: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) x scale, [>= n, D/2] fp32 each, contiguous (the C kernel's tables)."""
        table = self.table(n, long)
        if long not in self._cos_sin:
            self._cos_sin[long] = (table.real.contiguous(), table.imag.contiguous())
        return self._cos_sin[long]

    def step_table(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [n, D/2] for one token per forward: the row of position p is the table a
        one-token forward at p uses (LongRoPE: long from the original context on)."""
        cos, sin = self.cos_sin(n)
        cos, sin = cos[:n], sin[:n]
        after = self.spec.long_after
        if after is not None and n > after:
            lc, ls = self.cos_sin(n, True)
            cos = torch.cat([cos[:after], lc[after:n]])
            sin = torch.cat([sin[:after], ls[after:n]])
        return cos, sin


def interleave_index(n_heads: int, head_dim: int, rotated: int) -> torch.Tensor:
    """Row order that turns each head's rotate-half pairs (i, i + R/2) over its first R dims
    into adjacent pairs (2i, 2i + 1), so RoPE becomes a complex multiply; dims past R (partial
    rotary) keep their order and pair up unrotated. q.k is unchanged when q and k are
    permuted alike."""
    half = rotated // 2
    perm = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).reshape(-1)
    perm = torch.cat([perm, torch.arange(rotated, head_dim)])
    return (torch.arange(n_heads)[:, None] * head_dim + perm[None, :]).reshape(-1)


# ---- attention ----


def causal_mask(start: int, end: int, lo: int, attention_mask: torch.Tensor | None,
                window: int | None, device: torch.device) -> torch.Tensor:
    """Which keys (slots lo..end-1) the queries at slots start..end-1 see: [B or 1, 1, T, S]
    bool. Causal; within ``window`` slots (the query's own included) as transformers' sliding
    mask; padding hidden, though a position always sees itself (a padded row stays finite)."""
    q_pos = torch.arange(start, end, device=device)[:, None]
    k_pos = torch.arange(lo, end, device=device)[None, :]
    m = k_pos <= q_pos
    if window is not None:
        m = m & (k_pos > q_pos - window)
    m = m[None]  # [1, T, S]
    if attention_mask is not None:
        m = (m & attention_mask[:, None, lo:end].bool()) | (k_pos == q_pos)[None]
    return m[:, None]


def window_start(start: int, window: int | None) -> int:
    """The first key slot any query from ``start`` on can see."""
    return 0 if window is None else max(0, start - window + 1)


def softcap_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                      mask: torch.Tensor | None, scale: float, cap: float) -> torch.Tensor:
    """Gemma 2's attention: scores capped by ``cap * tanh(scores / cap)`` before masking (SDPA
    has no such step). q [B, H, T, D], keys/values [B, KV, S, D], mask [., 1, T, S] bool."""
    groups = q.shape[1] // keys.shape[1]
    if groups > 1:
        keys = keys.repeat_interleave(groups, dim=1)
        values = values.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, keys.transpose(2, 3)) * scale
    scores = torch.tanh(scores / cap) * cap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, values)


# ---- mixture of experts ----


@dataclass
class MoE:
    """A sparse MLP: a router picks ``top_k`` experts per token, weighted by their softmax
    probabilities (renormalised over the chosen ones when ``normalize``), and only those
    experts' weights are read."""

    router: torch.Tensor  # [E, hidden], the model's dtype (small; kept exact)
    top_k: int
    normalize: bool
    experts: list[tuple[Any, Any]] = field(default_factory=list)  # (gate_up, down) weights
    kernel_experts: Any = None
    """(the ``experts`` list it was built for, ``quant.PackedExperts`` or None): the one-call
    kernel path of a decode step, set by the runner (rebuilt when ``experts`` is replaced)."""

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, hidden] -> (weights [N, k] fp32, expert ids [N, k]), as transformers routes:
        softmax in fp32 over the router's logits, top-k, then the optional renormalisation."""
        logits = F.linear(x.to(self.router.dtype), self.router)
        probs = torch.softmax(logits.float(), dim=-1)
        weights, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(logits.dtype).float(), ids

    def forward(self, x: torch.Tensor,
                expert: Callable[[torch.Tensor, Any, Any], torch.Tensor]) -> torch.Tensor:
        """x [N, hidden] (normed) -> [N, hidden] fp32; ``expert(x, gate_up, down)`` runs one
        expert's MLP. Tokens are grouped by expert, so each chosen expert runs once."""
        weights, ids = self.route(x)
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        if x.shape[0] == 1:  # decode: the k experts of one token, no grouping to do
            for slot, e in enumerate(ids[0].tolist()):
                y = expert(x, *self.experts[e]).float()
                out += y * weights[0, slot]
            return out
        for e in torch.unique(ids).tolist():
            rows, slots = torch.where(ids == e)
            y = expert(x[rows], *self.experts[e]).float()
            out.index_add_(0, rows, y * weights[rows, slots, None])
        return out
