"""Which backend to run, as one frozen options object, and the factory that builds it.

The factory runs on the worker thread (the model loads there); the app and the CLI only hold
the factory and talk to the worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inference.backend import Backend, BackendFactory, ProgressCallback


@dataclass(frozen=True)
class BackendOptions:
    """Where the model comes from (the flags every command shares)."""

    backend: Literal["local", "openai", "scripted"] = "local"
    """local: a checkpoint in this process; openai: an OpenAI-compatible server; scripted: a
    model-free stand-in for trying the interface."""
    ckpt: str | None = None
    """Checkpoint directory, .gguf file or local Hugging Face cache name; None = default model."""
    device: str | None = None
    """cpu, cuda, cuda:N, mps; None picks CUDA when available."""
    dtype: str | None = None
    """float32, bfloat16, float16 or auto; None picks the device's best."""
    device_map: str | None = None
    """'auto' shards a big model over several GPUs."""
    quantize: str = "auto"
    """Weight-only quantization applied at load time: auto (int8 where chatui's CPU kernel runs
    and no --dtype is given), none, int8 or int4 (CPU)."""
    runner: str = "auto"
    """auto: chatui's fast Llama-family runner where the model supports it, else transformers';
    fast or hf force one. With no --dtype the fast runner picks the fastest precision that
    keeps quality (bf16 matmuls with an fp32 residual stream for an fp32 model on CPU, when
    int8 is not picked)."""
    compile: str = "auto"
    """The fast runner's decode step through torch.compile (with a CUDA graph on CUDA): auto
    (on CUDA only), on or off."""
    trust_remote_code: bool = False
    allow_pickle: bool = False
    base_url: str | None = None
    model: str | None = None
    api_key_env: str | None = None


@dataclass(frozen=True)
class LocalFactory:
    """Loads a checkpoint into a :class:`inference.engine.LocalBackend`. Picklable, so the
    worker can run it in its own process (``isolate``), away from the UI's GIL."""

    opts: BackendOptions
    isolate: bool = True

    def __call__(self, progress: ProgressCallback) -> Backend:
        from transformers.utils import logging as hf_logging

        from inference.checkpoint import load_checkpoint
        from inference.engine import LocalBackend

        hf_logging.disable_progress_bar()  # progress goes through the callback, not stderr
        o = self.opts
        # lazy: the large weights stay in the file until the runner quantizes (or loads) them
        ckpt = load_checkpoint(o.ckpt, device=o.device, dtype=o.dtype, device_map=o.device_map,
                               trust_remote_code=o.trust_remote_code,
                               allow_pickle=o.allow_pickle, lazy=True, progress=progress)
        precision = "model" if o.dtype else "auto"
        return LocalBackend.from_checkpoint(ckpt, quantize=o.quantize, progress=progress,
                                            precision=precision, runner=o.runner,
                                            compile=o.compile)


def make_factory(opts: BackendOptions) -> BackendFactory:
    """A factory for :class:`inference.worker.InferenceWorker` from the options."""
    if opts.backend == "scripted":
        from inference.scripted import ScriptedFactory

        return ScriptedFactory(delay_s=0.02)
    if opts.backend == "openai":
        from inference.openai_backend import make_openai_factory

        if not opts.base_url:
            raise ValueError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000/v1)")
        return make_openai_factory(opts.base_url, opts.model, opts.api_key_env)
    return LocalFactory(opts)
