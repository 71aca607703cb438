"""Reasoning and answer split on token ids (issue 17, section 1).

Two tiny random models share SmolLM2's tokenizer with markers added: one with ``<think>`` /
``</think>`` (added tokens that are not special, as Qwen3's are) and a Qwen3-like template
(``enable_thinking``, ``reasoning_content``), one with harmony's channel tokens. The decode
loop's choices are forced by a runner that adds a large logit to a scripted id at each step,
so every reply is exactly the id sequence a test names, and the split is checked against
``tokenizer.decode`` of the reasoning's and the answer's own ids.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from inference.engine import LocalBackend
from inference.reasoning import ChannelSplitter, Decision, detect_format
from inference.settings import SamplingParams
from inference.types import (AssistantPrefix, GenerationRequest, Message, ModelInfo, RowDone,
                             TokenBatch)

QWEN3_LIKE = (
    "{%- set ns = namespace(last_query=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_query = loop.index0 %}"
    "{%- endif %}{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- set rc = m.reasoning_content if m.reasoning_content is string else '' %}"
    "{%- if loop.index0 > ns.last_query and rc %}"
    "{{- '<|im_start|>assistant\n<think>\n' + rc + '\n</think>\n\n' + m.content + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>assistant\n' + m.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"
)
"""Qwen3's template, cut to what concerns reasoning: an assistant turn's
``reasoning_content`` is kept only after the last user message (so an earlier turn's
reasoning never reaches the prompt), and ``enable_thinking=false`` closes an empty think
block in the generation prompt."""

R1_LIKE = QWEN3_LIKE.replace(
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n<think>\n' }}")
"""A template that opens the reply inside ``<think>`` (DeepSeek-R1's generation prompt)."""

HARMONY = (
    "{%- for m in messages %}"
    "{{- '<|start|>' + m.role + '<|message|>' + m.content + '<|end|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start|>assistant' }}{%- endif %}"
)


def _tiny(out: Path, tok) -> Path:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    GenerationConfig(eos_token_id=2, pad_token_id=2).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def think_dir(tmp_path_factory, default_model_dir) -> Path:
    from transformers import AutoTokenizer
    from tokenizers import AddedToken

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    tok.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    tok.chat_template = QWEN3_LIKE
    return _tiny(tmp_path_factory.mktemp("tiny-think"), tok)


@pytest.fixture(scope="session")
def harmony_dir(tmp_path_factory, default_model_dir) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    tok.add_special_tokens({"additional_special_tokens": [
        "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"]})
    tok.chat_template = HARMONY
    return _tiny(tmp_path_factory.mktemp("tiny-harmony"), tok)


class ForcedRunner:
    """A runner whose every next token is scripted: the real model runs (so the cache and
    the statistics are real) and a large logit is added to the script's id."""

    def __init__(self, inner, script: list[int]) -> None:
        self.inner, self.script, self.step = inner, list(script), 0
        self.device = inner.device

    def new_cache(self):
        return self.inner.new_cache()

    def can_crop(self, cache) -> bool:
        return self.inner.can_crop(cache)

    def close(self) -> None:
        self.inner.close()

    def forward(self, cache, x, **kw):
        logits = self.inner.forward(cache, x, **kw).clone()
        if x.shape[1] > 1:  # the rest of a prompt (its last token is fed alone, as a step)
            return logits
        if self.step < len(self.script):
            logits[:, self.script[self.step]] += 1e4
        self.step += 1
        return logits


def backend(path: Path, script: list[int]) -> LocalBackend:
    from inference.checkpoint import load_checkpoint
    from inference.runner import HFRunner

    ckpt = load_checkpoint(str(path), device="cpu", dtype="float32")
    info = ModelInfo(name="tiny", backend="local", device="cpu", dtype="float32",
                     context_limit=512)
    runner = ForcedRunner(HFRunner(ckpt.model), script)
    return LocalBackend(ckpt.model, ckpt.tokenizer, eos_token_ids=ckpt.eos_token_ids,
                        info=info, runner=runner)


def generate(b: LocalBackend, *, max_tokens=64, budget=None, thinking=None, prefix=None,
             messages=(Message("user", "Hi"),)):
    s = SamplingParams(temperature=0, max_new_tokens=max_tokens, reasoning_budget=budget)
    events = list(b.generate(GenerationRequest(tuple(messages), (s,), 3, prefix=prefix,
                                               thinking=thinking), threading.Event()))
    toks = [t for e in events if isinstance(e, TokenBatch) for t in e.tokens]
    done = next(e for e in events if isinstance(e, RowDone))
    return toks, done


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def split_text(toks, channel):
    return "".join(t.text for t in toks if t.channel == channel and not t.special)


# ---- detection ----


def test_detects_think_and_harmony_markers_and_the_template_switch(think_dir, harmony_dir,
                                                                   tiny_ckpt):
    from transformers import AutoTokenizer

    think = detect_format(AutoTokenizer.from_pretrained(think_dir))
    assert think is not None and think.kind == "think" and think.switch
    assert think.history_key == "reasoning_content"
    harmony = detect_format(AutoTokenizer.from_pretrained(harmony_dir))
    assert harmony is not None and harmony.kind == "harmony" and not harmony.switch
    assert detect_format(tiny_ckpt.tokenizer) is None  # SmolLM2 marks no reasoning


# ---- the think format ----


def test_think_reply_splits_exactly_on_the_marker_ids(think_dir):
    b = backend(think_dir, [])
    tok = b.tokenizer
    reasoning, answer = ids_of(tok, "\nThe user greets me. Say hi.\n"), ids_of(tok, "\n\nHello!")
    script = [b.reasoning.open_id, *reasoning, b.reasoning.close_id, *answer, 2]
    b.runner.script = script
    toks, done = generate(b)
    assert [t.id for t in toks] == script
    assert split_text(toks, "reasoning") == tok.decode(reasoning)
    assert split_text(toks, "answer") == tok.decode(answer) == done.text
    markers = [t for t in toks if t.id in (b.reasoning.open_id, b.reasoning.close_id)]
    assert all(t.special and t.text == "" and t.channel == "reasoning" for t in markers)
    assert [t.raw for t in markers] == ["<think>", "</think>"]
    assert b.info.reasoning == "think" and b.info.thinking_switch


def test_text_that_spells_a_marker_is_not_a_marker(think_dir):
    """``</think>`` written with ordinary tokens stays in the reasoning (a text parser
    would end the reasoning there and leak the rest into the answer)."""
    b = backend(think_dir, [])
    tok = b.tokenizer
    fake = ids_of(tok, "a </") + ids_of(tok, "think") + ids_of(tok, "> b")
    assert b.reasoning.close_id not in fake
    b.runner.script = [b.reasoning.open_id, *fake, b.reasoning.close_id, *ids_of(tok, "ok"), 2]
    toks, done = generate(b)
    assert split_text(toks, "reasoning") == "a </think> b"
    assert done.text == "ok"


def test_a_glyph_cut_by_the_marker_stays_in_the_reasoning(think_dir):
    """The marker arrives while the detokenizer holds an incomplete UTF-8 glyph: its bytes
    are flushed into the reasoning's tokens, and the answer starts clean."""
    b = backend(think_dir, [])
    tok = b.tokenizer
    glyph = next(ids for ids in (ids_of(tok, c) for c in "🙂😀🤔漢字") if len(ids) >= 2)
    answer = ids_of(tok, "Fine.")
    b.runner.script = [b.reasoning.open_id, *ids_of(tok, "hm"), glyph[0],
                       b.reasoning.close_id, *answer, 2]
    toks, done = generate(b)
    assert split_text(toks, "reasoning") == tok.decode(ids_of(tok, "hm") + [glyph[0]])
    assert split_text(toks, "answer") == done.text == "Fine."
    assert all(t.channel == "reasoning" for t in toks[:4])


def test_a_reply_stopped_inside_the_reasoning_has_no_answer(think_dir):
    b = backend(think_dir, [])
    tok = b.tokenizer
    reasoning = ids_of(tok, "Let me think about this for a long while")
    b.runner.script = [b.reasoning.open_id, *reasoning]
    toks, done = generate(b, max_tokens=1 + 5)
    assert done.finish_reason == "length"
    assert done.text == "" and split_text(toks, "answer") == ""
    assert split_text(toks, "reasoning") == tok.decode(reasoning[:5])


def test_a_template_that_opens_the_reply_in_think_starts_in_the_reasoning(think_dir):
    b = backend(think_dir, [])
    tok = b.tokenizer
    tok.chat_template = R1_LIKE
    reasoning, answer = ids_of(tok, "Short thought."), ids_of(tok, "Answer.")
    b.runner.script = [*reasoning, b.reasoning.close_id, *answer, 2]
    toks, done = generate(b)
    assert split_text(toks, "reasoning") == "Short thought."
    assert done.text == "Answer."


@pytest.mark.parametrize("budget", [0, 1, 4])
def test_the_reasoning_budget_inserts_the_marker_after_exactly_n_tokens(think_dir, budget):
    b = backend(think_dir, [])
    tok = b.tokenizer
    long = ids_of(tok, " word" * 20)
    answer = ids_of(tok, "Done.")
    # the script never closes the reasoning: the budget must; after the forced marker the
    # model is asked for the answer (the script's positions after the budget)
    b.runner.script = [b.reasoning.open_id, *long[:budget], 0, *answer, 2]
    toks, done = generate(b, budget=budget)
    assert [t.id for t in toks[:budget + 2]] == [b.reasoning.open_id, *long[:budget],
                                                 b.reasoning.close_id]
    assert sum(1 for t in toks if t.channel == "reasoning" and not t.special) == budget
    assert done.text == "Done."


def test_the_budget_counts_from_a_template_opened_think(think_dir):
    b = backend(think_dir, [])
    tok = b.tokenizer
    tok.chat_template = R1_LIKE
    b.runner.script = [*ids_of(tok, " a b c d e f"), *ids_of(tok, "Ok"), 2]
    toks, done = generate(b, budget=2)
    assert [t.id for t in toks[:3]][2] == b.reasoning.close_id
    assert split_text(toks, "reasoning") == tok.decode(ids_of(tok, " a b c d e f")[:2])


def test_enable_thinking_reaches_the_template_and_reasoning_stays_out_of_history(think_dir):
    from inference.chat import TemplateOptions, encode_messages

    b = backend(think_dir, [])
    tok = b.tokenizer
    msgs = (Message("user", "Hi"), Message("assistant", "Hello", reasoning="SECRET THOUGHT"),
            Message("user", "Again"))
    opts = TemplateOptions(thinking=False, reasoning_key="reasoning_content")
    text = tok.decode(encode_messages(tok, msgs, options=opts))
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "SECRET" not in text  # Qwen3's template drops an earlier turn's reasoning
    # the template is given the reasoning: one that keeps it (after the last user message)
    kept = (Message("user", "Hi"), Message("assistant", "Hello", reasoning="KEPT"))
    text = tok.decode(encode_messages(tok, kept, prefix=AssistantPrefix("", ()),
                                      options=opts))
    assert "<think>\nKEPT\n</think>" in text
    # and the engine passes the switch (the scripted reply then begins in the answer)
    b.runner.script = [*ids_of(tok, "Hi."), 2]
    toks, done = generate(b, thinking=False)
    assert done.text == "Hi." and all(t.channel == "answer" for t in toks)


def test_continue_from_inside_the_reasoning_stays_in_the_reasoning(think_dir):
    b = backend(think_dir, [])
    tok = b.tokenizer
    prefix_ids = (b.reasoning.open_id, *ids_of(tok, "So far"))
    b.runner.script = [*ids_of(tok, " more"), b.reasoning.close_id, *ids_of(tok, "Yes"), 2]
    toks, done = generate(b, prefix=AssistantPrefix("", prefix_ids))
    assert split_text(toks, "reasoning") == " more"
    assert done.text == "Yes"


# ---- harmony channels ----


def test_harmony_channels_split_by_header_with_a_name_spelled_in_pieces(harmony_dir):
    b = backend(harmony_dir, [])
    tok = b.tokenizer
    f = b.reasoning
    special = {n: tok.convert_tokens_to_ids(n) for n in ("<|return|>",)}
    analysis = ids_of(tok, "anal") + ids_of(tok, "ysis")  # the name in two pieces
    final = ids_of(tok, "fin") + ids_of(tok, "al")
    reasoning, answer = ids_of(tok, "User says hi."), ids_of(tok, "Hello there!")
    script = [f.channel_id, *analysis, f.message_id, *reasoning, f.end_id,
              f.start_id, *ids_of(tok, "assistant"), f.channel_id, *final, f.message_id,
              *answer, special["<|return|>"]]
    b.runner.script = script
    b.eos_ids = frozenset(b.eos_ids | {special["<|return|>"]})
    toks, done = generate(b)
    assert [t.id for t in toks] == script
    assert split_text(toks, "reasoning") == tok.decode(reasoning)
    assert split_text(toks, "answer") == done.text == tok.decode(answer)
    header = toks[: 2 + len(analysis)]
    assert all(t.special and t.channel == "reasoning" for t in header)
    final_header_end = script.index(f.message_id, len(analysis) + 2) + 1
    assert all(t.special and t.text == "" for t in toks[len(analysis) + 2 + len(reasoning):
                                                        final_header_end])


def test_harmony_stopped_inside_a_header_releases_it_as_markers(harmony_dir):
    b = backend(harmony_dir, [])
    tok = b.tokenizer
    f = b.reasoning
    b.runner.script = [f.channel_id, *ids_of(tok, "analysis"), f.message_id,
                       *ids_of(tok, "Think"), f.end_id, f.start_id]
    n = 2 + len(ids_of(tok, "analysis")) + len(ids_of(tok, "Think")) + 2
    toks, done = generate(b, max_tokens=n)
    assert len(toks) == n and done.text == ""
    assert split_text(toks, "reasoning") == "Think"
    assert toks[-1].special and toks[-1].channel == "reasoning"


def test_harmony_budget_inserts_end_and_the_final_header(harmony_dir):
    b = backend(harmony_dir, [])
    tok = b.tokenizer
    f = b.reasoning
    script = [f.channel_id, *ids_of(tok, "analysis"), f.message_id, *ids_of(tok, " x" * 10)]
    b.runner.script = script + [0] * len(f.close_ids) + ids_of(tok, "Ok") + [2]
    toks, done = generate(b, budget=3)
    head = 2 + len(ids_of(tok, "analysis"))
    assert [t.id for t in toks[head + 3: head + 3 + len(f.close_ids)]] == list(f.close_ids)
    assert split_text(toks, "reasoning") == tok.decode(ids_of(tok, " x" * 10)[:3])
    assert done.text == "Ok"


# ---- the splitter alone, on id sequences ----


def test_splitter_on_id_sequences():
    from inference.reasoning import ReasoningFormat

    fmt = ReasoningFormat("harmony", start_id=1, channel_id=2, message_id=3, end_id=4,
                          header_stops=(3,), reasoning_names=((10, 11),))
    s = ChannelSplitter(fmt)
    s.feed_prompt([1, 50, 3, 60, 4, 1, 51])  # ... <|start|>assistant (an open header)
    assert s.push(2) == [] and s.push(10) == [] and s.push(11) == []
    assert s.push(3) == [Decision("reasoning", True)] * 4  # the prompt's part is not held
    assert s.push(70) == [Decision("reasoning", False)] and s.reasoning_tokens == 1
    assert s.push(4) == [Decision("reasoning", True)]
    assert s.push(1) == [] and s.push(2) == [] and s.push(12) == []
    assert s.flush() == [Decision("reasoning", True)] * 3


# ---- headless ----


def _chatui(*args: str):
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "chatui", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_generate_json_tags_every_token_with_its_channel():
    import json

    from inference.scripted import echo_reply, split_tokens

    r = _chatui("generate", "-p", "hi", "--backend", "scripted", "--think", "on", "--json")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    toks = [x for x in lines if x["type"] == "token"]
    reasoning, answer = echo_reply(GenerationRequest((Message("user", "hi"),), thinking=True), 0)
    assert [t["channel"] for t in toks] == (["reasoning"] * (len(split_tokens(reasoning)) + 2)
                                            + ["answer"] * len(split_tokens("\n\n" + answer)))
    assert toks[0]["special"] and toks[0]["text"] == ""
    assert "".join(t["text"] for t in toks if t["channel"] == "answer") == "\n\n" + answer
    assert lines[-1]["type"] == "done"


def test_generate_plain_text_shows_the_reasoning_under_a_header_or_hides_it():
    from inference.scripted import echo_reply

    reasoning, answer = echo_reply(GenerationRequest((Message("user", "hi"),), thinking=True), 0)
    r = _chatui("generate", "-p", "hi", "--backend", "scripted", "--think", "on")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"Reasoning:\n{reasoning}\n\nAnswer:\n{answer}\n"  # not a tty: no dim
    r = _chatui("generate", "-p", "hi", "--backend", "scripted", "--think", "on",
                "--hide-reasoning", "--reasoning-budget", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout == answer + "\n"
    r = _chatui("generate", "-p", "hi", "--backend", "scripted", "--think", "maybe")
    assert r.returncode == 2 and "--think takes on or off" in r.stderr


# ---- transcripts and exports ----


def _reasoning_conversation():
    from chatui.conversation import Conversation
    from inference.types import Token

    conv = Conversation()
    conv.add_user("6 x 7?")
    entry = conv.add_assistant([SamplingParams(reasoning_budget=64)])
    reply = entry.reply
    reply.tokens = [Token(0, 5, "", -0.1, 0.2, special=True, raw="<think>", channel="reasoning"),
                    Token(1, 6, "Six sevens.", -0.5, 1.0, channel="reasoning"),
                    Token(2, 7, "", -0.1, 0.2, special=True, raw="</think>", channel="reasoning"),
                    Token(3, 8, "42", -0.2, 0.5)]
    reply.text, reply.reasoning, reply.reasoning_s = "42", "Six sevens.", 1.25
    reply.finish_reason = "stop"
    return conv


def test_transcript_keeps_the_reasoning_and_old_files_still_read():
    import json

    from chatui.transcript import from_json_dict, to_json_dict

    conv = _reasoning_conversation()
    doc = to_json_dict(conv)
    reply = doc["messages"][1]["replies"][0]
    assert reply["reasoning"] == "Six sevens." and reply["reasoning_s"] == 1.25
    assert reply["settings"]["reasoning_budget"] == 64
    back = from_json_dict(json.loads(json.dumps(doc)))
    assert back == conv
    assert [t.channel for t in back.entries[1].reply.tokens] == ["reasoning"] * 3 + ["answer"]
    # tokens as objects (files written before the token columns) carry "channel" keys
    reply["tokens"] = [
        {"index": t.index, "id": t.id, "text": t.text, "logprob": t.logprob,
         "entropy": t.entropy, "top": [[a.id, a.text, a.logprob] for a in t.top],
         "special": t.special, "raw": t.raw,
         **({"channel": "reasoning"} if t.channel == "reasoning" else {})}
        for t in back.entries[1].reply.tokens]
    assert [t.get("channel") for t in reply["tokens"]] == ["reasoning"] * 3 + [None]
    assert from_json_dict(json.loads(json.dumps(doc))) == conv
    # a file without the optional keys (every file before them) reads as before
    for t in reply["tokens"]:
        t.pop("channel", None)
    del reply["reasoning"], reply["reasoning_s"], reply["settings"]["reasoning_budget"]
    old = from_json_dict(doc)
    assert old.entries[1].reply.reasoning == "" and old.entries[1].text == "42"
    # a bad channel is one sentence
    reply["tokens"][0]["channel"] = "thoughts"
    with pytest.raises(Exception, match='must be "reasoning" or "answer"'):
        from_json_dict(doc)
    # the settings of a reply without a budget carry no key for it
    assert "reasoning_budget" not in SamplingParams().to_dict()


def test_markdown_export_folds_the_reasoning_and_messages_carry_it():
    from chatui.export import export_markdown, export_messages

    md = export_markdown(_reasoning_conversation())
    assert ("<details><summary>Reasoning · 1 token · 1.2 s</summary>\n\nSix sevens.\n\n"
            "</details>\n\n42") in md
    msgs = export_messages(_reasoning_conversation())
    assert msgs[-1] == {"role": "assistant", "content": "42", "reasoning_content": "Six sevens."}


def test_reasoning_budget_setting_values():
    from inference.settings import SettingsError

    s = SamplingParams().with_values(reasoning_budget="12")
    assert s.reasoning_budget == 12 and "reasoning_budget=12" in s.describe()
    assert s.with_values(reasoning_budget="none").reasoning_budget is None
    assert s.with_values(reasoning_budget="-1").reasoning_budget is None  # llama.cpp's "no limit"
    with pytest.raises(SettingsError, match="reasoning_budget must be a whole number between"):
        s.with_values(reasoning_budget="-5")
    assert "reasoning_budget" not in SamplingParams().describe()


def test_the_budget_in_the_pipelined_loop_gives_the_same_reply(think_dir):
    """The loop that queues step t + 1 before reading token t (CUDA's) forces the marker at
    the same step as the plain loop."""
    replies = []
    for pipeline in (False, True):
        b = backend(think_dir, [])
        b.pipeline = pipeline
        tok = b.tokenizer
        b.runner.script = [b.reasoning.open_id, *ids_of(tok, " a b c"), 0,
                           *ids_of(tok, "Ok"), 2]
        toks, done = generate(b, budget=3)
        replies.append(([t.id for t in toks], [t.channel for t in toks], done.text))
    assert replies[0] == replies[1]
    assert replies[0][0][4] == b.reasoning.close_id and replies[0][2] == "Ok"
