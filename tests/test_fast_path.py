"""The fast runner against the transformers runner: same logits in fp32, the same engine
behaviour (greedy tokens, logprobs, batches, prefix reuse, cancel), the KV cache operations,
and int8 against the same math with dequantized weights."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

from conftest import skip_unless_ci
from inference import engine as engine_module
from inference import q8kernel
from inference.engine import LocalBackend
from inference.fast_llama import FastLlama, FastRunner, unsupported_reason
from inference.kv_cache import CACHE_BLOCK, StaticKVCache
from inference.quant import Int4Weight, Int8Weight, Q4Weight, Q8Weight
from inference.runner import HFRunner, RunnerError, build_runner
from inference.settings import SamplingParams
from inference.types import GenerationRequest, Message, RowDone, Started, TokenBatch

GREEDY = SamplingParams(temperature=0, max_new_tokens=24)
MSGS = (Message("system", "You are terse."), Message("user", "List three colours."))


def run(backend, messages=MSGS, *settings, k=5, cancel=None):
    req = GenerationRequest(tuple(messages), settings or (GREEDY,), top_logprobs=k)
    return list(backend.generate(req, cancel or threading.Event()))


def tokens(events, row=0):
    return [t for e in events if isinstance(e, TokenBatch) and e.row == row for t in e.tokens]


def backends(ckpt):
    return (LocalBackend.from_checkpoint(ckpt, runner="hf"),
            LocalBackend.from_checkpoint(ckpt, runner="fast"))


def assert_same_tokens(a, b, abs_tol=1e-4):
    """Same ids; logprobs and entropy within abs_tol; alternatives with the same logprobs
    (their order may differ only between near-ties)."""
    assert [t.id for t in a] == [t.id for t in b]
    for x, y in zip(a, b):
        assert x.logprob == pytest.approx(y.logprob, abs=abs_tol)
        assert x.entropy == pytest.approx(y.entropy, abs=10 * abs_tol)
        assert [p.logprob for p in x.top] == pytest.approx([p.logprob for p in y.top], abs=abs_tol)
        if abs_tol <= 1e-4:
            assert [p.id for p in x.top] == [p.id for p in y.top]


def test_auto_picks_fast_and_env_forces_transformers(tiny_ckpt, monkeypatch):
    assert unsupported_reason(tiny_ckpt.model) is None
    assert isinstance(LocalBackend.from_checkpoint(tiny_ckpt).runner, FastRunner)
    monkeypatch.setenv("CHATUI_RUNNER", "hf")
    assert isinstance(LocalBackend.from_checkpoint(tiny_ckpt).runner, HFRunner)
    # int8 then runs on transformers' Linear layers (tests/test_architectures.py); int4 cannot
    with pytest.raises(RunnerError, match="fast runner") as e:
        LocalBackend.from_checkpoint(tiny_ckpt, quantize="int4")
    assert e.value.user_message.endswith("use --quantize int8 or none.")  # without traceback


def test_unsupported_model_falls_back():
    class Cfg:
        model_type = "gpt2"

    class M:
        config = Cfg()

    assert "gpt2" in unsupported_reason(M())


def test_logits_equal_transformers_prefill_decode_and_padding(tiny_ckpt):
    hf, fast = HFRunner(tiny_ckpt.model), FastRunner(tiny_ckpt.model)
    torch.manual_seed(0)
    ids = torch.randint(3, 1000, (1, 37))
    ch, cf = hf.new_cache(), fast.new_cache()
    for chunk in (ids[:, :20], ids[:, 20:36], ids[:, 36:]):  # prefill with a past, then decode
        a, b = hf.forward(ch, chunk), fast.forward(cf, chunk)
        assert torch.allclose(a, b, atol=1e-4), (a - b).abs().max()
    # left-padded batch with attention mask and position ids, then two decode steps
    x = torch.randint(3, 1000, (3, 12))
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    mask[2, :9] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ch, cf = hf.new_cache(), fast.new_cache()
    a = hf.forward(ch, x, attention_mask=mask, position_ids=pos)
    b = fast.forward(cf, x, attention_mask=mask, position_ids=pos)
    assert torch.allclose(a, b, atol=1e-4)
    nxt = pos[:, -1:] + 1
    for _ in range(2):
        step = a.argmax(-1)[:, None]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
        a = hf.forward(ch, step, attention_mask=mask, position_ids=nxt)
        b = fast.forward(cf, step, attention_mask=mask, position_ids=nxt)
        assert torch.allclose(a, b, atol=1e-4)
        nxt = nxt + 1


def decode_both_ways(run_a, run_b, new_cache, x, pad_row, pad, first_step, *, atol, cache_atol):
    """Prefill a left-padded batch x (row ``pad_row`` padded by ``pad``) through two forwards
    ``run(cache, ids, **kw)``, then decode 3 steps; logits and caches must agree."""
    mask = torch.ones_like(x)
    mask[pad_row, :pad] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    caches = [new_cache(), new_cache()]
    for run, c in zip((run_a, run_b), caches):
        run(c, x, attention_mask=mask, position_ids=pos)
    nxt, step = pos[:, -1:] + 1, first_step
    for _ in range(3):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
        a = run_a(caches[0], step, attention_mask=mask, position_ids=nxt)
        b = run_b(caches[1], step, attention_mask=mask, position_ids=nxt)
        assert torch.allclose(a, b, atol=atol), (a - b).abs().max()
        for ta, tb in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
            n = caches[0].length
            assert torch.allclose(ta[:, :, :n], tb[:, :, :n], atol=cache_atol)
        step, nxt = b.argmax(-1)[:, None], nxt + 1


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_c_attention_equals_torch_attention_across_chunks(head_dim, kv_dtype, kernel):
    """The C decode attention (fp32 on a CPU where the kernels build) against the SDPA path,
    past 256 keys (its chunk size, where partial softmaxes are combined) and with padding;
    head sizes 64 and 128 have their own vector code. With an fp16 cache (int8 and int4
    decoding) both read the same fp16 values; the C kernel rotates a new key in fp32 and
    rounds it once, as the SDPA path's store does (a key can land one fp16 step apart)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(9)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=1000, hidden_size=4 * head_dim, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024))
    fast = FastRunner(model).fast
    assert fast.c_attention and fast.kv_dtype == torch.float32  # (unquantized: exact)
    fast.kv_dtype = kv_dtype
    assert fast.new_cache().k[0].dtype == kv_dtype

    def attention(on):
        def run(cache, ids, **kw):
            fast.c_attention = on
            return fast.forward(cache, ids, **kw)
        return run

    torch.manual_seed(6)
    try:
        decode_both_ways(attention(True), attention(False), fast.new_cache,
                         torch.randint(3, 1000, (2, 300)), 1, 40, torch.tensor([[7], [9]]),
                         atol=1e-4 if kv_dtype == torch.float32 else 2e-3,
                         cache_atol=1e-5 if kv_dtype == torch.float32 else 2e-3)
    finally:
        fast.c_attention = True


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_all_layers_in_one_c_call_equal_the_python_loop(model_type, kernel):
    """int8 decode runs every layer in one C call (decode.c); the same kernels called layer by
    layer from Python give the same logits and cache: a left-padded batch, biases (qwen2)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls, cfg = ((LlamaForCausalLM, LlamaConfig) if model_type == "llama"
                else (Qwen2ForCausalLM, Qwen2Config))
    torch.manual_seed(7)
    model = cls(cfg(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512))
    fast = FastRunner(model, quantize="int8").fast
    assert fast._c_layers() is not None
    if model_type == "qwen2":
        assert fast.layers[0].bqkv is not None
    python_loop = copy.copy(fast)
    python_loop._c_layers_of, python_loop._c_layer_array = python_loop.layers, ()
    decode_both_ways(fast.forward, python_loop.forward, fast.new_cache,
                     torch.randint(3, 300, (2, 9)), 0, 4, torch.tensor([[5], [6]]),
                     atol=1e-5, cache_atol=0)


def test_cache_operations_match_fresh_prefills(tiny_ckpt):
    fast = FastRunner(tiny_ckpt.model)
    ids = torch.randint(3, 1000, (1, 300))  # grows past one capacity block
    cache = fast.new_cache()
    full = fast.forward(cache, ids)
    assert cache.get_seq_length() == 300 and cache.capacity >= 300
    # crop back and refeed == fresh
    cache.crop(-50)
    assert cache.get_seq_length() == 250
    again = fast.forward(cache, ids[:, 250:])
    assert torch.allclose(full, again, atol=1e-5)
    # branch: deepcopy + repeat, then select keeps the right rows
    branch = copy.deepcopy(cache)
    branch.batch_repeat_interleave(3)
    assert branch.batch == 3 and cache.batch == 1
    step = torch.tensor([[7], [8], [9]])
    out = fast.forward(branch, step)
    for r in range(3):
        single = copy.deepcopy(cache)
        assert torch.allclose(out[r], fast.forward(single, step[r:r + 1])[0], atol=1e-5)
    branch.batch_select_indices(torch.tensor([2]))
    single = copy.deepcopy(cache)
    fast.forward(single, step[2:])
    assert torch.allclose(fast.forward(branch, torch.tensor([[5]])),
                          fast.forward(single, torch.tensor([[5]])), atol=1e-5)


def test_static_cache_refuses_a_different_batch_once_filled():
    c = StaticKVCache(2, 2, 8, dtype=torch.float32, device=torch.device("cpu"))
    c.reserve(4, 3)
    assert c.batch == 3
    c.length = 4
    with pytest.raises(ValueError):
        c.reserve(5, 1)


@pytest.mark.parametrize("settings", [
    (GREEDY,),
    (SamplingParams(temperature=1.0, seed=5, max_new_tokens=16),),
    (GREEDY, SamplingParams(temperature=0.9, top_k=40, seed=3, max_new_tokens=12),
     SamplingParams(temperature=0, max_new_tokens=6, repetition_penalty=1.3)),
])
def test_engine_same_events_on_both_runners(tiny_ckpt, settings):
    hf, fast = backends(tiny_ckpt)
    a, b = run(hf, MSGS, *settings), run(fast, MSGS, *settings)
    for r in range(len(settings)):
        assert_same_tokens(tokens(a, r), tokens(b, r))


def test_prefix_reuse_and_batches_same_on_both_runners(tiny_ckpt):
    hf, fast = backends(tiny_ckpt)
    convo = [Message("user", "Write a sentence.")]
    for b in (hf, fast):
        first = run(b, convo)
        text = next(e for e in first if isinstance(e, RowDone)).text
        follow = convo + [Message("assistant", text), Message("user", "Another.")]
        ev = run(b, follow)
        b.result = (tokens(first), tokens(ev), ev[0].cached_tokens)
    assert hf.result[2] == fast.result[2] > 0
    assert_same_tokens(hf.result[0], fast.result[0])
    assert_same_tokens(hf.result[1], fast.result[1])
    reqs = [GenerationRequest((Message("user", m),), (GREEDY,), 3)
            for m in ("Hi", "A much longer question about the sea and the sky?", "Ok")]
    a = list(hf.generate_batch(reqs, threading.Event()))
    c = list(fast.generate_batch(reqs, threading.Event()))
    for r in range(3):
        assert_same_tokens(tokens(a, r), tokens(c, r))


def test_cancel_on_fast_path(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt, runner="fast")
    cancel = threading.Event()
    out = []
    long = SamplingParams(temperature=0, max_new_tokens=200)
    for ev in backend.generate(GenerationRequest(MSGS, (long,), 5), cancel):
        out.append(ev)
        if sum(len(e.tokens) for e in out if isinstance(e, TokenBatch)) >= 3:
            cancel.set()
    done = next(e for e in out if isinstance(e, RowDone))
    assert done.finish_reason == "cancelled" and done.usage.completion_tokens < 10
    # the backend stays usable, its cache consistent with a fresh one
    fresh = LocalBackend.from_checkpoint(tiny_ckpt, runner="fast")
    assert_same_tokens(tokens(run(backend)), tokens(run(fresh)))


def dequantized_twin(runner: FastRunner) -> FastRunner:
    """The same runner with every quantized weight replaced by its dequantized tensor (in the
    runner's matmul dtype)."""
    twin = copy.copy(runner)
    fast = copy.copy(runner.fast)
    deq = lambda w: (w.dequantize(fast.dtype)  # noqa: E731
                     if isinstance(w, (Int8Weight, Int4Weight, Q8Weight, Q4Weight)) else w)
    fast.layers = [copy.copy(L) for L in fast.layers]
    for L in fast.layers:
        L.wqkv, L.wo, L.wgu, L.wd = deq(L.wqkv), deq(L.wo), deq(L.wgu), deq(L.wd)
    fast.lm_head = deq(fast.lm_head)
    fast.quantize = "none"
    twin.fast = fast
    return twin


@pytest.mark.parametrize("kind", ["int8", "int8-per-channel", "int4", "int4-no-kernel"])
def test_quantized_same_tokens_as_eager_same_precision(tiny_ckpt, tmp_path, monkeypatch, kind):
    """int8 runs chatui's group-wise kernel (8-bit activations) where it builds, as here;
    "int8-per-channel" is the fallback elsewhere (torch's kernel, bf16 activations); "int4" runs
    chatui's int4 kernel (``Q4Weight``, int8 activations), "int4-no-kernel" torch's. Each kind
    names which path it tests, so every machine tests both (no branch on the machine)."""
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    q8 = kind in ("int8", "int4")
    if not q8:
        monkeypatch.setattr(q8kernel, "load_kernel", lambda: None)
    elif q8kernel.load_kernel() is None:
        skip_unless_ci("chatui's kernels do not build on this machine")
    quantize = kind.split("-")[0]
    runner = build_runner(tiny_ckpt, quantize=quantize, precision="auto")
    assert isinstance(runner.fast, FastLlama)
    assert isinstance(runner.fast.lm_head, Q8Weight if q8 else Int8Weight)
    if kind == "int4":
        assert isinstance(runner.fast.layers[0].wgu, Q4Weight)
    elif kind == "int4-no-kernel":
        assert isinstance(runner.fast.layers[0].wgu, Int4Weight)
    elif kind == "int8" and q8:
        assert isinstance(runner.fast.layers[0].wgu, Q8Weight)
    twin = dequantized_twin(runner)
    ids = torch.randint(3, 1000, (1, 40))
    a, b = runner.forward(runner.new_cache(), ids), twin.forward(twin.new_cache(), ids)
    # bf16 activations, or chatui's kernels' 8-bit ones (int8 and int4): a few bf16 ulps
    tol = 0.05
    assert torch.allclose(a, b, atol=tol * b.abs().max().item())
    q = LocalBackend.from_checkpoint(tiny_ckpt, quantize=quantize, precision="auto")
    e = LocalBackend.from_checkpoint(tiny_ckpt, precision="auto")
    e.runner = twin
    for settings in ((GREEDY,), (GREEDY, GREEDY.with_values(max_tokens=10))):
        assert_same_tokens(tokens(run(q, MSGS, *settings)), tokens(run(e, MSGS, *settings)),
                           abs_tol=tol)
    dtype = "float32" if q8 else "bfloat16"  # chatui's kernels take fp32 activations
    assert q.info.quantization == quantize and q.info.dtype == dtype


def test_auto_quantization_is_int8_on_a_cpu_with_the_kernel(tiny_ckpt, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path))
    if q8kernel.load_kernel() is None:
        skip_unless_ci("chatui's kernels do not build on this machine")
    auto = LocalBackend.from_checkpoint(tiny_ckpt, quantize="auto", precision="auto")
    assert auto.info.quantization == "int8"
    # a precision the user chose is kept exactly
    exact = LocalBackend.from_checkpoint(tiny_ckpt, quantize="auto", precision="model")
    assert exact.info.quantization == "none" and exact.info.dtype == "float32"
    monkeypatch.setattr(q8kernel, "load_kernel", lambda: None)
    assert LocalBackend.from_checkpoint(tiny_ckpt, quantize="auto",
                                        precision="auto").info.quantization == "none"


def test_rope_frequencies_stay_fp32_for_a_bf16_model(tiny_ckpt):
    bf16 = copy.deepcopy(tiny_ckpt.model).to(torch.bfloat16)
    assert bf16.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    fast = FastLlama(bf16, dtype=torch.bfloat16)
    ref = FastLlama(tiny_ckpt.model, dtype=torch.float32)
    spec, ref_spec = fast.ropes["default"].spec, ref.ropes["default"].spec
    assert spec.inv_freq.dtype == torch.float32
    assert torch.allclose(spec.inv_freq, ref_spec.inv_freq) and spec.scale == ref_spec.scale



@pytest.mark.parametrize("B", [1, 3])
def test_c_attention_does_not_depend_on_the_threads(B, kernel):
    """The C attention hands each thread one contiguous range of (row, KV head, chunk) tasks and
    fetches the next one's keys and values ahead: with 2, 3, 5 and 16 threads (more than the
    tasks), past a 256-key chunk, with a shared prefix, every output and cache write is bit for
    bit one thread's."""
    KV, H, D, C, shared, write = 2, 6, 64, 320, 200, 290
    torch.manual_seed(12)
    kc, vc = torch.randn(B, KV, C, D).half(), torch.randn(B, KV, C, D).half()
    kc[:, :, :shared], vc[:, :, :shared] = kc[:1, :, :shared], vc[:1, :, :shared]
    qkv = torch.randn(B, (H + 2 * KV) * D)
    pos = torch.full((B,), write)
    cos, sin = torch.randn(C, D // 2), torch.randn(C, D // 2)

    def attend():
        k, v = kc.clone(), vc.clone()
        out = kernel.attention(qkv, k, v, write, pos, cos, sin, None, H, shared if B > 1 else 0)
        return out, k, v

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = attend()
        for threads in (2, 3, 5, 16):
            torch.set_num_threads(threads)
            for got, ref in zip(attend(), alone):
                assert torch.equal(got, ref), threads
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_c_attention_of_a_left_padded_row_is_the_row_alone(kv_dtype, kernel):
    """A row of ``chatui batch``, left-padded by 1, 37 or 300 slots (more than a 256-key
    chunk), gives bit for bit what the same keys give unpadded and unmasked (``chatui
    generate``), past a chunk boundary of its own: each masked row's chunks and lanes begin
    at its first attended key. They began at slot 0, so padding moved every key to another
    lane and chunk, and int8 turned that rounding into other replies at temperature 0."""
    KV, H, D, n = 3, 9, 64, 290
    torch.manual_seed(21)
    keys, values = torch.randn(1, KV, n, D).to(kv_dtype), torch.randn(1, KV, n, D).to(kv_dtype)
    row = torch.randn(1, (H + 2 * KV) * D)
    cos, sin = torch.randn(700, D // 2), torch.randn(700, D // 2)
    pos = torch.tensor([n - 1])

    def alone():
        k, v = keys.clone(), values.clone()
        return kernel.attention(row, k, v, n - 1, pos, cos, sin, None, H), k, v

    ref, k_ref, v_ref = alone()
    for pad in (1, 37, 300):
        C = pad + n
        k, v = torch.randn(2, KV, C, D).to(kv_dtype), torch.randn(2, KV, C, D).to(kv_dtype)
        k[1, :, pad:], v[1, :, pad:] = keys[0], values[0]
        mask = torch.ones(2, C, dtype=torch.uint8)
        mask[1, :pad] = 0
        qkv = torch.cat([torch.randn(1, (H + 2 * KV) * D), row])
        out = kernel.attention(qkv, k, v, C - 1, torch.tensor([C - 1, n - 1]), cos, sin, mask,
                               H)
        assert torch.equal(out[1], ref[0]), pad
        assert torch.equal(k[1, :, pad:], k_ref[0]) and torch.equal(v[1, :, pad:], v_ref[0])


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("masked, H, B", [(False, 4, 3), (True, 4, 3), (False, 9, 3),
                                          (True, 16, 3), (False, 9, 8), (False, 4, 5)])
def test_c_attention_reads_shared_positions_once_with_the_same_result(masked, H, B, kv_dtype,
                                                                      kernel):
    """Rows repeated from one prefill (compare, fan-out) hold the same keys and values up to
    ``shared``; the C attention reads those from row 0 for every row. The result is bit for bit
    that of reading each row's own copy (here past a 256-key chunk boundary, with a mask, 2, 3
    and 8 query heads a KV head, fp32 and fp16 caches, 3 to 8 rows split between the threads),
    a row's copies are not read at all (poisoned with NaN, nothing changes), and it is the
    float64 softmax's."""
    KV, D, C, shared, write = 2, 64, 320, 270, 290
    if H == 9:
        KV = 3
    torch.manual_seed(11)
    kc = torch.randn(1, KV, C, D).repeat(B, 1, 1, 1).to(kv_dtype)
    vc = torch.randn(1, KV, C, D).repeat(B, 1, 1, 1).to(kv_dtype)
    kc[:, :, shared:], vc[:, :, shared:] = torch.randn(B, KV, C - shared, D), torch.randn(
        B, KV, C - shared, D)
    qkv = torch.randn(B, (H + 2 * KV) * D)
    pos = torch.full((B,), write)
    cos, sin = torch.randn(C, D // 2), torch.randn(C, D // 2)
    mask = None
    if masked:
        mask = (torch.rand(B, write + 1) > 0.2).to(torch.uint8)
        mask[:, :shared] = mask[0, :shared]

    def attend(k, v, n):
        return kernel.attention(qkv, k.clone(), v.clone(), write, pos, cos, sin, mask, H, n)

    own = attend(kc, vc, 0)
    assert torch.equal(attend(kc, vc, shared), own)
    k_new, v_new = kc.clone(), vc.clone()
    kernel.attention(qkv, k_new, v_new, write, pos, cos, sin, mask, H, 0)
    for b in range(B):  # against float64, with the keys as the kernel rotated and wrote them
        q = qkv[b, :H * D].view(H, D // 2, 2).double()
        c, s_ = cos[write].double(), sin[write].double()
        q = torch.stack([q[..., 0] * c - q[..., 1] * s_, q[..., 0] * s_ + q[..., 1] * c], -1)
        keys = k_new[b, :, :write + 1].double().repeat_interleave(H // KV, 0)
        values = v_new[b, :, :write + 1].double().repeat_interleave(H // KV, 0)
        scores = (keys @ q.view(H, D, 1))[..., 0] / D ** 0.5
        if mask is not None:
            keep = mask[b].bool().clone()
            keep[write] = True
            scores[:, ~keep] = float("-inf")
        ref = (torch.softmax(scores, -1)[:, None, :] @ values)[:, 0].reshape(-1)
        assert (own[b].double() - ref).abs().max() <= 1e-5
    kc[1:, :, :shared], vc[1:, :, :shared] = float("nan"), float("nan")
    assert torch.equal(attend(kc, vc, shared), own)
    assert attend(kc, vc, 0)[1:].isnan().all()


def test_repeated_cache_is_the_copy_and_repeat_with_room_to_grow(tiny_ckpt):
    """``StaticKVCache.repeated(n, room)`` (what a comparison's or fan-out's rows start from)
    holds what ``copy.deepcopy`` and ``batch_repeat_interleave(n)`` give, with capacity for
    ``room`` positions from the start (no growing copy while decoding), and leaves the
    conversation's cache as it was; rows made from several rows repeat each in turn."""
    fast = FastRunner(tiny_ckpt.model, quantize="int8")
    cache = fast.new_cache()
    fast.forward(cache, torch.randint(3, 1000, (1, 40)))
    before = copy.deepcopy(cache)
    ref = copy.deepcopy(cache)
    ref.batch_repeat_interleave(3)
    got = cache.repeated(3, room=40 + 300)
    assert got.capacity >= 340 and got.capacity % CACHE_BLOCK == 0 and got.batch == 3
    assert (got.length, got.shared) == (ref.length, ref.shared) == (40, 40)
    for a, b, c, d in zip(got.k + got.v, ref.k + ref.v, cache.k + cache.v, before.k + before.v):
        assert torch.equal(a[:, :, :40], b[:, :, :40]) and not a[:, :, 40:].any()
        assert torch.equal(c, d)  # the source untouched
    capacity = got.capacity
    steps = torch.tensor([[7], [8], [9]])
    for _ in range(3):
        assert torch.equal(fast.forward(got, steps), fast.forward(ref, steps))
    assert got.capacity == capacity
    # several rows: row i becomes rows i*n .. i*n + n - 1; nothing is shared across them
    two = ref.repeated(2, room=0)
    assert two.batch == 6 and two.shared == ref.shared and two.capacity == ref.capacity
    for a, b in zip(two.k, ref.k):
        assert torch.equal(a[:, :, :ref.length], b.repeat_interleave(2, 0)[:, :, :ref.length])


def test_a_repeat_decodes_in_the_memory_of_an_earlier_one(tiny_ckpt):
    """``repeated(n, room, pool)`` takes the tensors of ``pool`` (an earlier repeat's
    ``memory()``) when they have the rows and capacity: no fresh memory to fault in, and the
    same logits as a fresh repeat, though the pool's positions past the prefix hold another
    reply's values (here NaN: never read before they are written), with as many rows or
    fewer; a pool too small is not used."""
    fast = FastRunner(tiny_ckpt.model, quantize="int8")
    cache = fast.new_cache()
    fast.forward(cache, torch.randint(3, 1000, (1, 40)))
    first = cache.repeated(3, room=340)
    pool = first.memory()
    with torch.inference_mode():
        for t in pool.k + pool.v:
            t.fill_(float("nan"))  # what an earlier reply left there, at its worst
    steps = torch.tensor([[7], [8], [9]])
    for rows in (3, 2):
        lent = cache.repeated(rows, room=300, pool=pool)
        fresh = cache.repeated(rows, room=300)
        assert lent.holds_memory_of(pool) and not fresh.holds_memory_of(pool)
        assert lent.capacity == pool.capacity and (lent.length, lent.shared) == (40, 40)
        for _ in range(3):
            a, b = fast.forward(lent, steps[:rows]), fast.forward(fresh, steps[:rows])
            assert torch.equal(a, b) and a.isfinite().all()
    assert not cache.repeated(4, room=300, pool=pool).holds_memory_of(pool)  # too few rows
    assert not cache.repeated(2, room=600, pool=pool).holds_memory_of(pool)  # too short


def test_comparisons_decode_in_the_memory_of_the_first(tiny_ckpt):
    """The engine keeps a comparison's cache memory (CPU) for the next ones of as many rows
    or fewer, across ``reset``; more rows make a new one."""
    backend = LocalBackend.from_checkpoint(tiny_ckpt, quantize="int8")
    three = tuple(SamplingParams(temperature=0.8, seed=s, max_new_tokens=6) for s in (1, 2, 3))
    cancel = threading.Event()
    list(backend.generate(GenerationRequest(MSGS, three, 2), cancel))
    pool = backend._pool
    assert pool is not None and pool.batch == 3
    made = []
    real = StaticKVCache.repeated

    def spy(self, n, room=0, pool=None):
        made.append(real(self, n, room, pool))
        return made[-1]

    for settings in (three, three[:2]):
        backend.reset()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(StaticKVCache, "repeated", spy)
            list(backend.generate(GenerationRequest(MSGS, settings, 2), cancel))
        assert made[-1].holds_memory_of(pool) and backend._pool is pool
    list(backend.generate(GenerationRequest(MSGS, three + three[:1], 2), cancel))
    assert backend._pool is not pool and backend._pool.batch == 4
    backend._pool = None
    with pytest.MonkeyPatch.context() as mp:  # a cache over POOL_BYTES is not kept
        mp.setattr(engine_module, "POOL_BYTES", backend._cache.nbytes // 2)
        list(backend.generate(GenerationRequest(MSGS, three, 2), cancel))
    assert backend._pool is None


def test_repeated_rows_share_their_prefill_and_decode_as_single_rows(tiny_ckpt):
    """``batch_repeat_interleave`` marks the prefill as shared (and crop keeps it within the
    length); each repeated row decodes exactly as the single row does, int8 and fp32."""
    for quantize in ("int8", "none"):
        fast = FastRunner(tiny_ckpt.model, quantize=quantize)
        cache = fast.new_cache()
        fast.forward(cache, torch.randint(3, 1000, (1, 40)))
        assert cache.shared == 0
        branch = copy.deepcopy(cache)
        branch.batch_repeat_interleave(4)
        assert branch.shared == 40 and copy.deepcopy(branch).shared == 40
        steps = torch.tensor([[7], [8], [9], [10]])
        out = fast.forward(branch, steps)
        for r in range(4):
            single = fast.forward(copy.deepcopy(cache), steps[r:r + 1])
            assert torch.equal(out[r], single[0]), (quantize, r)
        branch.crop(30)
        assert branch.shared == 30


def test_the_kv_cache_is_fp16_where_the_c_kernel_decodes_quantized_weights(tiny_ckpt):
    """int8 and int4 decoding keep keys and values in fp16 (half the cache's memory and
    reading; ``FastLlama.kv_dtype``); unquantized stays exact (fp32), and so does a compiled
    step's cache, which attends in torch; ``chatui bench`` names the cache's dtype."""
    from inference.runner import describe

    for quantize in ("int8", "int4"):
        r = FastRunner(tiny_ckpt.model, quantize=quantize)
        assert r.new_cache().k[0].dtype == torch.float16
        assert "float32 matmuls, float16 KV cache" in describe(r)
    exact = FastRunner(tiny_ckpt.model)
    assert exact.new_cache().k[0].dtype == torch.float32
    assert "float32 matmuls and KV cache" in describe(exact)
    compiled = FastRunner(tiny_ckpt.model, quantize="int8", compile="on")
    assert compiled.new_cache().k[0].dtype == torch.float32


@pytest.mark.parametrize("quantize", ["int8", "none"])
def test_a_retry_over_the_cached_prompt_repeats_the_reply_to_the_last_bit(tiny_ckpt, quantize):
    """A prompt's last token is fed alone whether or not the rest was cached: regenerating
    over the cached prompt (as /retry does) gives the first reply's tokens and logprobs
    exactly. Fed with the prompt's other rows it took another path, here a few float ulps
    apart (fp32 fails without it) and on the default model with int8, whose 8-bit activations
    round such ulps into levels, up to 0.13 nats apart."""
    backend = LocalBackend.from_checkpoint(tiny_ckpt, quantize=quantize)
    request = GenerationRequest((Message("user", "Tell me about the sea, please."),),
                                (SamplingParams(temperature=0, max_new_tokens=6),), 5)
    first, again = (list(backend.generate(request, threading.Event())) for _ in range(2))
    assert next(e for e in again if isinstance(e, Started)).cached_tokens > 0
    a, b = ([(t.id, t.logprob, [(x.id, x.logprob) for x in t.top])
             for e in events if isinstance(e, TokenBatch) for t in e.tokens]
            for events in (first, again))
    assert len(a) == 6 and a == b


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("H, KV, D, start, T", [(9, 3, 64, 0, 138), (4, 2, 64, 200, 120),
                                                (8, 2, 128, 0, 300), (4, 4, 32, 5, 40)])
def test_c_prefill_attention_is_token_by_token_decoding(H, KV, D, start, T, kv_dtype, kernel):
    """``attn_prefill`` (a prompt's attention, ``FastLlama.forward``) writes each token's
    rotated key and value at its position and gives each token the output a decode step at that
    position gives (``attn_decode``, one row), both to the bit: a token's key and attention do
    not depend on whether a prefill or a step made them, nor on where the prompt was cut into
    prefill calls. And it is the float64 causal softmax's within 1e-5 (across 256-key chunks,
    32, 64 and 128 dims, after a cached prefix, fp32 and fp16 caches)."""
    torch.manual_seed(3)
    C = start + T + 7
    k0, v0 = torch.randn(KV, C, D).to(kv_dtype), torch.randn(KV, C, D).to(kv_dtype)
    qkv = torch.randn(T, (H + 2 * KV) * D)
    cos, sin = torch.randn(C, D // 2), torch.randn(C, D // 2)
    k, v = k0.clone(), v0.clone()
    out = kernel.prefill_attention(qkv, k, v, start, cos, sin, H)
    assert out.shape == (T, H * D)
    kd, vd = k0.clone()[None], v0.clone()[None]
    for t in range(T):  # one decode step a token
        step = kernel.attention(qkv[t:t + 1], kd, vd, start + t, torch.tensor([start + t]), cos,
                                sin, None, H)
        assert torch.equal(step[0], out[t]), t
    assert torch.equal(kd[0], k) and torch.equal(vd[0], v)
    kc, vc = k0.clone(), v0.clone()
    cut = T // 3
    head = kernel.prefill_attention(qkv[:cut].contiguous(), kc, vc, start, cos, sin, H)
    tail = kernel.prefill_attention(qkv[cut:].contiguous(), kc, vc, start + cut, cos, sin, H)
    assert torch.equal(torch.cat([head, tail]), out)
    # float64: the queries rotated and scaled from qkv, the keys as the kernel wrote them
    q = qkv[:, :H * D].view(T, H, D // 2, 2).double()
    c, s_ = cos[start:start + T, None].double(), sin[start:start + T, None].double()
    q = torch.stack([q[..., 0] * c - q[..., 1] * s_, q[..., 0] * s_ + q[..., 1] * c], -1)
    q = q.view(T, H, D) / D ** 0.5
    keys = k.double().repeat_interleave(H // KV, 0)  # [H, C, D]
    values = v.double().repeat_interleave(H // KV, 0)
    scores = torch.einsum("thd,hcd->thc", q, keys)
    pos = torch.arange(start, start + T)[:, None, None]
    scores = scores.masked_fill(torch.arange(C)[None, None, :] > pos, float("-inf"))
    ref = torch.einsum("thc,hcd->thd", scores.softmax(-1), values).reshape(T, H * D)
    assert (out.double() - ref).abs().max() <= 1e-5
