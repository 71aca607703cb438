"""Transcripts: exact round trips, clear errors on bad files, crash-safe saves, autosave
naming, history and export."""

from __future__ import annotations

import base64
import errno
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from array import array
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import chatui.transcript as tr
from chatui.transcript import token_columns
from chatui.conversation import Conversation, Entry, ModelRef, Reply
from chatui.transcript import (
    FORMAT_VERSION,
    TranscriptError,
    autosave,
    autosave_path,
    data_dir,
    delete_transcript,
    export_markdown,
    export_messages,
    export_to_file,
    from_json_dict,
    list_transcripts,
    load_transcript,
    save_transcript,
    to_json_dict,
)
from inference.settings import SamplingParams
from inference.types import Alternative, Token, Usage

REPO = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- strategies ----------------------------------------------------------------------

TRICKY = ["\x1b[31mred\x1b[0m", "[bold]not markup[/bold]", "\x00", "\r\n", "\u2028", "\x7f\x9b",
          "😀", "e\u0301", "中文", '"quoted" \\ back', "\ufeff", "]]}", ""]
texts = st.one_of(st.text(max_size=24), st.sampled_from(TRICKY),
                  st.lists(st.sampled_from(TRICKY), max_size=4).map("".join))
times = st.floats(0, 1e10, allow_nan=False, allow_infinity=False)
logprobs = st.floats(-1e4, 0, allow_nan=False)
token_ids = st.none() | st.integers(0, 2**31 - 1)

sampling = st.builds(
    SamplingParams,
    temperature=st.floats(0, 100),
    top_k=st.integers(0, 1000),
    top_p=st.floats(0, 1, exclude_min=True),
    min_p=st.floats(0, 1, exclude_max=True),
    repetition_penalty=st.floats(0, 10, exclude_min=True),
    seed=st.none() | st.integers(0, 2**63 - 1),
    max_new_tokens=st.integers(1, 1_000_000),
    stop=st.lists(st.text(min_size=1, max_size=5), max_size=3).map(tuple),
    reasoning_budget=st.none() | st.integers(0, 1_000_000),
)


@st.composite
def tokens(draw: st.DrawFn) -> list[Token]:
    out = []
    for i in range(draw(st.integers(0, 6))):
        out.append(Token(
            index=i, id=draw(token_ids), text=draw(texts),
            logprob=draw(st.none() | logprobs),
            entropy=draw(st.none() | st.floats(0, 20)),
            top=tuple(draw(st.lists(st.builds(Alternative, token_ids, texts, logprobs),
                                    max_size=3))),
            special=draw(st.booleans()),
            glyph_start=draw(st.none() | st.integers(0, i)),
            raw=draw(texts),
            channel=draw(st.sampled_from(["answer", "reasoning"])),
        ))
    return out


usages = st.none() | st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**6),
                               st.integers(0, 10**6), st.floats(0, 1e3), st.floats(0, 1e5))
replies = st.builds(Reply, settings=sampling, text=texts, tokens=tokens(),
                    finish_reason=st.sampled_from([None, "stop", "length", "cancelled", "error"]),
                    usage=usages, error=texts, reasoning=texts)


@st.composite
def entries(draw: st.DrawFn) -> Entry:
    if draw(st.booleans()):
        return Entry("user", draw(texts), draw(times))
    rs = draw(st.lists(replies, max_size=3))
    chosen = draw(st.integers(0, max(len(rs) - 1, 0)))
    text = rs[chosen].text if rs and draw(st.booleans()) else draw(texts)
    fan_out = len(rs) > 1 and draw(st.booleans())  # an unpicked fan-out (issue 18)
    return Entry("assistant", text, draw(times), rs, chosen, fan_out=fan_out)


models = st.builds(ModelRef, name=texts, checkpoint=texts, weights_hash=texts, dtype=texts,
                   quantization=st.sampled_from(["", "int8", "int4"]), backend=st.sampled_from(["local", "openai", "scripted"]),
                   url=st.sampled_from(["", "http://localhost:8080/v1", "https://h.example/v1?m=x"]))
conversations = st.builds(
    Conversation, id=st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True), created=times,
    title=texts, system_prompt=texts, entries=st.lists(entries(), max_size=4), model=models)


def sample_conversation() -> Conversation:
    """A small conversation with a comparison group, tokens and stats."""
    conv = Conversation(system_prompt="Be brief.", model=ModelRef(
        name="SmolLM2-135M-Instruct", checkpoint="/models/smol", weights_hash="sha256:ab12",
        dtype="bfloat16"))
    conv.add_user("Hello there, \x1b[1mhow\x1b[0m are you? [bold]x[/bold]\nsecond line")
    entry = conv.add_assistant([SamplingParams(temperature=0.0), SamplingParams(seed=7)])
    for k, reply in enumerate(entry.replies):
        reply.tokens = [
            Token(0, 9906, "Fine", -0.25, 1.5, (Alternative(9906, "Fine", -0.25),
                                                Alternative(None, "Good", -1.75))),
            Token(1, 13, ".", -0.015625 * (k + 1), 0.25),
            Token(2, 2, "", None, None, special=True, raw="<|im_end|>"),
        ]
        reply.text = "Fine." if k == 0 else "Fine!"
        reply.finish_reason = "stop"
        reply.usage = Usage(12, 3, 0, 0.125, 40.5)
    entry.chosen = 1
    entry.text = entry.replies[1].text
    conv.add_user("And then?")
    return conv


def roundtrip(conv: Conversation) -> Conversation:
    text = json.dumps(to_json_dict(conv), ensure_ascii=False, allow_nan=False)
    return from_json_dict(json.loads(text))


# ---- round trips ---------------------------------------------------------------------


@FUZZ
@given(conversations)
def test_round_trip_is_exact(conv: Conversation) -> None:
    assert roundtrip(conv) == conv


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations)
def test_round_trip_through_a_file(conv: Conversation) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.json"
        save_transcript(conv, path)
        assert load_transcript(path) == conv


def test_model_output_is_data_and_floats_are_exact(tmp_path: Path) -> None:
    conv = sample_conversation()
    weird = "\x1b]0;title\x07\x1b[2J[red]x[/red]\x00\x01\ud800 lone surrogate"
    conv.entries[1].replies[0].text = weird
    conv.entries[1].replies[0].tokens[0] = Token(0, 1, weird, -5e-324, 0.1 + 0.2)
    conv.created = 1795315947.4844754
    save_transcript(conv, tmp_path / "w.json")
    back = load_transcript(tmp_path / "w.json")
    assert back == conv
    assert back.entries[1].replies[0].text == weird
    assert back.entries[1].replies[0].tokens[0].entropy == 0.30000000000000004


def test_unicode_is_stored_readably(tmp_path: Path) -> None:
    conv = sample_conversation()
    conv.add_user("中文 😀")
    save_transcript(conv, tmp_path / "u.json")
    assert "中文 😀" in (tmp_path / "u.json").read_text("utf-8")


def test_non_finite_statistics_are_written_as_unknown(tmp_path: Path) -> None:
    conv = sample_conversation()
    reply = conv.entries[1].replies[0]
    reply.tokens[0] = Token(0, 1, "x", float("-inf"), float("nan"),
                            (Alternative(1, "x", float("-inf")), Alternative(2, "y", -1.0)))
    reply.usage = Usage(1, 1, 0, float("nan"), float("inf"))
    save_transcript(conv, tmp_path / "n.json")
    raw = (tmp_path / "n.json").read_text()
    assert "NaN" not in raw and "Infinity" not in raw
    t = load_transcript(tmp_path / "n.json").entries[1].replies[0].tokens[0]
    assert (t.logprob, t.entropy, t.top) == (None, None, (Alternative(2, "y", -1.0),))


def test_saving_an_invalid_conversation_writes_nothing(tmp_path: Path) -> None:
    conv = sample_conversation()
    path = tmp_path / "bad.json"
    save_transcript(conv, path)
    before = path.read_bytes()
    conv.entries[1].replies[0].tokens[0] = Token(0, 1, "x", 0.5, 1.0)
    with pytest.raises(TranscriptError, match=r"Could not save .*bad\.json.*logprob"):
        save_transcript(conv, path)
    assert path.read_bytes() == before


def test_credentials_are_not_written() -> None:
    conv = sample_conversation()
    conv.model.url = "https://user:s3cret@api.example/v1?api_key=zzz&model=m"
    doc = to_json_dict(conv)
    assert doc["model"]["url"] == "https://api.example/v1?model=m"
    assert "s3cret" not in json.dumps(doc) and "zzz" not in json.dumps(doc)


# ---- bad files ------------------------------------------------------------------------


def _token_objects(columns: dict) -> list[dict]:
    """A reply's tokens as chatui wrote them before the columns (still read)."""
    out = []
    for t in token_columns.decode(columns):
        d = {"index": t.index, "id": t.id, "text": t.text, "logprob": t.logprob,
             "entropy": t.entropy}
        if t.top:
            d["top"] = [[a.id, a.text, a.logprob] for a in t.top]
        if t.special:
            d["special"] = True
        if t.raw:
            d["raw"] = t.raw
        out.append(d)
    return out


def _doc(columns: bool = False) -> dict:
    """The sample conversation's document; its tokens as objects unless ``columns``."""
    doc = json.loads(json.dumps(to_json_dict(sample_conversation())))
    if not columns:
        for m in doc["messages"]:
            for r in m.get("replies", ()):
                r["tokens"] = _token_objects(r["tokens"])
    return doc


def _cols(edit) -> bytes:  # type: ignore[no-untyped-def]
    """The columnar document with ``edit`` applied to the first reply's tokens object."""
    doc = _doc(columns=True)
    edit(doc["messages"][1]["replies"][0]["tokens"])
    return json.dumps(doc).encode()


def _column(key: str, typecode: str, i: int, value: object):  # type: ignore[no-untyped-def]
    def edit(tokens: dict) -> None:
        column = array(typecode, base64.b64decode(tokens[key]))
        column[i] = value  # type: ignore[call-overload]
        tokens[key] = base64.b64encode(column.tobytes()).decode()
    return edit


def _with(edit) -> bytes:  # type: ignore[no-untyped-def]
    doc = _doc()
    edit(doc)
    return json.dumps(doc).encode()


def _reply0(doc: dict) -> dict:
    return doc["messages"][1]["replies"][0]


def _set(d: dict, key: str, value: object) -> dict:
    d[key] = value
    return d


GOOD = json.dumps(_doc()).encode()
CORPUS: list[tuple[str, bytes, str]] = [
    ("empty", b"", "the file is empty"),
    ("not json", b"Hello, I am a chat log\n", "not valid JSON"),
    ("not utf-8", b'{"version": 2, "title": "\xff\xfe"}', "not UTF-8"),
    ("truncated", GOOD[: len(GOOD) // 2], "cut off"),
    ("truncated at end", GOOD[:-1], "cut off"),
    ("a list", b"[1, 2, 3]", "not a chatui transcript"),
    ("other json", b'{"name": "package.json"}', "not a chatui transcript"),
    ("newer", _with(lambda d: _set(d, "version", 99)), "newer chatui"),
    ("version string", _with(lambda d: _set(d, "version", "2")), "format version"),
    ("version zero", _with(lambda d: _set(d, "version", 0)), "format version"),
    ("no messages", _with(lambda d: d.pop("messages")), "messages is missing"),
    ("messages object", _with(lambda d: _set(d, "messages", {})), "messages must be a list"),
    ("bad role", _with(lambda d: _set(d["messages"][0], "role", "system")), "messages[0].role"),
    ("text number", _with(lambda d: _set(d["messages"][0], "text", 5)),
     "messages[0].text must be a string"),
    ("no time", _with(lambda d: d["messages"][0].pop("time")), "messages[0].time is missing"),
    ("time bool", _with(lambda d: _set(d["messages"][0], "time", True)), "must be a number"),
    ("negative created", _with(lambda d: _set(d, "created", -5)), "created must be a time"),
    ("absurd time", _with(lambda d: _set(d, "created", 1e300)), "created must be a time"),
    ("chosen out of range", _with(lambda d: _set(d["messages"][1], "chosen", 2)),
     "messages[1].chosen must be between 0 and 1"),
    ("positive logprob", _with(lambda d: _set(_reply0(d)["tokens"][0], "logprob", 0.5)),
     "messages[1].replies[0].tokens[0].logprob"),
    ("nan logprob", GOOD.replace(b'"logprob": -0.25', b'"logprob": NaN', 1), "NaN"),
    ("inf entropy", GOOD.replace(b'"entropy": 1.5', b'"entropy": Infinity', 1), "Infinity"),
    ("huge entropy", _with(lambda d: _set(_reply0(d)["tokens"][0], "entropy", 1e308)), "entropy"),
    ("huge int", GOOD.replace(b'"index": 0', b'"index": ' + b"9" * 5000, 1), "not allowed"),
    ("bad token id", _with(lambda d: _set(_reply0(d)["tokens"][0], "id", -3)), "tokens[0].id"),
    ("float token id", _with(lambda d: _set(_reply0(d)["tokens"][0], "id", 1.5)), "whole number"),
    ("bad alternative", _with(lambda d: _set(_reply0(d)["tokens"][0], "top", [[1, "x"]])),
     "tokens[0].top[0]"),
    ("glyph after token", _with(lambda d: _set(_reply0(d)["tokens"][0], "glyph_start", 3)),
     "glyph_start"),
    ("special string", _with(lambda d: _set(_reply0(d)["tokens"][0], "special", "yes")),
     "special must be true or false"),
    ("columns: positive logprob", _cols(_column("logprob", "d", 0, 0.5)),
     "messages[1].replies[0].tokens: logprob holds a value that is not a log-probability"),
    ("columns: NaN alternative", _cols(_column("top_logprob", "d", 1, float("nan"))),
     "top_logprob holds a value that is not a log-probability"),
    ("columns: negative id", _cols(_column("id", "q", 1, -3)), "id holds a value"),
    ("columns: unknown flag", _cols(_column("flags", "B", 0, 200)), "unknown flag"),
    ("columns: too many alternatives", _cols(_column("top_ends", "Q", 2, 10**6)),
     "alternatives"),
    ("columns: alternatives out of order", _cols(_column("top_ends", "Q", 1, 1)),
     "top_ends does not mark"),
    ("columns: text ends past the text", _cols(_column("text_ends", "Q", 2, 99)),
     "text_ends does not mark"),
    ("columns: glyph after token", _cols(_column("glyph_start", "q", 0, 5)), "glyph_start"),
    ("columns: short column", _cols(lambda t: t.update(entropy=t["entropy"][:8])),
     "entropy has 6 bytes where 3 values need 24"),
    ("columns: not base64", _cols(lambda t: t.update(index="@@@")), "index is not valid base64"),
    ("columns: missing", _cols(lambda t: t.pop("raw_ends")), "raw_ends is missing"),
    ("columns: count", _cols(lambda t: t.update(n=-1)), "n must be the number of tokens"),
    ("columns: not an object", _cols(lambda t: t.clear() or t.update(x=1)), "n must be"),
    ("bad temperature", _with(lambda d: _set(_reply0(d)["settings"], "temperature", -1)),
     "temperature must be between 0 and 100"),
    ("temperature string", _with(lambda d: _set(_reply0(d)["settings"], "temperature", "hot")),
     "temperature must be a number"),
    ("temperature huge int", _with(lambda d: _set(_reply0(d)["settings"], "temperature", 10**400)),
     "temperature"),
    ("unknown setting", _with(lambda d: _set(_reply0(d)["settings"], "mirostat", 2)),
     "unknown setting"),
    ("settings missing", _with(lambda d: _reply0(d).pop("settings")), "settings is missing"),
    ("finish reason", _with(lambda d: _set(_reply0(d), "finish_reason", "done")), "finish_reason"),
    ("usage negative", _with(lambda d: _set(_reply0(d)["usage"], "prompt_tokens", -1)),
     "usage.prompt_tokens"),
    ("user with replies", _with(lambda d: _set(d["messages"][0], "replies", [{}])), "user message"),
    ("bad id", _with(lambda d: _set(d, "id", "../../etc")), "id must be"),
    ("model list", _with(lambda d: _set(d, "model", [])), "model must be an object"),
    ("deep nesting", b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
]


@pytest.mark.parametrize("content,expected", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_bad_files_give_one_clear_sentence(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "broken chat.json"
    path.write_bytes(content)
    with pytest.raises(TranscriptError) as info:
        load_transcript(path)
    message = str(info.value)
    assert message.startswith(f"Could not load {path}: ") and message.endswith(".")
    assert expected in message
    assert "\n" not in message and len(message) < 400


def test_missing_file_directory_and_huge_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TranscriptError, match="no such file"):
        load_transcript(tmp_path / "nope.json")
    with pytest.raises(TranscriptError, match="directory"):
        load_transcript(tmp_path)
    path = tmp_path / "big.json"
    save_transcript(sample_conversation(), path)
    monkeypatch.setattr(tr.store, "MAX_BYTES", 1000)
    with pytest.raises(TranscriptError, match=r"it is \d+ KiB, more than the 1000 bytes a transcript may have"):
        load_transcript(path)


def test_from_json_dict_names_its_source() -> None:
    with pytest.raises(TranscriptError, match=r"^Could not load <clipboard>: "):
        from_json_dict(None, source="<clipboard>")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12)


def _paths(value: object, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


DOC_PATHS = _paths(_doc())[1:]


def _accept_or_explain(data: object) -> None:
    """from_json_dict either gives a conversation that saves and loads back, or a clear error."""
    try:
        conv = from_json_dict(data, source="fuzz.json")
    except TranscriptError as e:
        assert str(e).startswith("Could not load fuzz.json: ")
        return
    assert roundtrip(conv) == conv


@FUZZ
@given(json_values)
def test_fuzzed_documents_never_crash(data: object) -> None:
    _accept_or_explain(data)
    _accept_or_explain({"format": "chatui-transcript", "version": 2, "id": "x", "created": 0,
                        "messages": data})


@FUZZ
@given(st.sampled_from(DOC_PATHS), json_values, st.booleans())
def test_mutated_transcripts_never_crash(path: tuple, value: object, delete: bool) -> None:
    doc = _doc()
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    _accept_or_explain(doc)


@FUZZ
@given(st.integers(0, len(GOOD)), st.lists(st.tuples(st.integers(0, len(GOOD) - 1),
                                                     st.integers(0, 255)), max_size=4))
def test_damaged_bytes_never_crash(cut: int, flips: list[tuple[int, int]]) -> None:
    data = bytearray(GOOD[:cut] if cut % 2 else GOOD)
    for pos, byte in flips:
        if pos < len(data):
            data[pos] = byte
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "damaged.json"
        path.write_bytes(bytes(data))
        try:
            load_transcript(path)
        except TranscriptError as e:
            assert str(e).startswith(f"Could not load {path}: ")


# ---- versions -------------------------------------------------------------------------

V1_TRANSCRIPT = textwrap.dedent("""\
    {"format": "chatui-transcript", "version": 1, "id": "0a1b2c3d4e5f", "created": 1790000000.5,
     "title": "Old chat", "system_prompt": "",
     "model": {"name": "tiny", "checkpoint": "/m/tiny", "weights_hash": "", "dtype": "float32",
               "backend": "local", "url": ""},
     "messages": [
      {"role": "user", "text": "Hi", "time": 1790000001.0},
      {"role": "assistant", "text": "Hello", "time": 1790000002.0, "chosen": 0,
       "replies": [{"temperature": 0.5, "top_p": 0.9, "seed": 42, "stop": ["###"],
                    "text": "Hello", "finish_reason": "stop", "error": "",
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "cached_tokens": 0,
                              "ttft_s": 0.05, "decode_tokens_per_s": 20.0},
                    "tokens": [{"index": 0, "id": 15496, "text": "Hello", "logprob": -0.5,
                                "entropy": 0.75, "top": [[15496, "Hello", -0.5]]}]}]}]}
    """)


def test_version_1_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(V1_TRANSCRIPT)
    conv = load_transcript(path)
    reply = conv.entries[1].replies[0]
    assert reply.settings == SamplingParams(temperature=0.5, top_p=0.9, seed=42, stop=("###",))
    assert reply.tokens[0].top == (Alternative(15496, "Hello", -0.5),)
    assert conv.title == "Old chat" and conv.model.dtype == "float32"
    save_transcript(conv, path)
    assert json.loads(path.read_text())["version"] == FORMAT_VERSION == 3
    assert "settings" in json.loads(path.read_text())["messages"][1]["replies"][0]
    assert load_transcript(path) == conv


# ---- atomic writes and crash safety ----------------------------------------------------


def test_disk_full_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "chat.json"
    conv = sample_conversation()
    save_transcript(conv, path)
    before = path.read_bytes()

    def half_then_full(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tr.store, "_write_all", half_then_full)
    conv.add_user("one more")
    with pytest.raises(TranscriptError) as info:
        save_transcript(conv, path)
    assert str(info.value) == (f"Could not save {path}: the disk is full; "
                               "the previous file is unchanged.")
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.json"]  # no temp file left


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_real_write_failure_keeps_the_old_file(tmp_path: Path) -> None:
    """A real OS-level failure mid-write (a file size limit), in a child process."""
    path = tmp_path / "chat.json"
    save_transcript(sample_conversation(), path)
    before = path.read_bytes()
    child = f"""
import resource, signal, sys
sys.path.insert(0, {str(REPO)!r})
from pathlib import Path
from chatui.transcript import TranscriptError, save_transcript
from tests.test_transcript import sample_conversation
conv = sample_conversation()
conv.add_user("x" * 200_000)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))
try:
    save_transcript(conv, Path({str(path)!r}))
except TranscriptError as e:
    print(e)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.stdout.startswith(f"Could not save {path}: "), out.stderr
    assert "previous file is unchanged" in out.stdout
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["chat.json"]


CRASH_CHILD = """
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from chatui.conversation import Conversation
import os, time
from chatui.transcript import save_transcript, store
from inference.settings import SamplingParams
from inference.types import Alternative, Token
conv = Conversation(id="crash")
for k in range(6):
    conv.add_user("question %d" % k)
    reply = conv.add_assistant([SamplingParams()]).replies[0]
    reply.tokens = [Token(i, i, " w\\u00e9", -0.5, 1.0, tuple(Alternative(j, " a", -2.0)
                    for j in range(5))) for i in range(2500)]
    reply.text = "".join(t.text for t in reply.tokens)
    reply.finish_reason = "stop"


def slow_disk(fd, data):  # the real write, in chunks, so that a kill lands in the middle
    print("writing", flush=True)
    for start in range(0, len(data), 1 << 16):
        os.write(fd, data[start:start + (1 << 16)])
        time.sleep(0.004)


if {slow!r}:
    store._write_all = slow_disk
n = 0
while True:
    conv.title = "version %d" % n
    save_transcript(conv, Path({path!r}))
    print("saved", n, flush=True)
    n += 1
"""


def _kill_while_saving(path: Path, rng: random.Random) -> None:
    """Start a child that saves a big transcript to ``path`` over and over; SIGKILL it
    while it is writing the file (not before the first save is complete)."""
    src = CRASH_CHILD.format(repo=str(REPO), path=str(path), slow=True)
    proc = subprocess.Popen([sys.executable, "-c", src], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    while not proc.stdout.readline().startswith("saved"):
        pass
    assert proc.stdout.readline().startswith("writing")  # the next save is writing now
    time.sleep(rng.uniform(0.0, 0.12))  # a 2 MiB write takes about 0.15 s here
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_killed_while_saving_leaves_a_valid_file(tmp_path: Path) -> None:
    """A process killed with SIGKILL in the middle of writing a big transcript, again and
    again: the file is always the previous or the new version, complete and valid."""
    path = tmp_path / "big.json"
    rng = random.Random(4)
    interrupted = temps = 0
    for _ in range(6):
        _kill_while_saving(path, rng)
        now = len(list(tmp_path.glob(".big.json.*.tmp")))
        interrupted += now > temps  # this kill left a temporary file: it cut a write short
        temps = now
        conv = load_transcript(path)
        assert conv.id == "crash" and len(conv.entries) == 12
        assert len(conv.entries[11].replies[0].tokens) == 2500
        assert re.fullmatch(r"version \d+", conv.title)
        assert [s.title for s in list_transcripts(tmp_path)] == [conv.title]  # temps ignored
    assert interrupted >= 3  # the kills really landed mid-write


def test_new_files_are_private_and_existing_modes_kept(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    save_transcript(sample_conversation(), path)
    if sys.platform != "win32":
        assert path.stat().st_mode & 0o777 == 0o600
        path.chmod(0o644)
        save_transcript(sample_conversation(), path)
        assert path.stat().st_mode & 0o777 == 0o644


# ---- autosave, history ----------------------------------------------------------------


def test_data_dir_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "here"))
    assert data_dir() == tmp_path / "here"
    monkeypatch.delenv("CHATUI_DATA_DIR")
    assert data_dir().name == "conversations" and "chatui" in str(data_dir())


def test_autosave_name_is_readable_and_stable(tmp_path: Path) -> None:
    conv = Conversation(created=time.mktime((2026, 11, 22, 3, 15, 0, 0, 0, -1)))
    assert autosave(conv, tmp_path) == autosave_path(conv, tmp_path)
    assert list(tmp_path.iterdir()) == []  # empty conversations are not written
    conv.add_user("Why is the sky blue? Explain \x1b[1mbriefly\x1b[0m, please, to a child")
    path = autosave(conv, tmp_path)
    assert path.name == f"2026-11-22_0315_why-is-the-sky-blue-explain_{conv.id}.json"
    conv.title = "A completely different title"
    conv.add_assistant([SamplingParams()]).replies[0].text = "Rayleigh scattering."
    assert autosave(conv, tmp_path) == path
    assert list(tmp_path.iterdir()) == [path]
    assert load_transcript(path) == conv


def test_autosave_names_are_unique_per_conversation(tmp_path: Path) -> None:
    a, b = Conversation(created=0), Conversation(created=0)
    a.add_user("same words")
    b.add_user("same words")
    assert autosave(a, tmp_path) != autosave(b, tmp_path)
    assert len(list(tmp_path.iterdir())) == 2


def test_ids_that_end_alike_get_their_own_files(tmp_path: Path) -> None:
    a, b = Conversation(id="a_b_c", created=0), Conversation(id="b_c", created=0)
    a.add_user("hi")
    b.add_user("hi")
    assert autosave(a, tmp_path) != autosave(b, tmp_path)
    assert load_transcript(autosave_path(b, tmp_path)).id == "b_c"


def test_autosave_removes_stale_temporary_files(tmp_path: Path) -> None:
    conv = sample_conversation()
    stale = tmp_path / f".{autosave_path(conv, tmp_path).name}.abc123.tmp"
    fresh = tmp_path / f".{autosave_path(conv, tmp_path).name}.def456.tmp"
    stale.write_text("{half")
    fresh.write_text("{half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    autosave(conv, tmp_path)
    assert not stale.exists() and fresh.exists()  # a fresh one may be another save at work


def test_history_lists_newest_first_with_errors(tmp_path: Path) -> None:
    old, new = sample_conversation(), Conversation(model=ModelRef(checkpoint="/m/x"))
    new.add_user("Second chat\nmore")
    p_old = autosave(old, tmp_path)
    time.sleep(0.01)
    p_new = autosave(new, tmp_path)
    (tmp_path / "junk.json").write_text("{ not json")
    (tmp_path / "notes.txt").write_text("ignored")
    listed = list_transcripts(tmp_path)
    good = [s for s in listed if not s.error]
    assert [s.path for s in good] == [p_new, p_old]
    assert good[0].title == "Second chat" and good[0].model == "/m/x"
    assert good[0].messages == 1 and good[1].messages == 3
    assert good[1].model == "SmolLM2-135M-Instruct" and good[1].id == old.id
    assert good[0].updated >= good[1].updated and good[1].created == old.created
    bad = [s for s in listed if s.error]
    assert len(bad) == 1 and "junk.json" in bad[0].error and "not valid JSON" in bad[0].error
    delete_transcript(p_old)
    assert [s.path for s in list_transcripts(tmp_path) if not s.error] == [p_new]
    with pytest.raises(TranscriptError, match="Could not delete .*notes.txt"):
        delete_transcript(tmp_path / "notes.txt")
    with pytest.raises(TranscriptError, match="no such file"):
        delete_transcript(p_old)
    assert list_transcripts(tmp_path / "missing") == []


# ---- export ---------------------------------------------------------------------------


def test_markdown_export() -> None:
    md = export_markdown(sample_conversation())
    assert md.startswith("# Hello there, ␛[1mhow␛[0m are you? [bold]x[/bold]\n")
    assert "\x1b" not in md
    assert "**Model:** SmolLM2-135M-Instruct" in md and "bfloat16" in md
    assert "## System\n\nBe brief." in md
    assert "comparison of 2 replies" in md
    assert "### Column 1\n" in md and "### Column 2 (chosen" in md
    assert "temperature=0" in md and "seed=7" in md
    assert "2 tokens · 40.5 tok/s · first token 0.12 s · perplexity" in md  # (not <|im_end|>)
    assert md.index("## User") < md.index("Fine.") < md.index("Fine!") < md.index("And then?")


def test_markdown_export_says_which_weights_decoded() -> None:
    """Quantized weights are named beside the compute dtype, as the status bar names them
    (the export said "local, float32" of replies decoded from int8 weights), and the format
    is kept by a save and a load."""
    conv = sample_conversation()
    conv.model = ModelRef(name="smol", dtype="float32", quantization="int8")
    assert "**Backend:** local, int8 weights, float32 compute" in export_markdown(conv)
    assert from_json_dict(json.loads(json.dumps(to_json_dict(conv)))).model.quantization == "int8"
    conv.model = ModelRef(name="smol", dtype="float32")
    assert "**Backend:** local, float32  \n" in export_markdown(conv)


def test_messages_export() -> None:
    assert export_messages(sample_conversation()) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there, \x1b[1mhow\x1b[0m are you? [bold]x[/bold]\n"
                                    "second line"},
        {"role": "assistant", "content": "Fine!"},
        {"role": "user", "content": "And then?"},
    ]


def test_export_to_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conv = sample_conversation()
    monkeypatch.chdir(tmp_path)
    md = export_to_file(conv, "md", None)
    assert md.parent == tmp_path and md.name.endswith(f"_{conv.id}.md")
    assert md.read_text("utf-8") == export_markdown(conv)
    msgs = export_to_file(conv, "messages", tmp_path / "out")
    assert msgs == tmp_path / "out"
    assert json.loads(msgs.read_text("utf-8")) == export_messages(conv)
    (tmp_path / "sub").mkdir()
    assert export_to_file(conv, "messages", tmp_path / "sub").name.endswith(".messages.json")
    with pytest.raises(TranscriptError, match="unknown format 'pdf'"):
        export_to_file(conv, "pdf", None)


# ---- autosaving off the event loop ---------------------------------------------------


def test_snapshot_is_equal_and_independent() -> None:
    conv = sample_conversation()
    before = roundtrip(conv)  # a deep copy
    snap = conv.snapshot()
    assert snap == conv == before
    reply = conv.entries[1].replies[0]
    reply.tokens.append(Token(3, 5, "more", -0.5, 0.5))
    reply.text += "more"
    conv.entries[1].replies.append(Reply(SamplingParams()))
    conv.add_user("later")
    conv.model.name = "other"
    assert snap == before  # none of that reached the snapshot


def test_autosaver_writes_the_newest_snapshot_of_each_conversation(tmp_path: Path) -> None:
    from chatui.autosaver import Autosaver

    errors: list[Exception] = []
    saver = Autosaver(errors.append)
    a, b = sample_conversation(), Conversation(id="other")
    b.add_user("b's message")
    for n in range(20):  # queued faster than written: a newer snapshot replaces an older one
        a.add_user(f"message {n}")
        saver.save(a, tmp_path)
    saver.save(b, tmp_path)
    a.add_user("after the last save")  # not in any snapshot
    assert saver.flush(timeout=10)
    saved = load_transcript(autosave_path(a, tmp_path))
    assert [e.content for e in saved.entries][-1] == "message 19"
    assert load_transcript(autosave_path(b, tmp_path)).entries[0].content == "b's message"
    assert errors == []


def test_autosaver_reports_a_failed_save_and_goes_on(tmp_path: Path) -> None:
    from chatui.autosaver import Autosaver

    errors: list[Exception] = []
    saver = Autosaver(errors.append)
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    saver.save(sample_conversation(), blocked / "sub")
    assert saver.flush(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], TranscriptError)
    assert "Could not save" in str(errors[0])
    saver.save(sample_conversation(), tmp_path)  # the thread is still there
    assert saver.flush(timeout=10) and list(tmp_path.glob("*.json"))


# ---- identity: copies and branches (no save may drop what a file holds) -------------


def _exchange(conv: Conversation, text: str) -> None:
    conv.add_user(f"Q {text}")
    entry = conv.add_assistant([SamplingParams()])
    entry.replies[0].text = entry.text = f"A {text}"
    entry.replies[0].tokens = [Token(0, 1, f"A {text}", -0.5, 0.5)]
    entry.replies[0].finish_reason = "stop"


def _texts(conv: Conversation) -> list[str]:
    return [e.content for e in conv.entries]


def test_an_older_copy_opens_in_its_home_tree(tmp_path: Path) -> None:
    """Issue 18: open_transcript of an older copy (what /load does) gives the home's tree with
    the copy's path: the newer messages stay as a branch, going on adds a sibling, and the
    home's file keeps everything (no file of its own)."""
    data, snap = tmp_path / "data", tmp_path / "snap.json"
    conv = Conversation()
    _exchange(conv, "one")
    save_transcript(conv, snap)
    _exchange(conv, "two")
    home = autosave(conv, data)
    opened = tr.open_transcript(snap, data)
    assert opened.id == conv.id and opened.parent == ""
    assert _texts(opened) == ["Q one", "A one"]
    _exchange(opened, "three")
    assert autosave(opened, data) == home
    back = load_transcript(home)
    assert _texts(back) == ["Q one", "A one", "Q three", "A three"]
    assert [e.text for e in back.entries[1].children] == ["Q two", "Q three"]
    assert len(list_transcripts(data)) == 1


def test_a_loaded_older_copy_never_rewinds_its_original(tmp_path: Path) -> None:
    """Issue 14: /save ~/snap.json after one exchange, a second exchange, a copy read without
    its home (load_transcript), then autosaved: it becomes a branch with a file of its own."""
    opener = "load_transcript"
    from chatui.autosaver import Autosaver

    data, snap = tmp_path / "data", tmp_path / "snap.json"
    errors: list[Exception] = []
    saver = Autosaver(errors.append)
    conv = Conversation()
    _exchange(conv, "one")
    saver.save(conv, data)
    save_transcript(conv, snap)  # /save ~/snap.json
    _exchange(conv, "two")
    saver.save(conv, data)
    assert saver.flush(timeout=10)
    home = autosave_path(conv, data)
    loaded = (load_transcript(snap) if opener == "load_transcript"
              else tr.open_transcript(snap, data))
    saver.save(loaded, data)  # the autosave after /load, and on quit
    assert saver.flush(timeout=10) and errors == []
    assert _texts(load_transcript(home)) == ["Q one", "A one", "Q two", "A two"]
    [branch] = [s for s in list_transcripts(data) if s.path != home]
    assert branch.parent == conv.id and branch.messages == 2
    assert loaded.id == branch.id and loaded.parent == conv.id and loaded.branched_at == 2
    _exchange(loaded, "three")  # the branch goes on in its own file
    saver.save(loaded, data)
    assert saver.flush(timeout=10)
    assert _texts(load_transcript(branch.path)) == ["Q one", "A one", "Q three", "A three"]
    assert len(list_transcripts(data)) == 2


def test_opening_keeps_the_identity_when_nothing_is_lost(tmp_path: Path) -> None:
    data = tmp_path / "data"
    conv = Conversation()
    _exchange(conv, "one")
    home = autosave(conv, data)
    assert tr.open_transcript(home, data).id == conv.id  # the autosave itself
    save_transcript(conv, tmp_path / "same.json")
    assert tr.open_transcript(tmp_path / "same.json", data).id == conv.id  # an equal copy
    _exchange(conv, "two")
    save_transcript(conv, tmp_path / "newer.json")
    newer = tr.open_transcript(tmp_path / "newer.json", data)
    assert newer.id == conv.id and newer.parent == ""  # a newer copy extends its home
    other = Conversation()
    _exchange(other, "x")
    save_transcript(other, tmp_path / "mailed.json")  # no home here: it becomes one
    assert tr.open_transcript(tmp_path / "mailed.json", data).id == other.id


def test_autosave_branches_instead_of_dropping_messages(tmp_path: Path) -> None:
    """A retried reply (the last one replaced) and an edited prompt: the file keeps what it
    had; the conversation goes on as a branch, whose id is the same for every writer."""
    conv = Conversation()
    _exchange(conv, "one")
    _exchange(conv, "two")
    home = autosave(conv, tmp_path)
    original = conv.id
    retried = conv.snapshot()
    retried.entries[-1].replies[0] = Reply(SamplingParams(), text="A two, again")
    path = autosave(retried, tmp_path)
    assert retried.id != original and retried.parent == original and retried.branched_at == 3
    assert _texts(load_transcript(home))[-1] == "A two"
    assert _texts(load_transcript(path))[-1] == "A two, again"
    again = conv.snapshot()  # another writer branching the same way lands in the same file
    again.entries[-1].replies[0] = Reply(SamplingParams(), text="A two, again and more")
    assert autosave(again, tmp_path) == path and again.id == retried.id
    edited = conv.snapshot()
    edited.truncate(2)  # a copy rewritten from the second prompt on
    edited.add_user("Q two, edited")
    other = autosave(edited, tmp_path)
    assert other not in (home, path) and edited.parent == original and edited.branched_at == 2
    assert len(list_transcripts(tmp_path)) == 3


def test_a_growing_reply_is_no_loss(tmp_path: Path) -> None:
    """The save when a reply starts holds it empty or partial; the reply's end, a continued
    reply, a picked column and a new column all extend it in place."""
    conv = Conversation()
    conv.add_user("Q")
    entry = conv.add_assistant([SamplingParams()])
    home = autosave(conv, tmp_path)
    entry.replies[0].tokens = [Token(0, 1, "Hel", -0.5, 0.5)]
    entry.replies[0].text = "Hel"
    assert autosave(conv, tmp_path) == home
    entry.replies[0].tokens = entry.replies[0].tokens + [Token(1, 2, "lo", -0.5, 0.5)]
    entry.replies[0].text = "Hello"
    entry.replies[0].finish_reason = "length"
    entry.replies[0].settings = SamplingParams(max_new_tokens=9)
    entry.replies.append(Reply(SamplingParams(seed=1), text="Hi"))
    entry.chosen = 1
    assert autosave(conv, tmp_path) == home and conv.parent == ""
    assert load_transcript(home) == conv


def test_an_unreadable_file_is_never_written_over(tmp_path: Path) -> None:
    conv = Conversation()
    _exchange(conv, "one")
    home = autosave(conv, tmp_path)
    home.write_text("{ damaged")
    _exchange(conv, "two")
    path = autosave(conv, tmp_path)
    assert path != home and home.read_text() == "{ damaged"
    assert _texts(load_transcript(path)) == ["Q one", "A one", "Q two", "A two"]


def test_parent_round_trips_and_is_checked(tmp_path: Path) -> None:
    conv = sample_conversation()
    conv.parent, conv.branched_at = "abc", 1
    assert roundtrip(conv) == conv
    doc = to_json_dict(conv)
    doc["parent"] = {"id": "../x", "messages": 1}
    with pytest.raises(TranscriptError, match="parent.id must be"):
        from_json_dict(doc)
    assert "parent" not in to_json_dict(sample_conversation())


def test_save_as_never_replaces_a_file_holding_more(tmp_path: Path) -> None:
    """``/save PATH`` onto an existing file: a newer version of the same conversation replaces
    it; another conversation, an older version or a file that is no transcript stay."""
    conv = Conversation()
    _exchange(conv, "one")
    path = tmp_path / "snap.json"
    save_transcript(conv, path)
    _exchange(conv, "two")
    save_transcript(conv, path)  # a newer version: fine
    older = load_transcript(path)
    older.truncate(2)
    with pytest.raises(TranscriptError, match=r"it holds messages this conversation does not"):
        save_transcript(older, path)
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    with pytest.raises(TranscriptError, match=r"not a chatui transcript.*nothing was written"):
        save_transcript(conv, notes)
    assert notes.read_text() == '{"my": "notes"}'
    assert _texts(load_transcript(path)) == ["Q one", "A one", "Q two", "A two"]


def test_a_messages_export_loads_back(tmp_path: Path) -> None:
    """The messages export (and any OpenAI-style role/content list) opens as a conversation:
    system messages at its start are the system prompt, a reply's reasoning_content its
    reasoning, text parts joined; it exported the same messages again. What is not such a list
    is refused in one sentence."""
    conv = sample_conversation()
    path = export_to_file(conv, "messages", tmp_path / "c.messages.json")
    back = load_transcript(path)
    assert export_messages(back) == export_messages(conv)
    assert back.id != conv.id and back.entries[1].reply.finish_reason == "stop"
    (tmp_path / "o.json").write_text(json.dumps([
        {"role": "system", "content": "One."}, {"role": "system", "content": "Two."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "},
                                     {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."}]))
    other = load_transcript(tmp_path / "o.json")
    assert other.system_prompt == "One.\n\nTwo." and other.entries[0].text == "Hi there"
    assert other.entries[1].reply.reasoning == "Greet back."
    for data, needle in [
        ([], "an empty list"),
        ([{"content": "x"}], 'no "role"'),
        ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}],
         "system message after the conversation began"),
        ([{"role": "tool", "content": "a"}], "must be \"system\", \"user\" or \"assistant\""),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
         "only text parts"),
        ([{"role": "system", "content": "a"}], "a system prompt and no messages"),
        ([{"role": "user", "content": 3}], "must be a string or a list of text parts"),
    ]:
        (tmp_path / "bad.json").write_text(json.dumps(data))
        with pytest.raises(TranscriptError, match=needle):
            load_transcript(tmp_path / "bad.json")
