"""TokenRecords: a reply's tokens in columns give back exactly the tokens that went in."""

from __future__ import annotations

import gc
import threading

from chatui import transcript
from chatui.token_records import TokenRecords
from inference.scripted import ScriptedBackend
from inference.settings import SamplingParams
from inference.types import Alternative, GenerationRequest, Message, Token, TokenBatch


def scripted_tokens(text: str, top: int = 5) -> list[Token]:
    backend = ScriptedBackend(lambda r, row: text)
    request = GenerationRequest((Message("user", "go"),),
                                (SamplingParams(max_new_tokens=10_000),), top_logprobs=top)
    return [t for ev in backend.generate(request, threading.Event())
            if isinstance(ev, TokenBatch) for t in ev.tokens]


ODD = [
    Token(0, 17, "Hel", -0.25, 1.5, (Alternative(17, "Hel", -0.25), Alternative(3, "He", -2.0)),
          raw="Hel"),
    Token(1, None, "", None, None, ()),  # no id, no logprob: the first half of a glyph
    Token(2, 99, "日", -3.5, 0.0, (Alternative(None, "日", -3.5),), glyph_start=1, raw="<0xE6>"),
    Token(3, 2, "", -0.01, 0.2, (), special=True, raw="<|im_end|>"),
    Token(4, 0, " ok\n", 0.0, None, (Alternative(0, " ok\n", 0.0),) * 3),
]


def test_round_trip_of_every_field():
    tokens = scripted_tokens("Some *Markdown*, with `code`.\n\n- and a list\n") + ODD
    records = TokenRecords(tokens)
    assert len(records) == len(tokens)
    assert list(records) == tokens
    assert [records[i] for i in range(len(tokens))] == tokens
    assert records[-1] == tokens[-1] and records[-len(tokens)] == tokens[0]
    assert records[3:9] == tokens[3:9] and records[::2] == tokens[::2]
    assert records == tokens and records == TokenRecords(tokens)
    assert records.ids() == tuple(t.id for t in tokens)
    assert records.text() == "".join(t.text for t in tokens if not t.special)
    assert records.text(2, 5, skip_special=False) == "".join(t.text for t in tokens[2:5])
    for i, t in enumerate(tokens):
        assert (records.text_at(i), records.raw_at(i), records.is_special(i),
                records.logprob_at(i), records.id_at(i)) == \
            (t.text, t.raw, t.special, t.logprob, t.id)
    # a transcript's columns read back to the same tokens
    assert transcript.token_columns.decode(transcript.token_columns.encode(records)) == tokens


def test_out_of_range_raises_index_error():
    records = TokenRecords(ODD)
    for i in (5, -6):
        try:
            records[i]
        except IndexError:
            continue
        raise AssertionError(f"records[{i}] did not raise")


def test_append_in_batches_then_truncate_as_continue_from_alternative_does():
    tokens = scripted_tokens(" ".join(f"w{i}" for i in range(50)))
    records = TokenRecords()
    for start in range(0, len(tokens), 7):
        records.extend(tokens[start:start + 7])  # one TokenBatch's tokens at a time
        # read some joined, some still pending
        assert records[0] == tokens[0] and records[-1] == tokens[len(records) - 1]
        assert records.text() == "".join(t.text for t in tokens[:start + 7])
    position = 20
    chosen = Token(position, None, "x", -1.0, 0.5, tokens[position].top)
    records.truncate(position)
    records.append(chosen)
    assert list(records) == tokens[:position] + [chosen]
    assert records.text() == "".join(t.text for t in tokens[:position]) + "x"
    records.truncate(0)
    assert len(records) == 0 and list(records) == [] and records.text() == ""


def test_copy_is_independent():
    records = TokenRecords(ODD)
    copy = records.copy()
    records.truncate(2)
    records.append(ODD[4])
    assert list(copy) == ODD
    assert list(records) == ODD[:2] + [ODD[4]]


def test_copies_share_columns_until_either_side_changes():
    """Issue 21: a snapshot shares the reply's columns (nothing copied on the event loop) and
    compares equal to it by identity; whichever side changes first gets columns of its own,
    the other keeps what it had, after any change: append, extend, truncate, clear."""
    tokens = scripted_tokens("Some *Markdown*, with `code`.") + ODD
    changes = [lambda r: r.append(ODD[0]), lambda r: r.extend(ODD[1:3]),
               lambda r: r.truncate(3), lambda r: r.clear()]
    for change in changes:
        for changed_side in (0, 1):
            records = TokenRecords()
            records.extend(tokens)  # pieces waiting to be joined: copy() joins them first
            copy = records.copy()
            assert copy.shares_columns(records) and copy == records
            pair = [records, copy]
            change(pair[changed_side])
            assert list(pair[1 - changed_side]) == tokens
            assert not pair[0].shares_columns(pair[1])
            again = pair[changed_side].copy()  # and the changed one shares again
            assert again.shares_columns(pair[changed_side])
            change(again)
            assert list(pair[1 - changed_side]) == tokens
    unchanged = TokenRecords(tokens)
    assert unchanged.copy().copy().shares_columns(unchanged)
    unchanged.truncate(len(unchanged))  # no change: still shared
    assert unchanged.copy().shares_columns(unchanged)


def test_startswith_agrees_with_the_tokens():
    """What the autosave asks of a grown reply: does it start with the one saved before?
    Read from the columns, it answers as comparing the tokens does."""
    tokens = scripted_tokens("The quick brown fox jumps over the lazy dog, twice.") + ODD
    full = TokenRecords(tokens)
    for n in range(len(tokens) + 1):
        assert full.startswith(TokenRecords(tokens[:n])), n
    assert not TokenRecords(tokens[:3]).startswith(full)
    for k in range(1, len(tokens), 3):
        for change in (lambda t: Token(**{**t.__dict__, "text": t.text + "!"}),
                       lambda t: Token(**{**t.__dict__, "top": t.top[:-1]}),
                       lambda t: Token(**{**t.__dict__, "logprob": None})):
            other = list(tokens[:k + 1])
            other[k] = change(other[k])
            want = full[:k + 1] == other
            assert full.startswith(TokenRecords(other)) is want, k
    grown = full.copy()
    grown.append(ODD[0])
    assert grown.startswith(full) and not full.startswith(grown)


def test_tracked_objects_do_not_grow_with_the_tokens():
    tokens = scripted_tokens(" ".join(f"w{i}" for i in range(3000)))
    gc.collect()
    before = len(gc.get_objects())
    kept = [TokenRecords(tokens[:n]) for n in (10, 3000)]
    gc.collect()
    added = len(gc.get_objects()) - before
    assert added < 40, added  # a list of tokens would be ~7 per token and alternative
    assert len(kept[1]) == 3000


def test_compact_joins_the_pieces_and_keeps_every_token():
    """A finished reply's strings become one per column (the recorder compacts at the end of
    a row); reading, appending and truncating go on as before."""
    tokens = scripted_tokens(" ".join(f"w{i}" for i in range(40)))
    assert len(tokens) >= 40
    tokens = tokens[:40]
    records = TokenRecords(tokens[:30])
    records.compact()
    assert all(not s._pending for s in (records._texts, records._raws, records._alt_texts))
    assert list(records) == tokens[:30]
    records.extend(tokens[30:])
    assert records.text_at(35) == tokens[35].text and list(records) == tokens
    records.compact()
    records.truncate(10)
    assert list(records) == tokens[:10]


def test_clear_empties_like_a_list():
    records = TokenRecords(ODD)
    records.clear()
    assert len(records) == 0 and list(records) == []
    records.extend(ODD[:2])
    assert list(records) == ODD[:2]


def test_equality_reads_the_columns_and_agrees_with_the_tokens():
    """The autosave compares each message with the saved one: equal columns answer at once;
    any difference in a token, an alternative or a flag makes them unequal, as a list of the
    same tokens would."""
    tokens = scripted_tokens("The quick brown fox jumps over the lazy dog.")
    records = TokenRecords()
    records.extend(tokens)
    same = records.copy()
    assert records == same and records._same_columns(same) and records == tokens
    for i, change in enumerate([
            lambda t: Token(**{**t.__dict__, "logprob": (t.logprob or 0) - 0.5}),
            lambda t: Token(**{**t.__dict__, "text": t.text + "!"}),
            lambda t: Token(**{**t.__dict__, "special": not t.special}),
            lambda t: Token(**{**t.__dict__, "top": t.top[:-1]})]):
        other_tokens = list(tokens)
        k = 1 + i % (len(tokens) - 1)
        other_tokens[k] = change(tokens[k])
        other = TokenRecords()
        other.extend(other_tokens)
        assert (records == other) is (tokens == other_tokens) is False


def test_reply_statistics_from_the_columns_equal_those_from_the_tokens():
    """A finished reply drawn again computes its statistics line from the columns: the same
    count, mean logprob and least likely token as from the tokens, in one go or in steps."""
    from chatui.widgets.reply import RunningStats

    tokens = scripted_tokens("Statistics of a reply: some tokens are likelier than others.")
    tokens[3] = Token(**{**tokens[3].__dict__, "special": True})
    records = TokenRecords()
    records.extend(tokens)
    whole = RunningStats().sync(tokens)
    columns = RunningStats().sync(records)
    stepped = RunningStats()
    for end in (2, 7, len(records)):
        part = TokenRecords()
        part.extend(tokens[:end])
        stepped.sync(part)
    for stats in (columns, stepped):
        assert (stats.count, stats.logprob_count, stats.seen) == (
            whole.count, whole.logprob_count, whole.seen)
        assert abs(stats.logprob_sum - whole.logprob_sum) < 1e-9
        assert stats.least == whole.least
