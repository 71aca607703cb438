"""Shared fixtures: a tiny random model with the default model's tokenizer (fast unit tests)
and the real default model (a few end-to-end tests)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A fixed thread count (inference.threads): the tuner would pick 1 or 2 threads by timing,
# and a threaded sum (the entropy's) differs in its last bits between the two, so two runs
# that a test compares could differ there. tests/test_threads.py unsets it to test the tuner.
os.environ.setdefault("CHATUI_THREADS", str(torch.get_num_threads()))


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_unless_ci(message: str) -> None:
    """Skip a test whose prerequisite this machine lacks; in CI, where every test must run,
    fail instead, so nothing is skipped silently there."""
    if in_ci():
        pytest.fail(f"CI must run this test, but {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session", autouse=True)
def _kernels_built():
    """chatui's kernel library built once before any test runs, not inside the first test
    that loads a model (a full run after the kernels' sources changed failed two pilot tests
    that wait 2 s for the model: the build alone took 3 s)."""
    from inference.kernel_build import KernelBuildError, build_all

    try:
        build_all()
    except KernelBuildError:
        pass  # the tests of the fallbacks and of the build say what is wrong


@pytest.fixture(autouse=True)
def _private_user_dirs(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's own settings and conversations: every test (and every
    subprocess it starts, which inherits the environment) gets fresh config and data folders.
    Found by using chatui after a test run: the user's /history listed a dozen "go" chats that
    tests had autosaved there."""
    root = tmp_path_factory.mktemp("user")
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(root / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(root / "data"))


@pytest.fixture
def kernel():
    """chatui's CPU kernels (``inference.q8kernel``); they build on every x86-64 machine with a
    C compiler, CI's included."""
    from inference import q8kernel

    loaded = q8kernel.load_kernel()
    if loaded is None:
        skip_unless_ci("chatui's kernels do not build on this machine")
    return loaded


@pytest.fixture
def x86_gcc() -> str:
    """gcc on an x86-64 machine (to build the kernels for other x86 CPUs)."""
    import platform
    import shutil

    gcc = shutil.which("gcc")
    if platform.machine() != "x86_64" or gcc is None:
        skip_unless_ci("no x86-64 gcc here")
    return gcc


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The converted default model (SmolLM2-135M-Instruct), converted once per machine."""
    from inference.checkpoint import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, default_model_dir: Path) -> Path:
    """A randomly initialised 2-layer Llama with SmolLM2's tokenizer and chat template."""
    from transformers import AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-llama")
    tok = AutoTokenizer.from_pretrained(default_model_dir)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # spread the logits so sampling filters have something to do
        model.lm_head.weight.normal_(0, 0.15)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(eos_token_id=2, pad_token_id=2).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_ckpt(tiny_model_dir: Path):
    from inference.checkpoint import load_checkpoint

    return load_checkpoint(str(tiny_model_dir), device="cpu", dtype="float32")


@pytest.fixture
def tiny_backend(tiny_ckpt):
    """A fresh LocalBackend (empty cache) over the shared tiny model."""
    from inference.engine import LocalBackend

    return LocalBackend.from_checkpoint(tiny_ckpt)


@pytest.fixture(scope="session")
def default_ckpt(default_model_dir: Path):
    from inference.checkpoint import load_checkpoint

    return load_checkpoint(None, device="cpu", dtype="float32")


@pytest.fixture
def default_backend(default_ckpt):
    from inference.engine import LocalBackend

    return LocalBackend.from_checkpoint(default_ckpt)
