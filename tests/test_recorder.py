"""The reply recorder: the one place engine events change replies (pure, no UI)."""

from __future__ import annotations

import dataclasses

import pytest

from chatui.conversation import Entry, Reply
from chatui.recorder import (
    ContextReported,
    ReplyRecorder,
    RowEnded,
    TokensAdded,
    branch,
)
from inference.settings import SamplingParams
from inference.types import Alternative, Failed, RowDone, Started, Token, TokenBatch, Usage

USAGE = Usage(3, 2, 0, 0.1, 10.0)


def tok(i: int, text: str, special: bool = False) -> Token:
    return Token(i, 100 + i, text, -0.5, 0.1,
                 (Alternative(100 + i, text, -0.5), Alternative(7, "alt", -1.5)), special=special)


def test_tokens_build_the_text_and_come_out_as_frozen_deltas():
    reply = Reply(SamplingParams())
    rec = ReplyRecorder([reply])
    rec.begin()
    delta = rec.apply(TokenBatch(0, (tok(0, "Hi"), tok(1, "!"), tok(2, "", special=True))))
    assert isinstance(delta, TokensAdded) and delta.text == "Hi!"
    assert reply.text == "Hi!" and len(reply.tokens) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        delta.text = "x"  # type: ignore[misc]
    assert rec.apply(RowDone(0, "stop", "", USAGE)) == RowEnded(0)
    assert reply.finish_reason == "stop" and reply.usage == USAGE and reply.text == "Hi!"
    assert not rec.finish()


def test_a_continued_reply_is_numbered_and_finished_after_what_it_had():
    reply = Reply(SamplingParams(), text="Hello", tokens=[tok(0, "Hello")],
                  finish_reason="length")
    rec = ReplyRecorder([reply])
    rec.begin()
    assert reply.finish_reason is None
    delta = rec.apply(TokenBatch(0, (tok(0, " world"),)))
    assert isinstance(delta, TokensAdded) and delta.tokens[0].index == 1
    assert reply.text == "Hello world"
    rec.apply(RowDone(0, "stop", " world.", USAGE))  # the engine's text of the new part
    assert reply.text == "Hello world."
    rec.apply(RowDone(0, "stop", "Hello world!", USAGE))  # or of the whole reply
    assert reply.text == "Hello world!"
    assert rec.produced


def test_rows_of_a_comparison_and_a_failure_that_ends_only_running_rows():
    a, b = Reply(SamplingParams()), Reply(SamplingParams(temperature=0))
    rec = ReplyRecorder([a, b])
    rec.begin()
    started = rec.apply(Started(rows=2, prompt_tokens=9, cached_tokens=0, dropped_messages=1,
                                context_limit=64))
    assert started == ContextReported(9, 64, 1)
    rec.apply(TokenBatch(1, (tok(0, "B"),)))
    rec.apply(RowDone(1, "stop", "B", USAGE))
    assert rec.apply(TokenBatch(5, (tok(0, "?"),))) is None  # no such row
    rec.apply(Failed("boom"))
    assert (a.finish_reason, a.error) == ("error", "boom")
    assert (b.finish_reason, b.error) == ("stop", "")
    assert rec.failed_rows == [0]


def test_stopped_rows_are_cancelled():
    reply = Reply(SamplingParams())
    rec = ReplyRecorder([reply])
    rec.begin()
    rec.apply(TokenBatch(0, (tok(0, "a"),)))
    assert rec.finish() and reply.finish_reason == "cancelled" and reply.text == "a"


def test_branch_cuts_the_reply_at_an_alternative():
    reply = Reply(SamplingParams(), text="abc", tokens=[tok(0, "a"), tok(1, "b"), tok(2, "c")],
                  finish_reason="stop", usage=USAGE)
    prefix = branch(reply, 1, 2)
    assert reply.text == "aalt" and [t.text for t in reply.tokens] == ["a", "alt"]
    assert reply.finish_reason is None and reply.usage is None
    assert prefix.text == "aalt" and prefix.token_ids == (100, 7)


def test_an_assistant_entry_says_what_its_chosen_reply_says():
    entry = Entry("assistant", replies=[Reply(SamplingParams(), text="one"),
                                        Reply(SamplingParams(), text="two")])
    assert entry.text == entry.content == "one"
    entry.chosen = 1
    assert entry.text == "two"
    entry.replies[1].text += "!"
    assert entry.text == "two!"
    assert Entry("user", text="hi").text == "hi"


def test_a_continued_reply_keeps_its_first_token_time_and_counts_both_parts():
    """Found using chatui: after /continue a reply's line said "TTFT 0.01s", the
    continuation's over the cached prefix, and the speed of the continuation alone. The
    first request's prompt, cache and time to first token stay; tokens and decode rate
    cover both parts (each part's tokens after its first, over its decode time)."""
    first = Usage(30, 11, 0, 0.25, 100.0, context_limit=2048)  # 10 tokens in 0.1 s
    reply = Reply(SamplingParams(), text="Hello", tokens=[tok(0, "Hello")],
                  finish_reason="length", usage=first)
    rec = ReplyRecorder([reply])
    rec.begin()
    assert reply.usage is None
    rec.apply(TokenBatch(0, (tok(0, " world"),)))
    rec.apply(RowDone(0, "stop", " world", Usage(41, 21, 40, 0.01, 50.0, 2048)))  # 20 in 0.4 s
    u = reply.usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (30, 32, 0)
    assert u.ttft_s == 0.25 and u.decode_tokens_per_s == pytest.approx(30 / 0.5)
    assert u.context_limit == 2048 and not u.filled_context
    fresh = Reply(SamplingParams())  # a reply with nothing before: the engine's usage as is
    rec = ReplyRecorder([fresh])
    rec.begin()
    rec.apply(TokenBatch(0, (tok(0, "Hi"),)))
    rec.apply(RowDone(0, "stop", "Hi", USAGE))
    assert fresh.usage == USAGE
