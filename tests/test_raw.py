"""Raw completion (issue 17, part 2): a plain prompt continued with no chat template, equal to
transformers' ``generate`` on the same ids; the ChatML fallback starts with the tokenizer's BOS."""

from __future__ import annotations

import copy
import json
import threading

import pytest
import torch

from inference.chat import GENERIC_CHAT_TEMPLATE, PromptTooLongError, encode_raw
from inference.engine import LocalBackend
from inference.settings import SamplingParams
from inference.types import Failed, GenerationRequest, Message, RowDone, Started, TokenBatch

TEXT = "Once upon a time, in a small village by the sea,"


def raw_request(text=TEXT, n=16, **kw):
    return GenerationRequest((Message("user", text),),
                             (SamplingParams(temperature=0, max_new_tokens=n),), raw=True, **kw)


def test_raw_greedy_equals_transformers_generate(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    events = list(backend.generate(raw_request(), threading.Event()))
    ids = tiny_ckpt.tokenizer(TEXT)["input_ids"]
    started = next(e for e in events if isinstance(e, Started))
    assert started.prompt_tokens == len(ids)
    got = [t.id for e in events if isinstance(e, TokenBatch) for t in e.tokens]
    out = tiny_ckpt.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False,
                                   eos_token_id=list(tiny_ckpt.eos_token_ids), pad_token_id=2)
    assert got == out[0, len(ids):].tolist()


def test_raw_prompt_is_the_tokenizers_encoding():
    class Tok:
        def __call__(self, text, add_special_tokens):
            assert add_special_tokens
            return {"input_ids": [1] + [ord(c) for c in text]}  # BOS as this tokenizer adds it

    assert encode_raw(Tok(), "ab", 10).ids == [1, 97, 98]
    with pytest.raises(PromptTooLongError, match="too long"):
        encode_raw(Tok(), "abcdef", 4)


def test_a_raw_request_takes_one_message_and_no_prefix():
    from inference.types import AssistantPrefix

    with pytest.raises(ValueError, match="one plain text"):
        GenerationRequest((Message("system", "s"), Message("user", "u")), raw=True)
    with pytest.raises(ValueError, match="one plain text"):
        GenerationRequest((Message("user", "u"),), raw=True, prefix=AssistantPrefix("x"))


def test_raw_too_long_is_one_sentence(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    events = list(backend.generate(raw_request("word " * 600), threading.Event()))
    assert len(events) == 1 and isinstance(events[0], Failed)
    assert events[0].message.startswith("The text fills the model's context: it takes ")
    assert events[0].message.endswith("tokens, and the model holds 512.")


def test_a_text_near_the_end_of_the_context_is_continued_in_the_room_left(tiny_ckpt):
    """A notebook's document past the room kept for a continuation (the context less
    max_tokens) was refused, "too long", with room still left: it is continued to the end of
    the context, as a reply continued there is."""
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    tok = tiny_ckpt.tokenizer
    text = "word" + " word" * 500
    n = len(tok(text, add_special_tokens=True)["input_ids"])
    assert 512 - 16 < n < 512  # over the budget that keeps 16 new tokens, under the context
    events = list(backend.generate(raw_request(text), threading.Event()))
    done = [e for e in events if isinstance(e, RowDone)]
    assert len(done) == 1 and done[0].finish_reason == "length"
    assert done[0].usage.completion_tokens == 512 - n and done[0].usage.filled_context


def test_chatml_fallback_starts_with_the_tokenizers_bos(tiny_ckpt):
    tok = copy.deepcopy(tiny_ckpt.tokenizer)
    tok.chat_template = GENERIC_CHAT_TEMPLATE
    msgs = [{"role": "user", "content": "hi"}]
    tok.bos_token = "<|endoftext|>"
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    assert ids[0] == tok.bos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.decode(ids[1:]) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tok.bos_token = None
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_openai_backend_refuses_raw_in_one_sentence():
    from inference.openai_backend.backend import OpenAIBackend

    backend = OpenAIBackend.__new__(OpenAIBackend)
    events = list(backend.generate(raw_request(), threading.Event()))
    assert len(events) == 1 and "Raw completion is not available" in events[0].message


def chatui(*args: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "chatui", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_cli_generate_raw_json(tiny_ckpt, tiny_model_dir):
    r = chatui("generate", "--raw", "-p", TEXT, "--ckpt", str(tiny_model_dir), "--quantize",
               "none", "--temperature", "0", "--max-tokens", "8", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    ids = tiny_ckpt.tokenizer(TEXT)["input_ids"]
    out = tiny_ckpt.model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                   eos_token_id=list(tiny_ckpt.eos_token_ids), pad_token_id=2)
    assert [x["id"] for x in lines if x["type"] == "token"] == out[0, len(ids):].tolist()
    assert lines[-1]["type"] == "done" and lines[-1]["prompt_tokens"] == len(ids)


def test_cli_generate_raw_refuses_a_system_prompt():
    r = chatui("generate", "--raw", "-p", "x", "--system", "s", "--backend", "scripted")
    assert r.returncode == 2 and "--raw continues a plain text" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_batch_raw_matches_generate_raw(tiny_model_dir, tmp_path):
    prompts = [TEXT, "The capital of France is"]
    (tmp_path / "p.txt").write_text("\n".join(prompts) + "\n")
    r = chatui("batch", "--raw", "--input-file", str(tmp_path / "p.txt"), "--ckpt",
               str(tiny_model_dir), "--quantize", "none", "--temperature", "0", "--max-tokens",
               "6")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    single = chatui("generate", "--raw", "-p", prompts[1], "--ckpt", str(tiny_model_dir),
                    "--quantize", "none", "--temperature", "0", "--max-tokens", "6", "--json")
    assert single.returncode == 0, single.stderr
    events = [json.loads(x) for x in single.stdout.splitlines()]
    assert "".join(e["text"] for e in events if e["type"] == "token") == rows[1]["text"]
    assert rows[1]["prompt_tokens"] == events[-1]["prompt_tokens"]
