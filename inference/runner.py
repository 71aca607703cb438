"""Model runners: one forward over a KV cache, whatever the model implementation.

The engine only needs: a new cache, a forward that returns the last position's logits, and
the cache operations crop / repeat / select. ``HFRunner`` drives any transformers causal LM
with a ``DynamicCache``; ``fast_llama.FastRunner`` is the fast path. The policy choosing one
for a checkpoint (runner, precision, quantization, compiling) is ``build_runner`` here, so the
model file holds the model only.
"""

from __future__ import annotations

import gc
import inspect
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

import torch

from . import hugepages, q8kernel
from .decode_graph import use_compile
from .fast_llama import FastRunner, Interrupted, model_device, unsupported_reason
from .paths import cache_root, inductor_dir
from .quant import int8_cache_path, load_int8, q8_available, save_int8
from .types import Progress

log = logging.getLogger(__name__)


class RunnerError(ValueError):
    """A runner, precision, quantization or compile mode that cannot be used for this model or
    device: the user's choice, so ``str(exc)`` is one sentence (also ``.user_message``, which
    the worker reports without a traceback)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.user_message = message


def decoder_layers(model: Any) -> Any:
    """A transformers model's decoder layers: the first list of modules as long as its text
    config's ``num_hidden_layers`` (``model.layers``, ``transformer.h``, ``gpt_neox.layers``,
    a multimodal model's language model's); None where there is none."""
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    n = getattr(text, "num_hidden_layers", None)
    return next((m for m in model.modules()
                 if isinstance(m, torch.nn.ModuleList) and len(m) == n), None)


def cache_keyword(model: Any) -> str:
    """The forward's name for the KV cache: ``cache`` since transformers 5.2x, which warns that
    ``past_key_values`` (the name before, still taken by models that ship their own code)
    goes in 5.40."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


class HFRunner:
    """A transformers causal LM with a dynamic KV cache.

    ``quantize`` says what its Linear layers are: "none", or "int8" when ``model`` is a copy
    whose Linear layers run chatui's int8 kernel (``hf_quant.quantize_linears``)."""

    def __init__(self, model: Any, *, quantize: str = "none") -> None:
        self.model = model
        self.device = model_device(model)
        self.quantize = quantize
        self.int8_path: Any = None
        """Where the int8 weights are cached on disk (None when not quantized)."""
        self._layers = decoder_layers(model)
        self._cache_kw = cache_keyword(model)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def close(self) -> None:
        """Nothing to stop: transformers' modules hold no read in progress (``FastRunner.close``
        stops its weights' copy)."""

    @staticmethod
    def can_crop(cache: Any) -> bool:
        """Only full-attention layers can be cut back to a shorter prefix exactly."""
        from transformers.cache_utils import DynamicLayer

        return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", []))

    @torch.inference_mode()
    def forward(self, cache: Any, input_ids: torch.Tensor, *,
                attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, all_logits: bool = False,
                should_stop: Callable[[], bool] | None = None) -> torch.Tensor:
        """input_ids: [B, T] -> logits of the last position [B, V] (every position [B, T, V]
        with ``all_logits``); the cache grows by T. ``should_stop``: asked before each decoder
        layer of a prefill (T > 1) whose cache can be cut back; True raises
        :class:`~.fast_llama.Interrupted` with the cache as it was before the call, as the fast
        runner does (a model only transformers runs, or one sharded over GPUs, read a whole
        512-token chunk after Esc). Elsewhere (a sliding-window cache) the forward runs whole."""
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            if position_ids.shape[-1] != input_ids.shape[-1]:
                position_ids = position_ids[:, -input_ids.shape[-1]:]
            kwargs["position_ids"] = position_ids

        def run() -> Any:
            return self.model(input_ids=input_ids, **{self._cache_kw: cache}, use_cache=True,
                              logits_to_keep=0 if all_logits else 1, **kwargs)

        if should_stop is not None and input_ids.shape[-1] > 1 and self.can_crop(cache):
            out = self._stoppable(cache, should_stop, run)
        else:
            out = run()
        return out.logits if all_logits else out.logits[:, -1, :]

    def _stoppable(self, cache: Any, should_stop: Callable[[], bool],
                   run: Callable[[], Any]) -> Any:
        """``run()`` with ``should_stop`` asked before each decoder layer; on True the layers
        that took the chunk already are cut back, and :class:`Interrupted` is raised."""
        layers = self._layers
        if not layers:
            return run()

        def check(module: Any, args: Any) -> None:
            if should_stop():
                raise Interrupted

        before = [layer.get_seq_length() for layer in cache.layers]
        handles = [layer.register_forward_pre_hook(check) for layer in layers]
        try:
            return run()
        except Interrupted:
            for i, layer in enumerate(cache.layers):
                extra = layer.get_seq_length() - (before[i] if i < len(before) else 0)
                if extra > 0:
                    layer.crop(-extra)
            raise
        finally:
            for h in handles:
                h.remove()



PRECISIONS = ("auto", "model", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("auto", "none", "int8", "int4")


def auto_quantization(device: torch.device, precision: str, runner: str,
                      unsupported: str | None) -> str:
    """What ``quantize="auto"`` means: int8 where chatui's CPU kernel runs it (as close to fp32
    as bf16 and several times faster, see the README's quality figures) and the user asked for
    no precision of their own; else none."""
    fast = runner == "fast" or (runner == "auto" and unsupported is None)
    return "int8" if fast and precision == "auto" and q8_available(device) else "none"


def build_runner(ckpt: Any, *, quantize: str = "none", precision: str = "model",
                 runner: str = "auto", compile: str = "auto",
                 progress: Callable[[Any], None] | None = None) -> Any:
    """The runner for a loaded checkpoint (``inference.checkpoint.LoadedCheckpoint``).

    Raises:
        RunnerError: a choice this model or device cannot run (one sentence for the user).

    Args:
        quantize: "none", "int8" (weight-only; the int8 weights are cached on disk), "int4"
            (CPU only) or "auto" (``auto_quantization``).
        precision: matmul/KV dtype of the fast path: "model" (the checkpoint's own dtype,
            exact), "auto" (the fastest that keeps quality, measured in ``inference.quality``:
            for an fp32 model on a CPU, fp32 where chatui's kernels build, else bf16 matmuls
            with an fp32 residual stream), or a dtype.
        runner: "auto" (fast when the model supports it), "fast" or "hf". The environment
            variable ``CHATUI_RUNNER`` (hf / fast) overrides "auto".
        compile: the fast runner's decode step through ``torch.compile`` (and a CUDA graph on
            CUDA): "auto" (on CUDA only, where it pays), "on" or "off". Compiling happens
            here, reported through ``progress``, and is cached on disk.
    """
    if quantize not in QUANTIZATIONS:
        raise RunnerError(f"Unknown quantization {quantize!r}; choose auto, none, int8 or int4.")
    if quantize == "int4" and ckpt.device.type != "cpu":
        raise RunnerError("int4 uses torch's CPU kernel; on this device use --quantize int8.")
    if precision not in PRECISIONS:
        raise RunnerError(f"Unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}.")
    if runner == "auto":
        runner = os.environ.get("CHATUI_RUNNER", "auto") or "auto"
    model = ckpt.model
    reason = unsupported_reason(model)
    if quantize == "auto":
        quantize = auto_quantization(ckpt.device, precision, runner, reason)
    if runner == "hf" or (runner == "auto" and reason is not None):
        if quantize == "int4":
            raise RunnerError(f"--quantize int4 needs the fast runner, which cannot run this "
                              f"model ({reason or 'transformers runner forced'}); use --quantize "
                              "int8 or none.")
        _materialize(ckpt, progress)  # transformers' modules need their weights
        if quantize == "int8":
            return _quantized_hf_runner(ckpt, progress)
        return HFRunner(model)
    if reason is not None:
        raise RunnerError(f"The fast runner cannot run this model: {reason}.")
    if quantize == "none":
        _materialize(ckpt, progress)  # the full-precision weights are what runs

    model_dtype = next(model.parameters()).dtype
    residual = None
    if precision == "model":
        dtype = model_dtype
    elif precision == "auto" and model_dtype == torch.float32 and quantize == "none" \
            and q8_available(ckpt.device):
        dtype = torch.float32  # chatui's fp32 GEMV beats torch's bf16 one, and is exact
    elif precision == "auto":
        dtype = torch.bfloat16 if model_dtype == torch.float32 else model_dtype
        if model_dtype == torch.float32 and quantize == "none":
            residual = torch.float32
    else:
        dtype = getattr(torch, precision)
    q8 = quantize != "none" and q8_available(ckpt.device)
    if q8:
        # chatui's kernels quantize activations (8-bit, in groups of 32) itself:
        # fp32 in, fp32 out
        dtype, residual = model_dtype, None
    elif quantize != "none":
        if dtype == torch.float32:
            dtype = torch.bfloat16  # torch's int8 and int4 kernels want bf16 activations
        residual = residual or (torch.float32 if model_dtype == torch.float32 else None)

    stored = None
    path = None
    stage = f"quantizing weights to {quantize}"
    if quantize != "none":
        _check_memory(model, quantize, q8)
        # "-q4q6": int4 files with the 6-bit output layer (the older "-q4" held it in int8)
        path = int8_cache_path(getattr(ckpt, "load_dir", "") or ckpt.path, ckpt.weights_hash,
                               cache_root(), quantize + ({"int8": "-q8", "int4": "-q4q6"}.get(
                                   quantize, "") if q8 else ""))
        if progress:
            progress(Progress(stage, 0, 1))
        stored = load_int8(path, ckpt.device)
    try:
        use_compile(compile, ckpt.device)  # validates the mode before any work
    except ValueError as exc:
        raise RunnerError(str(exc)) from None

    def build(weights: dict[str, Any] | None) -> FastRunner:
        return FastRunner(model, dtype=dtype, quantize=quantize, int8_weights=weights,
                          residual_dtype=residual, compile=compile, compile_dir=inductor_dir())

    fast = build(stored)
    if quantize != "none" and path is not None:
        if stored is None or set(stored) != set(fast.fast.quantized):
            try:
                save_int8(path, fast.fast.quantized)
            except OSError as exc:  # a read-only cache costs start-up time, nothing else
                log.warning("could not cache int8 weights: %s", exc)
            else:
                if _huge_pages_for(fast, ckpt.device):
                    del fast  # its weights let go before they are read back: one copy held
                    gc.collect()
                    hugepages.return_freed_memory()
                    fast = build(load_int8(path, ckpt.device, resident=True))
        elif _huge_pages_for(fast, ckpt.device):
            fast.pending = ResidentWeights(path, ckpt.device)
        if progress:
            progress(Progress(stage, 1, 1))
    fast.int8_path = path
    if fast.decode is not None:
        stage = "compiling the decode step"
        if progress:
            progress(Progress(stage, 0, 1))
        fast.decode.warm_up()
        if progress:
            progress(Progress(stage, 1, 1))
    return fast


def _huge_pages_for(fast: FastRunner, device: torch.device) -> bool:
    """Whether the runner's weights are to run from huge pages (``hugepages``: a decode step
    streaming them is 5-12% quicker there than on small pages). A first start builds its runner
    again on the weights it has just cached, read back into huge pages (it has let go of its
    own first: one copy held); a later start runs on the cache's mapping at once while
    ``ResidentWeights`` reads the file into huge pages, and takes them in at the first forward
    after (reading 800 MB took 0.2-2.4 s, longer than a 1B model's whole cached start). Not on
    another device, where the kernel gives no huge pages, or with a compiled step (it holds
    its weights; a start compiles once)."""
    return device.type == "cpu" and fast.decode is None and hugepages.huge_pages_available()


class ResidentWeights:
    """The disk cache's weights read into huge pages (``quant.load_int8(resident=True)``) on a
    thread of their own, while the runner starts on the file's mapping.

    The thread is not a daemon, and ``close`` stops its read between two chunks: a daemon
    thread still inside torch when the interpreter shut down (``torch.empty`` as the views were
    made) died unwinding through torch's C++ frames, and the process aborted ("terminate called
    without an active exception", exit code 134) after its work was done: `chatui bench
    --prompt-tokens 600` refusing a tiny model's 512-token context did so in 3 runs of 6
    (2026-11-30). Closing the backend closes this; a process that ends without closing it waits
    for the read (0.2-2.4 s for 800 MB)."""

    def __init__(self, path: Path, device: torch.device) -> None:
        self._weights: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(path, device), daemon=False,
                                        name="chatui-weights")
        self._thread.start()

    def _read(self, path: Path, device: torch.device) -> None:
        self._weights = load_int8(path, device, resident=True, stop=self._stop.is_set) or {}

    def close(self) -> None:
        """Stop the read (at its next chunk) and wait for the thread; ``ready`` then gives no
        weights unless the read had finished."""
        self._stop.set()
        self._thread.join()

    def ready(self) -> dict[str, Any] | None:
        """None while the read goes on; then the weights by name (none where it failed)."""
        return None if self._thread.is_alive() else self._weights

    def wait(self) -> dict[str, Any]:
        """The weights, once read (what a test or a benchmark waits for)."""
        self._thread.join()
        return self._weights


def _check_memory(model: Any, quantize: str, q8: bool) -> None:
    """Refuse, in one sentence, weights that will not fit in memory: those still in the file
    at the size they will be held at, and the quantized copies of those already loaded.

    Raises:
        RunnerError: they do not fit.
    """
    from .checkpoint.lazy_model import LAZY
    from .checkpoint.memory import fits_sentence, weight_bytes

    params = [(n, tuple(p.shape), p.dtype) for n, p in model.named_parameters()
              if p.is_meta or (quantize != "none" and LAZY.search(n) and p.dim() >= 2)]
    what = f"its {quantize} weights" if quantize != "none" else "its full-precision weights"
    sentence = fits_sentence(weight_bytes(params, quantize, q8), what)
    if sentence:
        raise RunnerError(sentence)


def _materialize(ckpt: Any, progress: Callable[[Any], None] | None) -> None:
    """Load the weights a lazily loaded checkpoint left in its file (``lazy_model``).

    Raises:
        RunnerError: they do not fit in memory (nothing is loaded then).
    """
    from .checkpoint import lazy_model

    if not lazy_model.is_lazy(ckpt.model):
        return
    _check_memory(ckpt.model, "none", False)
    stage = "loading the full-precision weights"
    if progress:
        progress(Progress(stage, 0, 1))
    lazy_model.materialize(ckpt.model)
    if progress:
        progress(Progress(stage, 1, 1))


def _quantized_hf_runner(ckpt: Any, progress: Callable[[Any], None] | None) -> HFRunner:
    """transformers' modules with every Linear layer in int8 (the fast runner cannot run this
    model, or the transformers runner was asked for); the int8 weights are cached on disk as
    the fast runner's are."""
    from .hf_quant import quantize_linears

    q8 = q8_available(ckpt.device)
    path = int8_cache_path(getattr(ckpt, "load_dir", "") or ckpt.path, ckpt.weights_hash,
                           cache_root(), "hf-int8" + ("-q8" if q8 else ""))
    stage = "quantizing weights to int8"
    if progress:
        progress(Progress(stage, 0, 1))
    stored = load_int8(path, ckpt.device)
    model, weights = quantize_linears(ckpt.model, stored)
    if stored is None or set(stored) != set(weights):
        try:
            save_int8(path, weights)
        except OSError as exc:  # a read-only cache costs start-up time, nothing else
            log.warning("could not cache int8 weights: %s", exc)
    if progress:
        progress(Progress(stage, 1, 1))
    runner = HFRunner(model, quantize="int8")
    runner.int8_path = path
    return runner


def describe(runner: Any) -> str:
    """One line: which runner and precision a backend picked (shown by ``chatui bench``)."""
    fast = getattr(runner, "fast", None)
    if fast is None:
        dtype = str(next(runner.model.parameters()).dtype).replace("torch.", "")
        reason = unsupported_reason(runner.model)
        why = f"; the fast runner cannot run this model: {reason}" if reason else ""
        if getattr(runner, "quantize", "none") == "int8":
            kernel = q8kernel.load_kernel() if q8_available(runner.device) else None
            how = (f"chatui's {kernel.isa} kernel, groups of 32" if kernel is not None
                   else "per channel")
            return (f"transformers runner (int8 weights on its Linear layers, {how}; {dtype} "
                    f"elsewhere{why})")
        return f"transformers runner ({dtype}{why})"
    name = str(fast.dtype).replace("torch.", "")
    res = str(fast.rdtype).replace("torch.", "")
    q = f"{fast.quantize} weights, " if fast.quantize != "none" else ""
    if fast.q8:
        kernel = q8kernel.load_kernel()
        isa = kernel.isa if kernel is not None else "?"
        q = (f"int4 weights (groups of 32 with fp16 scale and min, int8 output layer; chatui's "
             f"{isa} kernels), " if fast.quantize == "int4" else
             f"int8 weights (int8 in groups of 32, chatui's {isa} kernel), ")
    step = runner.decode.describe() if runner.decode is not None else "eager"
    kv = str(fast.kv_dtype).replace("torch.", "")
    cache = "matmuls and KV cache" if kv == name else f"matmuls, {kv} KV cache"
    return f"fast runner ({q}{name} {cache}, {res} residual; {step} decode step)"
