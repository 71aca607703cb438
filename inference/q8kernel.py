"""chatui's CPU kernels (``kernels/*.c``: the int8 matmul ``q8.c``, the int4 one ``q4.c``,
the 6-bit one ``q6.c`` (int4's output layer),
one-token attention ``attn.c``, a whole int8 decode step ``decode.c``, the fp32
matrix-vector product ``f32.c``, the embedding lookup and logit soft-capping ``vocab.c`` and a
decode step's token statistics ``stats.c``, all
declared in ``kernels/chatui_kernels.h``), built on first
use with the machine's C compiler (or ahead of time by ``kernel_build.build_all``) and cached
on disk; ``None`` where they cannot be built (no compiler, an unknown CPU) or do not match
``kernel_abi``'s table, and the runner then falls back to torch's per-channel int8 kernel,
torch's int4 kernel, torch's attention and torch's GEMV.

The library is built with ``-march=native`` for the CPU it runs on (the cache key includes the
CPU's flags) and with OpenMP only when torch's own OpenMP runtime is ``libgomp.so.1``: the
kernel's threads are then torch's threads, never a second pool fighting it for the cores.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import kernel_abi
from .paths import kernels_dir

log = logging.getLogger(__name__)

KERNELS = Path(__file__).with_name("kernels")
SOURCES = tuple(sorted(KERNELS.glob("*.c")))
HEADERS = tuple(sorted(KERNELS.glob("*.h")))
GROUP = 32
"""Weights and activations are quantized in groups of this many along K."""
ROWS = 16
"""Output rows a packed block holds."""
F32_MAX_ROWS = 8
"""Most rows of x the fp32 matrix-vector kernel takes (a decode step of a small batch)."""
STATS_MAX_K = 20
"""Most alternatives ``Q8Kernel.token_stats`` ranks (``top_logprobs``' limit)."""
FAST_ISAS = ("avx512-vnni", "avx2")
"""Instruction sets the kernel has SIMD code for (elsewhere torch's kernel is faster)."""


@dataclass(frozen=True)
class Q8Kernel:
    """The loaded library. With ``debug`` (``CHATUI_KERNEL_DEBUG=1`` when it loaded) every
    call checks its tensors first (``kernel_abi.check_*``) and raises
    ``kernel_abi.KernelArgumentError`` instead of handing C a wrong buffer."""

    lib: ctypes.CDLL
    isa: str
    openmp: bool
    debug: bool = False

    def _threads(self) -> int:
        return torch.get_num_threads() if self.openmp else 1

    def matmul(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
               norm: torch.Tensor | None = None, eps: float = 0.0,
               swiglu: bool = False) -> torch.Tensor:
        """x: [M, K] fp32 contiguous on the CPU -> [M, n] fp32. With ``norm`` ([K] fp32) the
        rows are RMS-normalized (``eps``) and scaled by it first; with ``swiglu`` x is
        [M, 2K] = [gate | up] and the input is silu(gate) * up."""
        out = torch.empty((x.shape[0], n), dtype=torch.float32)
        self.run(x, packed, scales, out, norm, eps, swiglu)
        return out

    def run(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
            out: torch.Tensor, norm: torch.Tensor | None, eps: float, swiglu: bool) -> None:
        """``matmul`` into ``out`` ([..., n] fp32) for x [..., K] fp32 contiguous, with fewer
        checks (the decode loop's path)."""
        if self.debug:
            kernel_abi.check_q8_matmul(x, packed, scales, out, norm, swiglu, group=GROUP,
                                       rows=ROWS)
        k = x.shape[-1]
        self.lib.q8_matmul(x.data_ptr(), x.numel() // k, k >> swiglu, packed.data_ptr(),
                           scales.data_ptr(), out.shape[-1], out.data_ptr(), self._threads(),
                           1 if norm is not None else 2 * swiglu,
                           None if norm is None else norm.data_ptr(), eps)

    def q4_matmul(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, n: int,
                  norm: torch.Tensor | None = None, eps: float = 0.0,
                  swiglu: bool = False) -> torch.Tensor:
        """``matmul`` for an int4 ``quant.Q4Weight``'s packed nibbles and scales (``q4.c``)."""
        out = torch.empty((x.shape[0], n), dtype=torch.float32)
        self.run4(x, packed, scales, out, norm, eps, swiglu)
        return out

    def run4(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
             out: torch.Tensor, norm: torch.Tensor | None, eps: float, swiglu: bool) -> None:
        """``q4_matmul`` into ``out``, with as few checks as ``run``."""
        if self.debug:
            kernel_abi.check_q4_matmul(x, packed, scales, out, norm, swiglu, group=GROUP,
                                       rows=ROWS)
        k = x.shape[-1]
        self.lib.q4_matmul(x.data_ptr(), x.numel() // k, k >> swiglu, packed.data_ptr(),
                           scales.data_ptr(), out.shape[-1], out.data_ptr(), self._threads(),
                           1 if norm is not None else 2 * swiglu,
                           None if norm is None else norm.data_ptr(), eps)

    def run6(self, x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
             out: torch.Tensor, norm: torch.Tensor | None, eps: float, swiglu: bool) -> None:
        """``run`` for a 6-bit ``quant.Q6Weight``'s packed bytes and scales (``q6.c``): x [..., K]
        fp32 contiguous -> ``out`` [..., n] fp32."""
        if self.debug:
            kernel_abi.check_q6_matmul(x, packed, scales, out, norm, swiglu, group=GROUP,
                                       rows=ROWS)
        k = x.shape[-1]
        self.lib.q6_matmul(x.data_ptr(), x.numel() // k, k >> swiglu, packed.data_ptr(),
                           scales.data_ptr(), out.shape[-1], out.data_ptr(), self._threads(),
                           1 if norm is not None else 2 * swiglu,
                           None if norm is None else norm.data_ptr(), eps)

    def matmul_sel(self, bits: int, x: torch.Tensor, xdiv: int, weights: torch.Tensor,
                   scales: torch.Tensor, sel: torch.Tensor, out: torch.Tensor,
                   swiglu: bool) -> None:
        """``out[p] = f(x[p // xdiv]) @ W[sel[p]].T`` for p < P in one kernel call: the
        selected experts of a mixture (``q8_matmul_sel`` / ``q4_matmul_sel``). x: [R, K] (or
        [R, 2K] = [gate | up] with ``swiglu``, f then silu(gate) * up) fp32 contiguous;
        weights, scales: int64 [E] the data pointers of E packed weights [n, K] of ``bits``
        (8: ``Q8Weight``, 4: ``Q4Weight``) and their scales; sel: int64 [P] contiguous; out:
        [P, n] fp32 contiguous, written. The caller keeps the weights alive."""
        k = x.shape[-1] >> swiglu
        fn = self.lib.q8_matmul_sel if bits == 8 else self.lib.q4_matmul_sel
        fn(sel.numel(), x.data_ptr(), xdiv, k, weights.data_ptr(), scales.data_ptr(),
           sel.data_ptr(), out.shape[-1], out.data_ptr(), self._threads(), 2 * swiglu)

    def f32_linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [..., K] @ w.T for fp32 contiguous x (at most ``F32_MAX_ROWS`` rows) and w [N, K]
        (``f32.c``) -> [..., N] fp32."""
        if self.debug:
            kernel_abi.check_f32_matvec(x, w, max_rows=F32_MAX_ROWS)
        k = x.shape[-1]
        out = torch.empty(x.shape[:-1] + (w.shape[0],), dtype=torch.float32)
        self.lib.f32_matvec(x.data_ptr(), x.numel() // k, k, w.data_ptr(), w.shape[0],
                            out.data_ptr(), self._threads())
        return out

    def q8_rows(self, ids: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, k: int,
                mul: float = 1.0) -> torch.Tensor:
        """Rows ``ids`` ([...] int64) of a ``Q8Weight`` [N, k] as fp32 [..., k], times ``mul``
        (``vocab.c``: one pass instead of ``Q8Weight.rows``' torch ops)."""
        ids = ids.to(torch.int64).contiguous()
        out = torch.empty(ids.shape + (k,), dtype=torch.float32)
        self.lib.q8_rows(ids.data_ptr(), ids.numel(), k, packed.data_ptr(), scales.data_ptr(),
                         mul, out.data_ptr())
        return out

    def softcap(self, y: torch.Tensor, cap: float) -> torch.Tensor:
        """``cap * tanh(y / cap)`` in place for fp32 contiguous y (``vocab.c``); returns y."""
        if self.debug:
            kernel_abi.check_softcap(y)
        self.lib.softcap(y.data_ptr(), y.numel(), cap)
        return y

    def token_stats(self, logits: torch.Tensor, chosen: torch.Tensor | None, k: int,
                    greedy_cut: float = 0.0) -> torch.Tensor:
        """``sampling.token_stats`` in two passes over each row (``stats.c``). logits: [B, V]
        fp32 contiguous; chosen: [B] int64, or None for the argmax (greedy), which adds
        ``sampling.sampler_stats``' greedy columns (``greedy_cut``: their cut code). Returns
        [B, 3 + 2k] or, greedy, [B, 5 + 4k] fp32."""
        b, v = logits.shape
        width = 3 + 2 * k if chosen is not None else 5 + 4 * k
        out = torch.empty((b, width), dtype=torch.float32)
        if chosen is not None and (chosen.dtype != torch.int64 or not chosen.is_contiguous()):
            chosen = chosen.to(torch.int64).contiguous()
        self.lib.token_stats_f32(logits.data_ptr(), b, v,
                                 None if chosen is None else chosen.data_ptr(), k, greedy_cut,
                                 out.data_ptr(), width, self._threads())
        return out

    def sample(self, raw: torch.Tensor, pre: torch.Tensor, temperature: torch.Tensor,
               top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
               greedy: torch.Tensor, u: torch.Tensor, k: int) -> torch.Tensor:
        """``sampling.decode_step_outputs``' chain, draw and columns in one call (``stats.c``).
        raw, pre: [B, V] fp32 contiguous (the logits, and the same after the repetition
        penalty); per row [B]: temperature, top_p, min_p fp32, top_k int64, greedy bool, u
        float64 in [0, 1). Returns [B, 5 + 4k] fp32 (the chosen id first)."""
        b, v = raw.shape
        width = 5 + 4 * k
        out = torch.empty((b, width), dtype=torch.float32)
        rows = [temperature.float().contiguous(), top_k.to(torch.int64).contiguous(),
                top_p.float().contiguous(), min_p.float().contiguous(),
                greedy.to(torch.uint8).contiguous(), u.double().contiguous()]
        self.lib.sample_f32(raw.data_ptr(), pre.data_ptr(), b, v,
                            *(r.data_ptr() for r in rows), k, out.data_ptr(), width,
                            self._threads())
        return out

    def topk(self, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """torch.topk(x, k) for x [B, V] fp32 contiguous on the CPU, k <= V (``stats.c``):
        (values [B, k] descending, ids [B, k] int64), equal values by ascending id."""
        b, v = x.shape
        vals = torch.empty((b, k), dtype=torch.float32)
        ids = torch.empty((b, k), dtype=torch.int64)
        self.lib.topk_f32(x.data_ptr(), b, v, k, vals.data_ptr(), ids.data_ptr(),
                          self._threads())
        return vals, ids

    def attention(self, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                  write: int, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  mask: torch.Tensor | None, n_heads: int, shared: int = 0) -> torch.Tensor:
        """One new token per row (``attn.c``): RoPE, the cache write at ``write`` and attention
        over positions 0..write. qkv: [B, (H + 2KV) * D] fp32; caches [B, KV, C, D] fp32 or
        fp16, contiguous (written in place); positions: [B] int64 (RoPE); cos, sin: [P, D/2] fp32;
        mask: [B, write + 1] uint8 or None; positions 0..shared-1 are alike in every row
        (``StaticKVCache.shared``) and read once. Returns [B, H * D] fp32."""
        if self.debug:
            kernel_abi.check_attention(qkv, [k_cache], [v_cache], write, positions, cos, sin,
                                       mask, n_heads, shared)
        b, kv, c, d = k_cache.shape
        out = torch.empty((b, n_heads * d), dtype=torch.float32)
        self.lib.attn_decode(qkv.data_ptr(), b, n_heads, kv, d, k_cache.data_ptr(),
                             v_cache.data_ptr(), c, write, positions.data_ptr(), cos.data_ptr(),
                             sin.data_ptr(), None if mask is None else mask.data_ptr(), shared,
                             out.data_ptr(), self._threads(), int(k_cache.dtype == torch.float16))
        return out

    def prefill_attention(self, qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          start: int, cos: torch.Tensor, sin: torch.Tensor,
                          n_heads: int) -> torch.Tensor:
        """A prefill's attention (``attn.c``'s ``attn_prefill``): qkv [T, (H + 2KV) * D] fp32
        of one sequence's tokens at positions start..start+T-1 (as ``attention`` takes a row's
        one token); their keys and values are rotated and written into the caches [KV, C, D]
        (fp32 or fp16, contiguous) and each token attends causally to keys 0..its position,
        with the RoPE tables cos, sin [P, D/2]. Returns [T, H * D] fp32, each row the bits a
        decode step at that position gives."""
        if self.debug:
            kernel_abi.check_prefill_attention(qkv, k_cache, v_cache, start, cos, sin, n_heads)
        t = qkv.shape[0]
        kv, c, d = k_cache.shape
        out = torch.empty((t, n_heads * d), dtype=torch.float32)
        self.lib.attn_prefill(qkv.data_ptr(), t, n_heads, kv, d, k_cache.data_ptr(),
                              v_cache.data_ptr(), c, start, cos.data_ptr(), sin.data_ptr(),
                              out.data_ptr(), self._threads(), int(k_cache.dtype == torch.float16))
        return out

    def decode_layers(self, x: torch.Tensor, layers: ctypes.Array, k_caches: list[torch.Tensor],
                      v_caches: list[torch.Tensor], *, n_heads: int, inter: int, write: int,
                      positions: torch.Tensor, cos: list[torch.Tensor], sin: list[torch.Tensor],
                      mask: torch.Tensor | None, eps: float, shared: int = 0) -> None:
        """Every decoder layer of one decode step (``decode.c``), x [B, hidden] fp32 updated in
        place; caches and ``shared`` as for ``attention``, written at ``write``; cos, sin: one
        table of each RoPE kind (``Layer.rope`` indexes them)."""
        if self.debug:
            kernel_abi.check_decode_layers(x, len(layers), k_caches, v_caches, write, positions,
                                           cos, sin, mask, n_heads, shared)
        b, hidden = x.shape
        _, kv, c, d = k_caches[0].shape
        n = len(k_caches)
        kc = (ctypes.c_void_p * n)(*[t.data_ptr() for t in k_caches])
        vc = (ctypes.c_void_p * n)(*[t.data_ptr() for t in v_caches])
        cs = (ctypes.c_void_p * len(cos))(*[t.data_ptr() for t in cos])
        sn = (ctypes.c_void_p * len(sin))(*[t.data_ptr() for t in sin])
        self.lib.decode_layers(x.data_ptr(), b, hidden, n, layers, kc, vc, n_heads, kv, d, inter,
                               c, write, positions.data_ptr(), cs, sn,
                               None if mask is None else mask.data_ptr(), shared, eps,
                               self._threads(), int(k_caches[0].dtype == torch.float16))


def _omp_runtimes() -> set[str]:
    """Paths of the OpenMP runtimes mapped into this process (Linux; empty elsewhere)."""
    try:
        text = Path("/proc/self/maps").read_text()
    except OSError:
        return set()
    return {line.split()[-1] for line in text.splitlines()
            if re.search(r"/lib(g|i)?omp[^/]*\.so", line)}


def _cpuinfo_line(*prefixes: str) -> str | None:
    """/proc/cpuinfo's first line starting with one of ``prefixes`` (None if none or unread)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(prefixes):
                return line
    except OSError:
        pass
    return None


def _cpu_flags() -> str:
    return _cpuinfo_line("flags", "Features") or platform.processor()


WEIGHT_FETCHES = ("nontemporal", "l2")


def weight_fetch_defines(override: str = "") -> tuple[str, ...]:
    """How the int8 kernel fetches the weights it streams (``q8.c``'s AHEAD): into L2 on every
    CPU. Non-temporal fetches, once AMD's default because they kept the KV cache in the L3
    (issue 18's seventh pass), lost on AMD once the weights ran from huge pages (issue 18's
    twenty-eighth pass: decode steps at 1 / 4 / 8 rows 6.30 / 7.36 / 10.30 -> 5.85 / 7.23 /
    8.63 ms) and on the file's small pages too, and on an Intel Xeon they fill L1 alone and
    decoding ran at a third of its speed (58.5 against 194 tok/s). ``override``
    (``CHATUI_WEIGHT_FETCH``: ``nontemporal`` or ``l2``) picks one, to measure both on one
    machine."""
    choice = override.strip().lower()
    return ("-DCHATUI_WEIGHTS_NT=1",) if choice == "nontemporal" else ()


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


class KernelUnavailable(Exception):
    """The kernels cannot be built here; ``str(exc)`` says why in one sentence."""


@dataclass(frozen=True)
class KernelPlan:
    """How and where this machine's kernel library is built (the cache key covers the sources,
    the compiler, the CPU's flags and whether OpenMP is used)."""

    cc: str
    openmp: bool
    path: Path
    runtimes: frozenset[str]
    """The OpenMP runtimes mapped before the library loads (a second one is a problem)."""
    defines: tuple[str, ...] = ()
    """Preprocessor flags chosen for this CPU (``weight_fetch_defines``)."""


def plan_build(fetch: str | None = None) -> KernelPlan:
    """Where this machine's library lives and how it is built; ``fetch`` (``weight_fetch_defines``'
    override) in place of ``CHATUI_WEIGHT_FETCH``'s.

    Raises:
        KernelUnavailable: not an x86-64 CPU, or no C compiler.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise KernelUnavailable(f"chatui's kernels are written for x86-64, not "
                                f"{platform.machine() or 'this CPU'}")
    cc = _compiler()
    if cc is None:
        raise KernelUnavailable("no C compiler found (install gcc or set CC)")
    runtimes = frozenset(_omp_runtimes())
    openmp = len(runtimes) == 1 and Path(next(iter(runtimes))).name == "libgomp.so.1"
    override = os.environ.get("CHATUI_WEIGHT_FETCH", "") if fetch is None else fetch
    if override.strip() and override.strip().lower() not in WEIGHT_FETCHES:
        log.warning("CHATUI_WEIGHT_FETCH=%s is not one of %s; the default (l2) is used",
                    override, ", ".join(WEIGHT_FETCHES))
    defines = weight_fetch_defines(override)
    key = hashlib.sha256(b"\0".join([
        *(p.read_bytes() for p in SOURCES + HEADERS), cc.encode(), _cpu_flags().encode(),
        str(openmp).encode(), " ".join(defines).encode()]))
    return KernelPlan(cc, openmp, kernels_dir() / f"q8-{key.hexdigest()[:20]}.so", runtimes,
                      defines)


def compile_library(cc: str, out: Path, openmp: bool, march: str = "native",
                    defines: tuple[str, ...] = (), sources: tuple[Path, ...] = SOURCES) -> None:
    """Compile the kernels into ``out`` (atomically). ``march`` other than native lets the
    tests build the code paths of other CPUs (AVX2 only, or none) on this one; ``defines``
    are ``KernelPlan.defines``; ``sources`` other than the engine's own (each with its headers
    beside it) let the benchmarks build an older or an instrumented copy."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / out.name
        flags = (["-O3", f"-march={march}", "-fPIC"] + (["-fopenmp"] if openmp else [])
                 + list(defines))
        # one compiler a source, all at once, then one link: 3.1 s -> 2.1-2.5 s on this 2-core
        # machine for the eight sources (the first start of chatui waits for it)
        objects = [Path(tmp) / f"{src.stem}.o" for src in sources]
        jobs = [subprocess.Popen([cc, *flags, "-c", str(src), "-o", str(obj)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                for src, obj in zip(sources, objects)]
        deadline = time.monotonic() + 120
        try:
            for job in jobs:
                stdout, stderr = job.communicate(timeout=max(1.0, deadline - time.monotonic()))
                if job.returncode:
                    raise subprocess.CalledProcessError(job.returncode, job.args, stdout, stderr)
        finally:
            for job in jobs:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        subprocess.run([cc, *flags, "-shared", *map(str, objects), "-o", str(target), "-lm"],
                       check=True, capture_output=True, timeout=120)
        os.replace(target, out)


def open_library(path: Path, openmp: bool, debug: bool = False) -> Q8Kernel:
    """Load a built library and check it against ``kernel_abi`` (raises ``KernelABIError``)."""
    lib = ctypes.CDLL(str(path))
    kernel_abi.bind(lib)
    if lib.f32_max_rows() != F32_MAX_ROWS:
        raise kernel_abi.KernelABIError("the fp32 kernel's row limit does not match")
    if lib.token_stats_max_k() != STATS_MAX_K:
        raise kernel_abi.KernelABIError("the statistics kernel's top-k limit does not match")
    if lib.q8_group_size() != GROUP or lib.q8_row_block() != ROWS:
        raise kernel_abi.KernelABIError("the int8 kernel's weight layout does not match")
    return Q8Kernel(lib, lib.q8_isa().decode(), bool(lib.q8_openmp()) and openmp, debug)


@functools.cache
def load_kernel() -> Q8Kernel | None:
    """The kernel, built into ``paths.kernels_dir()`` when missing; None when unavailable, when
    the built library does not match ``kernel_abi`` (logged), or turned off with
    ``CHATUI_Q8_KERNEL=off``. ``CHATUI_KERNEL_DEBUG=1`` turns on argument checks."""
    if os.environ.get("CHATUI_Q8_KERNEL", "").lower() in ("0", "off", "no", "false"):
        return None
    try:
        plan = plan_build()
    except KernelUnavailable as exc:
        log.info("%s: int8 uses torch's per-channel kernel", exc)
        return None
    try:
        if not plan.path.is_file():
            compile_library(plan.cc, plan.path, plan.openmp, defines=plan.defines)
        kernel = open_library(plan.path, plan.openmp, kernel_abi.debug_enabled())
    except kernel_abi.KernelABIError as exc:
        log.warning("chatui's kernel library at %s does not match this code (%s); int8 uses "
                    "torch's kernel", plan.path, exc)
        return None
    except (OSError, RuntimeError, subprocess.SubprocessError, AttributeError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning("could not build the int8 kernel (%s) %s; int8 uses torch's kernel", exc,
                    detail.decode(errors="replace")[-500:])
        return None
    if plan.openmp and _omp_runtimes() != plan.runtimes:
        log.warning("the int8 kernel loaded a second OpenMP runtime; it runs single-threaded")
        kernel = dataclasses.replace(kernel, openmp=False)
    if kernel.isa not in FAST_ISAS:
        return None
    return kernel
