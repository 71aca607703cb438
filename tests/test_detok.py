"""Incremental detokenization and stop strings."""

from __future__ import annotations

import pytest

from inference.detok import IncrementalDetokenizer, StopStringFilter

TEXTS = ["Hello, world! 😀🎉 你好，世界。 Ünïcödé — ✓ 👩‍👩‍👧 𝔘",
         "日本語のテキストと絵文字🍣🍜を混ぜる", "plain ascii only", " leading space\n\nnewlines\t"]


@pytest.fixture(scope="module")
def tok(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_decode_without_replacement_chars(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok)
    pieces = [d.step(i) for i in ids]
    streamed = "".join(p.text for p in pieces) + d.flush()
    assert streamed == tok.decode(ids) == text
    assert all("\ufffd" not in p.text for p in pieces)


def test_detokenizers_sharing_one_token_decodes_stream_the_same_text(tok):
    """The engine's detokenizers share their one-token decodes (``singles``): every text
    streams as it does alone, and a token's window of one is decoded once for all of them."""
    calls = []

    class Counting:
        def decode(self, ids, **kw):
            calls.append(len(ids))
            return tok.decode(ids, **kw)

    def stream_all(singles):
        del calls[:]
        for text in TEXTS:
            ids = tok.encode(text, add_special_tokens=False)
            d = IncrementalDetokenizer(Counting(), singles=singles)
            assert "".join(d.step(i).text for i in ids) + d.flush() == text
        return len(calls)

    alone = stream_all(None)  # (each detokenizer its own singles)
    shared: dict[int, str] = {}
    first, again = stream_all(shared), stream_all(shared)
    assert first <= alone and again < first and len(shared) > 10


def test_the_direct_decoder_is_the_tokenizers_decode(tok, monkeypatch):
    """transformers' fast tokenizer decodes through the tokenizers library itself
    (``ids_decoder``): the same texts as ``tokenizer.decode`` for windows of every text, with
    and without special tokens, and transformers' ``decode`` is not called; a class whose
    ``decode`` is changed, and a tokenizer of another kind, keep their own ``decode``."""
    import random

    from inference.detok import ids_decoder

    rng = random.Random(3)
    windows = [[rng.randrange(len(tok)) for _ in range(rng.randint(1, 3))] for _ in range(300)]
    windows += [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    windows += [[tok.eos_token_id, 42], [tok.bos_token_id or 0, 7, tok.eos_token_id]]
    direct = {skip: ids_decoder(tok, skip) for skip in (True, False)}
    for ids in windows:
        for skip in (True, False):
            assert direct[skip](ids) == tok.decode(ids, skip_special_tokens=skip,
                                                   clean_up_tokenization_spaces=False)
    text = tok.decode([42, 43], skip_special_tokens=True)
    monkeypatch.setattr(type(tok), "decode", lambda self, ids, **kw: "changed")
    assert direct[True]([42, 43]) == text  # (transformers' decode is not called)
    assert ids_decoder(tok, True)([42, 43]) == "changed"  # a decode changed is kept

    class Own:
        def decode(self, ids, **kw):
            return f"{ids}{kw['skip_special_tokens']}"

    assert ids_decoder(Own(), False)([1, 2]) == "[1, 2]False"


def test_multi_token_glyph_credits_its_tokens(tok):
    ids = tok.encode("a😀", add_special_tokens=False)
    d = IncrementalDetokenizer(tok)
    pieces = [d.step(i) for i in ids]
    emoji_tokens = len(ids) - 1
    assert emoji_tokens >= 2  # SmolLM2 spells this emoji with several byte tokens
    assert [p.text for p in pieces] == ["a"] + [""] * (emoji_tokens - 1) + ["😀"]
    assert pieces[-1].glyph_start == 1


def test_incomplete_glyph_at_the_end_is_flushed(tok):
    ids = tok.encode("x😀", add_special_tokens=False)[:-1]
    d = IncrementalDetokenizer(tok)
    text = "".join(d.step(i).text for i in ids) + d.flush()
    assert text == tok.decode(ids)


class T:
    def __init__(self, text):
        self.text = text

    def with_text(self, text):
        return T(text)


def feed(stops, pieces):
    f = StopStringFilter(stops)
    out, stopped = [], False
    for p in pieces:
        r = f.push(T(p))
        out += [t.text for t in r.released]
        if r.stopped:
            stopped = True
            break
    if not stopped:
        out += [t.text for t in f.flush()]
    return out, stopped, f.released_text


def test_stop_string_across_tokens_is_cut_and_held_back_text_released():
    assert feed(["abc"], ["xx", "ya", "b", "cz"]) == (["xx", "y"], True, "xxy")
    assert feed(["abc"], ["xx", "ya", "b", "q"]) == (["xx", "ya", "b", "q"], False, "xxyabq")
    assert feed(["\n\n"], ["hi", "\n", "\n", "more"]) == (["hi"], True, "hi")
    assert feed(["END", "STOP"], ["go ", "ST", "OP now"]) == (["go "], True, "go ")
    assert feed([], ["a", "b"]) == (["a", "b"], False, "ab")
