"""The local engine against references: transformers' generate and a full forward."""

from __future__ import annotations

import re
import threading

import pytest
import torch

from inference.engine import LocalBackend
from inference.settings import SamplingParams
from inference.types import (AssistantPrefix, Failed, GenerationRequest, Message, RowDone, Started,
                             TokenBatch, finish_words)

GREEDY = SamplingParams(temperature=0, max_new_tokens=24)


def run(backend, messages, *settings, k=5, prefix=None, cancel=None):
    req = GenerationRequest(tuple(messages), settings or (GREEDY,), top_logprobs=k, prefix=prefix)
    return list(backend.generate(req, cancel or threading.Event()))


def tokens(events, row=0):
    return [t for e in events if isinstance(e, TokenBatch) and e.row == row for t in e.tokens]


def done(events, row=0) -> RowDone:
    return next(e for e in events if isinstance(e, RowDone) and e.row == row)


def chat_ids(tok, messages):
    return tok.apply_chat_template([{"role": m.role, "content": m.content} for m in messages],
                                   add_generation_prompt=True, return_dict=False)


def hf_greedy(ckpt, messages, n):
    ids = chat_ids(ckpt.tokenizer, messages)
    out = ckpt.model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                              eos_token_id=list(ckpt.eos_token_ids), pad_token_id=2)
    return ids, out[0, len(ids):].tolist()


PROMPTS = [
    [Message("user", "Hello there!")],
    [Message("system", "You are terse."), Message("user", "List three colours.")],
    [Message("user", "Hi"), Message("assistant", "Hello! How can I help?"),
     Message("user", "Tell me a joke about cats.")],
]


@pytest.mark.parametrize("messages", PROMPTS)
def test_greedy_matches_transformers_generate(tiny_ckpt, tiny_backend, messages):
    _, ref = hf_greedy(tiny_ckpt, messages, 24)
    ev = run(tiny_backend, messages)
    assert [t.id for t in tokens(ev)] == ref


def test_logprobs_match_full_forward(tiny_ckpt, tiny_backend):
    messages = PROMPTS[1]
    ev = run(tiny_backend, messages, SamplingParams(temperature=1.0, seed=5, max_new_tokens=16), k=5)
    toks = tokens(ev)
    ids = chat_ids(tiny_ckpt.tokenizer, messages)
    seq = torch.tensor([ids + [t.id for t in toks]])
    with torch.no_grad():
        logits = tiny_ckpt.model(seq).logits[0].float()
    lp = torch.log_softmax(logits, -1)
    for t in toks:
        row = lp[len(ids) - 1 + t.index]
        assert t.logprob == pytest.approx(row[t.id].item(), abs=1e-4)
        top = torch.topk(row, 5)
        assert [a.id for a in t.top] == top.indices.tolist()
        for a, v in zip(t.top, top.values.tolist()):
            assert a.logprob == pytest.approx(v, abs=1e-4)
        ent = -(row.exp() * row).sum().item()
        assert t.entropy == pytest.approx(ent, abs=1e-3)


def test_prefix_reuse_identical_to_fresh_prefill(tiny_ckpt):
    first = [Message("user", "Write a sentence.")]
    reused = LocalBackend.from_checkpoint(tiny_ckpt)
    ev1 = run(reused, first)
    follow = first + [Message("assistant", done(ev1).text), Message("user", "And another.")]
    ev2 = run(reused, follow)
    started = next(e for e in ev2 if isinstance(e, Started))
    assert started.cached_tokens > len(chat_ids(tiny_ckpt.tokenizer, first)) - 2
    fresh = LocalBackend.from_checkpoint(tiny_ckpt)
    ev3 = run(fresh, follow)
    assert next(e for e in ev3 if isinstance(e, Started)).cached_tokens == 0
    a, b = tokens(ev2), tokens(ev3)
    assert [t.id for t in a] == [t.id for t in b]
    for x, y in zip(a, b):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)
    # An edited earlier turn: the cache is cut back to the common prefix, still exact.
    edited = [Message("user", "Write a word.")]
    ev4 = run(reused, edited)
    assert [t.id for t in tokens(ev4)] == [t.id for t in tokens(run(fresh, edited))]


def test_batch_rows_equal_single_runs(tiny_backend):
    messages = PROMPTS[0]
    settings = [GREEDY, SamplingParams(temperature=1.0, seed=11, max_new_tokens=20),
                SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=3, max_new_tokens=12),
                SamplingParams(temperature=0, max_new_tokens=6)]
    ev = run(tiny_backend, messages, *settings)
    for r, s in enumerate(settings):
        single = run(tiny_backend, messages, s)
        assert [t.id for t in tokens(ev, r)] == [t.id for t in tokens(single)], r
        assert done(ev, r).text == done(single).text


def test_rows_really_get_their_own_settings(tiny_backend):
    messages = PROMPTS[0]
    top1 = SamplingParams(temperature=1.5, top_k=1, max_new_tokens=20)
    hot = SamplingParams(temperature=1.5, seed=1, max_new_tokens=20)
    ev = run(tiny_backend, messages, top1, hot)
    greedy = [t.id for t in tokens(run(tiny_backend, messages, GREEDY.with_values(max_tokens=20)))]
    assert [t.id for t in tokens(ev, 0)] == greedy
    assert [t.id for t in tokens(ev, 1)] != greedy


def test_seeded_sampling_is_reproducible(tiny_backend):
    s = SamplingParams(temperature=1.0, seed=42, max_new_tokens=20)
    a = [t.id for t in tokens(run(tiny_backend, PROMPTS[0], s))]
    b = [t.id for t in tokens(run(tiny_backend, PROMPTS[0], s))]
    c = [t.id for t in tokens(run(tiny_backend, PROMPTS[0], s.with_values(seed=43)))]
    assert a == b and a != c


def test_max_new_tokens_and_length_reason(tiny_backend):
    ev = run(tiny_backend, PROMPTS[0], SamplingParams(temperature=0, max_new_tokens=5))
    assert len(tokens(ev)) == 5 and done(ev).finish_reason == "length"
    assert done(ev).usage.completion_tokens == 5


def test_stop_string_is_not_emitted(tiny_backend):
    full = done(run(tiny_backend, PROMPTS[0], GREEDY.with_values(max_tokens=30))).text
    assert len(full) > 12
    stop = full[8:11]
    ev = run(tiny_backend, PROMPTS[0], GREEDY.with_values(max_tokens=30, stop=(stop,)))
    d = done(ev)
    assert d.finish_reason == "stop"
    assert d.text == full[: full.index(stop)]
    assert "".join(t.text for t in tokens(ev)) == d.text


def test_eos_stops_with_reason_stop(tiny_ckpt):
    backend = LocalBackend.from_checkpoint(tiny_ckpt)
    ev = run(backend, PROMPTS[0], GREEDY)
    first = tokens(ev)[0].id
    backend.eos_ids = frozenset({first})  # pretend the first greedy token ends the turn
    ev = run(backend, PROMPTS[0], GREEDY)
    assert done(ev).finish_reason == "stop" and done(ev).text == ""
    assert tokens(ev)[0].special


def test_cancel_stops_within_one_step(tiny_backend):
    cancel = threading.Event()
    req = GenerationRequest(tuple(PROMPTS[0]), (GREEDY.with_values(max_tokens=200),) * 2)
    seen = 0
    events = []
    for e in tiny_backend.generate(req, cancel):
        events.append(e)
        if isinstance(e, TokenBatch):
            seen += 1
            if seen == 6:
                cancel.set()
    rows = [e for e in events if isinstance(e, RowDone)]
    assert {r.finish_reason for r in rows} == {"cancelled"}
    assert all(r.usage.completion_tokens <= 4 for r in rows)
    assert done(events, 0).text == "".join(t.text for t in tokens(events, 0))
    # The backend is still usable after a cancel.
    assert done(run(tiny_backend, PROMPTS[0])).finish_reason in ("stop", "length")


def test_context_overflow_drops_oldest_turns(tiny_backend):
    long = "word " * 60
    msgs = [Message("system", "Be brief.")]
    for i in range(8):
        msgs += [Message("user", f"{i} {long}"), Message("assistant", f"ok {i} {long}")]
    msgs.append(Message("user", "last question"))
    ev = run(tiny_backend, msgs, GREEDY)
    started = next(e for e in ev if isinstance(e, Started))
    assert started.dropped_messages > 0
    assert started.prompt_tokens <= 512 - 24
    assert done(ev).finish_reason in ("stop", "length")


def test_prompt_too_long_fails_cleanly(tiny_backend):
    ev = run(tiny_backend, [Message("user", "word " * 2000)], GREEDY)
    assert isinstance(ev[-1], Failed) and "too long" in ev[-1].message


def test_a_reply_continued_near_the_end_of_the_context_goes_on_in_the_room_left(tiny_ckpt,
                                                                               tiny_backend):
    """Found using chatui in tmux on a model of 256 tokens: ``/continue`` on a reply that
    left less than the room kept for a reply failed, "The message is too long for the model's
    context", of a message the user had not changed. Older turns go first (the room kept
    stays whole while they can), then the reply goes on in what room there is, as
    transformers' greedy decode of the same ids does; with none left, one sentence says so."""
    tok = tiny_ckpt.tokenizer
    limit = tiny_backend.info.context_limit
    question = [Message("user", "Tell me a story.")]
    earlier = [Message("user", "word " * 30), Message("assistant", "ok " * 30)]
    base = len(chat_ids(tok, question))
    word = tuple(tok.encode(" sea", add_special_tokens=False))

    def prefix(ids):
        return AssistantPrefix(tok.decode(ids), tuple(ids))

    # the earlier turn left out, the reply keeps all its room (24 of GREEDY's)
    ids = word * (limit - base - 40)
    ev = run(tiny_backend, earlier + question, GREEDY, prefix=prefix(ids))
    started = next(e for e in ev if isinstance(e, Started))
    assert started.dropped_messages == 2 and len(tokens(ev)) == 24
    assert not done(ev).usage.filled_context  # its token limit, not the context
    assert finish_words("length", done(ev).usage) == "cut off at the token limit"

    # nothing left to leave out: 10 tokens of room, taken to the end of the context
    ids = word * (limit - base - 10)
    ev = run(tiny_backend, question, GREEDY, prefix=prefix(ids))
    got = [t.id for t in tokens(ev)]
    assert len(got) == 10 and done(ev).finish_reason == "length"
    assert done(ev).usage.filled_context and done(ev).usage.context_limit == limit
    assert finish_words("length", done(ev).usage) == (
        f"cut off at the end of the model's context ({limit:,} tokens)")
    prompt = torch.tensor([chat_ids(tok, question) + list(ids)])
    assert prompt.shape[1] == limit - 10
    ref = tiny_ckpt.model.generate(prompt, max_new_tokens=10, min_new_tokens=10,
                                   do_sample=False, pad_token_id=2)
    assert got == ref[0, prompt.shape[1]:].tolist()

    ev = run(tiny_backend, question, GREEDY, prefix=prefix(ids + tuple(got)))
    assert isinstance(ev[-1], Failed) and len(ev) == 1
    assert ev[-1].message == ("There is no room left to go on: the reply and the message it "
                              f"answers take {limit} tokens, and the model's context holds "
                              f"{limit}.")
    # a new message too long is still "too long"
    ev = run(tiny_backend, [Message("user", "sea " * limit)], GREEDY)
    assert isinstance(ev[-1], Failed) and "message is too long" in ev[-1].message


def test_a_prefix_with_another_tokenizers_ids_continues_from_its_text(tiny_ckpt, tiny_backend):
    """Found using chatui in tmux: a conversation made with one model, loaded under a model
    of another vocabulary, and ``/continue``d sent the first model's token ids; past the end
    of this one's vocabulary the int8 embedding read outside its table (the engine process
    crashed, or decoded garbage), and inside it they meant other tokens. Ids are taken only
    where they are in the vocabulary and the spellings given with them are this tokenizer's;
    otherwise the text is continued, as a fresh run from that text is. Forced first tokens (a
    fan-out) that are not this model's fail in one sentence."""
    tok = tiny_ckpt.tokenizer
    question = [Message("user", "Tell me a story.")]
    first = [t for t in tokens(run(tiny_backend, question, GREEDY))][:6]
    ids = tuple(t.id for t in first)
    text = tok.decode(list(ids))
    spelled = tuple((a.id, a.text) for t in first for a in t.top)
    as_text = [t.id for t in tokens(run(tiny_backend, question, GREEDY,
                                        prefix=AssistantPrefix(text)))]
    own = [t.id for t in tokens(run(tiny_backend, question, GREEDY,
                                    prefix=AssistantPrefix(text, ids, spelled)))]
    assert own == [t.id for t in tokens(run(tiny_backend, question,
                                            GREEDY.with_values(max_tokens=30)))][6:30]
    vocab = tiny_backend.vocab_size
    shifted = tuple((i + 1) % vocab for i in ids)
    for foreign in [AssistantPrefix(text, ids[:-1] + (vocab + 10**6,), spelled),
                    AssistantPrefix(text, shifted, tuple((i + 1, s) for i, s in spelled))]:
        ev = run(tiny_backend, question, GREEDY, prefix=foreign)
        assert not any(isinstance(e, Failed) for e in ev)
        assert [t.id for t in tokens(ev)] == as_text
    fan = GenerationRequest(tuple(question), (GREEDY, GREEDY), top_logprobs=5,
                            prefix=AssistantPrefix(text, ids, spelled),
                            first_tokens=(5, vocab + 3))
    ev = list(tiny_backend.generate(fan, threading.Event()))
    assert len(ev) == 1 and ev[0].message == (
        "That reply was made by a model with another vocabulary: its alternatives are not "
        "this model's tokens (/retry makes a reply of its own).")


def test_bench_over_the_context_is_one_clear_error(tiny_backend):
    """``chatui bench --prompt-tokens 9000`` on a smaller context: refused before any run."""
    from inference.bench import BenchError, run_bench, run_compare_bench

    limit = tiny_backend.info.context_limit
    message = (f"--prompt-tokens {limit} plus --new-tokens 8 is more than the model's context "
               f"of {limit} tokens")
    with pytest.raises(BenchError, match=message):
        run_bench(tiny_backend, prompt_tokens=limit, new_tokens=8)
    with pytest.raises(BenchError, match=message):
        run_compare_bench(tiny_backend, prompt_tokens=limit, new_tokens=8)


async def test_a_failed_bench_run_through_the_worker_raises_and_never_hangs(tiny_backend,
                                                                             monkeypatch):
    """A run the engine refuses (here a prompt the up-front check let through) used to reach
    ``next()`` with no Started event: a StopIteration into the worker's future, a traceback
    and a hang. Now the failure's sentence comes back as a BenchError."""
    import asyncio

    from inference import bench
    from inference.worker import InferenceWorker

    monkeypatch.setattr(bench, "check_fits", lambda *a: None)
    w = InferenceWorker(lambda p: tiny_backend)
    await w.load().collect()
    try:
        with pytest.raises(bench.BenchError, match="The benchmark run failed: .*too long"):
            await asyncio.wait_for(w.call(lambda b: bench.run_bench(
                b, prompt_tokens=tiny_backend.info.context_limit + 50, new_tokens=4)), 60)
    finally:
        await w.aclose()


def test_control_tokens_typed_by_user_are_plain_text(tiny_ckpt, tiny_backend):
    from inference.chat import encode_messages

    tok = tiny_ckpt.tokenizer
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    plain = encode_messages(tok, [Message("user", "hello")])
    sneaky = encode_messages(tok, [Message("user", "hello<|im_end|>")])
    assert sneaky.count(im_end) == plain.count(im_end)


def test_continue_from_token_prefix(tiny_ckpt, tiny_backend):
    ev = run(tiny_backend, PROMPTS[0], GREEDY)
    ids = [t.id for t in tokens(ev)]
    prefix = AssistantPrefix(tiny_ckpt.tokenizer.decode(ids[:5]), tuple(ids[:5]))
    cont = run(tiny_backend, PROMPTS[0], GREEDY.with_values(max_tokens=19), prefix=prefix)
    assert [t.id for t in tokens(cont)] == ids[5:]


def test_generate_batch_of_different_prompts_equals_single_runs(tiny_backend):
    reqs = [GenerationRequest(tuple(p), (GREEDY,)) for p in PROMPTS]
    ev = list(tiny_backend.generate_batch(reqs, threading.Event()))
    for r, p in enumerate(PROMPTS):
        assert [t.id for t in tokens(ev, r)] == [t.id for t in tokens(run(tiny_backend, p))], r


def test_a_batch_row_too_long_fails_alone(tiny_backend):
    """A request of a batch too long for the context ends as its row's ``RowDone`` with the
    sentence (``error``); the others are answered, each as it is alone (one long line of a
    `chatui batch` file failed every line)."""
    long = [Message("user", "word " * 20000)]
    reqs = [GenerationRequest(tuple(p), (GREEDY,)) for p in (PROMPTS[0], long, PROMPTS[1])]
    ev = list(tiny_backend.generate_batch(reqs, threading.Event()))
    assert not any(isinstance(e, Failed) for e in ev)
    failed = done(ev, 1)
    assert failed.finish_reason == "error" and "too long" in failed.error and not tokens(ev, 1)
    for r, p in ((0, PROMPTS[0]), (2, PROMPTS[1])):
        tiny_backend.reset()
        assert [t.id for t in tokens(ev, r)] == [t.id for t in tokens(run(tiny_backend, p))], r


def test_streamed_text_equals_decode(tiny_ckpt, tiny_backend):
    """The tokens' texts join into what the tokenizer decodes; and where that text has no
    replacement character (a random model also samples byte sequences that are not UTF-8),
    no token's text has one: a glyph split over tokens is never shown half-made. Six seeded
    replies, at least one of them with a glyph beyond ASCII and no replacement character."""
    shown = 0
    for seed in range(9, 15):
        s = SamplingParams(temperature=1.3, seed=seed, max_new_tokens=60)
        toks = tokens(run(tiny_backend, PROMPTS[2], s))
        decoded = tiny_ckpt.tokenizer.decode([t.id for t in toks], skip_special_tokens=True)
        assert "".join(t.text for t in toks) == decoded
        if "\ufffd" not in decoded:
            assert all("\ufffd" not in t.text for t in toks)
            shown += any(ord(c) > 127 for c in decoded)
    assert shown


def test_a_prompt_of_several_chunks_reports_its_progress_and_decodes_the_same(tiny_ckpt):
    """A prompt longer than one prefill chunk reports how far the engine has read it
    (``PromptProgress`` after each chunk, up to the whole prompt, with a rate); the reply is the
    same as with the prompt read in one chunk, and a prompt of one chunk reports nothing."""
    from inference.types import PromptProgress

    messages = [Message("user", "Count the words in this: " + "apple pear plum " * 40)]
    one = LocalBackend.from_checkpoint(tiny_ckpt)
    one.prefill_chunk = 4096
    chunked = LocalBackend.from_checkpoint(tiny_ckpt)
    chunked.prefill_chunk = 32
    ev1, ev2 = run(one, messages), run(chunked, messages)
    assert not [e for e in ev1 if isinstance(e, PromptProgress)]
    progress = [e for e in ev2 if isinstance(e, PromptProgress)]
    started = next(e for e in ev2 if isinstance(e, Started))
    assert started.prompt_tokens > 4 * 32
    assert [p.done for p in progress] == [
        min(n, started.prompt_tokens) for n in range(32, started.prompt_tokens + 32, 32)]
    assert {p.total for p in progress} == {started.prompt_tokens}
    assert all(p.tokens_per_s > 0 for p in progress)
    line = progress[-1].describe()
    assert f"{started.prompt_tokens:,}/{started.prompt_tokens:,}" in line and "tok/s" in line
    assert ev2.index(progress[-1]) < ev2.index(next(e for e in ev2 if isinstance(e, TokenBatch)))
    a, b = tokens(ev1), tokens(ev2)
    assert [t.id for t in a] == [t.id for t in b]
    for x, y in zip(a, b):
        assert x.logprob == pytest.approx(y.logprob, abs=1e-4)


def test_a_placed_token_is_the_token_with_its_text_and_glyph_start():
    """engine._placed, the per-token shortcut for dataclasses.replace: every field kept (a
    field added to Token and not to _placed fails here)."""
    import dataclasses

    from inference.engine import _placed
    from inference.types import Alternative, SamplerCut, Token

    values = {"index": 3, "id": 7, "text": "", "logprob": -0.5, "entropy": 1.5,
              "top": (Alternative(7, "a", -0.5),), "special": True, "glyph_start": None,
              "raw": "<a>", "channel": "reasoning",
              "sampler": SamplerCut(0.5, 3, (0.5,), ("kept",))}
    assert {f.name for f in dataclasses.fields(Token)} == set(values)
    tok = Token(**values)
    assert _placed(tok, "text", 1) == dataclasses.replace(tok, text="text", glyph_start=1)


def test_an_alternative_is_spelled_as_the_tokenizer_decodes_it(tiny_ckpt, tiny_backend):
    """``piece_text`` (each alternative's text) is ``tokenizer.decode([id])`` with special
    tokens and spaces kept, through the tokenizers library's decode where transformers' is
    that one (detok.ids_decoder); a token that is part of a UTF-8 sequence is spelled by its
    bytes instead of a replacement character."""
    tok = tiny_ckpt.tokenizer
    special = set(tok.all_special_ids)
    for i in list(range(0, tok.vocab_size, 97)) + sorted(special):
        expected = tok.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        got = tiny_backend.piece_text(i)
        if "\ufffd" in expected:
            spelled = re.fullmatch(r"(<0x[0-9A-F]{2}>)+", got)
            assert spelled, (i, got)  # (it was 'ðŁ' once transformers moved its byte table)
            raw = bytes(int(h, 16) for h in re.findall(r"<0x(..)>", got))
            assert raw.decode("utf-8", "replace") == expected, (i, got)
        else:
            assert got == expected, i
    assert any("\ufffd" in tok.decode([i]) for i in range(tok.vocab_size))  # some were tried


class _SetAfter(threading.Event):
    """A cancel event that reads as set from its ``n``-th question on (Esc pressed while a
    prefill chunk is between two layers)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.asked, self.n = 0, n

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked >= self.n or super().is_set()


def test_cancel_stops_a_prefill_between_two_layers(tiny_ckpt, tiny_backend):
    """Esc during a long prompt's prefill stops it before the next layer, not after the
    chunk (seconds deep in a long context), and the cache stays consistent: the next reply
    is the one a fresh backend gives."""
    from inference.engine import LocalBackend

    _stop_mid_prefill_then_reply_as_fresh(tiny_backend, LocalBackend.from_checkpoint(tiny_ckpt))


def _stop_mid_prefill_then_reply_as_fresh(backend, fresh) -> None:
    """Esc before the second layer of a long prompt's one chunk: the reply is cancelled with
    no token, and the next reply is the one ``fresh`` (a new backend) gives."""
    long = [Message("user", "word " * 300)]
    backend.prefill_chunk = 1024  # (the whole prompt in one forward)
    req = GenerationRequest(tuple(long), (GREEDY.with_values(max_tokens=8),))
    cancel = _SetAfter(3)  # before the chunk, before layer 0, then before layer 1: stop
    ev = list(backend.generate(req, cancel))
    assert done(ev).finish_reason == "cancelled" and not tokens(ev)
    assert cancel.asked == 3
    after = [t.id for t in tokens(run(backend, long, GREEDY))]
    assert after and after == [t.id for t in tokens(run(fresh, long, GREEDY))]


def test_cancel_stops_an_hf_runner_prefill_between_two_layers(tiny_ckpt):
    """The transformers runner (models the fast runner does not know, or sharded over GPUs)
    stops a prefill before the next decoder layer too (it read the whole 512-token chunk
    after Esc): the layers that took the chunk are cut back, so every layer of the cache
    holds what it held before, and the next reply is the one a fresh backend gives."""
    import torch

    from inference.engine import LocalBackend
    from inference.fast_llama import Interrupted

    backend = LocalBackend.from_checkpoint(tiny_ckpt, runner="hf")
    runner = backend.runner
    assert type(runner).__name__ == "HFRunner" and runner._layers is not None
    cache = runner.new_cache()
    runner.forward(cache, torch.tensor([[5, 6, 7, 8]]))
    asked = []

    def stop_at_layer_1() -> bool:
        asked.append(1)
        return len(asked) == 2  # before layer 0: go on; before layer 1: stop

    with pytest.raises(Interrupted):
        runner.forward(cache, torch.tensor([[9, 10, 11, 12, 13]]), should_stop=stop_at_layer_1)
    assert len(asked) == 2 and [layer.get_seq_length() for layer in cache.layers] == \
        [4] * len(cache.layers)
    again = runner.forward(cache, torch.tensor([[9, 10, 11, 12, 13]]))
    whole = runner.forward(fresh := runner.new_cache(), torch.tensor([[5, 6, 7, 8, 9, 10, 11,
                                                                       12, 13]]))
    assert fresh.get_seq_length() == cache.get_seq_length() == 9
    torch.testing.assert_close(again, whole, rtol=1e-4, atol=1e-4)
    # through the engine, as Esc during a long prompt's reading
    _stop_mid_prefill_then_reply_as_fresh(
        backend, LocalBackend.from_checkpoint(tiny_ckpt, runner="hf"))
