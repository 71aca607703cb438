"""The OpenAI-compatible backend against a small fake server on 127.0.0.1 (fast, always run).

The fake speaks just enough of the API: ``GET /v1/models`` and streaming
``POST /v1/chat/completions`` (chunked SSE); each test scripts the chat handler.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from inference import openai_backend as ob
from inference.openai_backend import (
    ChunkMapper,
    OpenAIBackend,
    OpenAIBackendError,
    chat_body,
    iter_sse_data,
    make_openai_factory,
    parse_base_url,
    server_words,
)
from inference.settings import SamplingParams
from inference.types import (
    AssistantPrefix,
    Failed,
    GenerationRequest,
    Message,
    RowDone,
    Started,
    TokenBatch,
)
from inference.worker import InferenceWorker

MODEL = "fake-model"


# ---- the fake server ----


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "FakeServer._HTTP"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    # helpers the scripts use
    def send_json(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if not self.server.fake.keepalive:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def start_sse(self, chunked: bool = True) -> None:
        self.chunked = chunked
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()

    def raw(self, data: bytes) -> None:
        if self.chunked:
            data = f"{len(data):x}\r\n".encode() + data + b"\r\n"
        self.wfile.write(data)
        self.wfile.flush()

    def event(self, obj: Any) -> None:
        payload = obj if isinstance(obj, str) else json.dumps(obj)
        self.raw(f"data: {payload}\n\n".encode())

    def end_sse(self) -> None:
        self.event("[DONE]")
        if self.chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def cut(self) -> None:
        """Drop the connection mid-response."""
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def _authorized(self) -> bool:
        key = self.server.fake.api_key
        if key is None or self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self.send_json(401, {"error": {"message": "Invalid API key", "type": "auth"}})
        return False

    def do_GET(self) -> None:
        fake = self.server.fake
        fake.gets += 1
        if not self._authorized():
            return
        if self.path == "/v1/models":
            if fake.models_failures > 0:
                fake.models_failures -= 1
                self.send_json(503, {"error": {"message": "loading"}})
                return
            self.send_json(200, {"object": "list", "data": fake.models})
        else:
            self.send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        fake = self.server.fake
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        with fake.lock:
            fake.requests.append(body)
            fake.headers.append(dict(self.headers))
        if not self._authorized():
            return
        if self.path != "/v1/chat/completions":
            self.send_json(404, {"detail": "Not Found"})
            return
        fake.chat(self, body)


def chunk(content: str | None = None, entries: list[dict] | None = None,
          finish: str | None = None) -> dict:
    choice: dict[str, Any] = {"index": 0, "delta": {} if content is None else {"content": content},
                              "finish_reason": finish}
    if entries is not None:
        choice["logprobs"] = {"content": entries}
    return {"id": "x", "object": "chat.completion.chunk", "model": MODEL, "choices": [choice]}


def entry(token: str, logprob: float, top: list[tuple[str, float]] = (), data: bytes | None = None
          ) -> dict:
    e: dict[str, Any] = {"token": token, "logprob": logprob,
                         "top_logprobs": [{"token": t, "logprob": lp} for t, lp in top]}
    if data is not None:
        e["bytes"] = list(data)
    return e


def stream_tokens(h: Handler, pieces: list[str], *, delay: float = 0.0, finish: str = "stop",
                  usage: dict | None = None) -> None:
    """A normal reply: one chunk per piece with logprobs, then finish, usage, [DONE]."""
    h.start_sse()
    h.event(chunk("", None))  # role-only first chunk, like vLLM
    for i, p in enumerate(pieces):
        h.event(chunk(p, [entry(p, -0.1 * (i + 1), [(p, -0.1 * (i + 1)), ("alt", -3.0)],
                                p.encode())]))
        if delay:
            time.sleep(delay)
    h.event(chunk(None, None, finish))
    h.event({"id": "x", "choices": [], "usage": usage or {
        "prompt_tokens": 11, "completion_tokens": len(pieces), "total_tokens": 11 + len(pieces),
        "prompt_tokens_details": {"cached_tokens": 3}}})
    h.end_sse()


class FakeServer:
    """An OpenAI-compatible fake on 127.0.0.1; ``chat`` is the script for chat completions."""

    class _HTTP(ThreadingHTTPServer):
        daemon_threads = True
        fake: "FakeServer"

        def handle_error(self, request, client_address) -> None:
            """A client gone mid-reply (the cancel tests close streams) is no error of the
            fake's: its traceback landed in the suite's output once in three runs."""
            if isinstance(sys.exc_info()[1], ConnectionError):
                return
            super().handle_error(request, client_address)

    def __init__(self) -> None:
        self.models: list[dict] = [{"id": MODEL, "object": "model", "max_model_len": 2048}]
        self.models_failures = 0
        self.api_key: str | None = None
        self.keepalive = True
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.gets = 0
        self.lock = threading.Lock()
        self.chat: Callable[[Handler, dict], None] = lambda h, b: stream_tokens(
            h, ["Hel", "lo", " world"])
        self.httpd = self._HTTP(("127.0.0.1", 0), Handler)
        self.httpd.fake = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake():
    server = FakeServer()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch):
    monkeypatch.setattr(ob.transport, "MODELS_BACKOFF_S", 0.01)


def run(backend: OpenAIBackend, request: GenerationRequest,
        cancel: threading.Event | None = None) -> list:
    return list(backend.generate(request, cancel or threading.Event()))


def ask(text: str = "hi", **kw: Any) -> GenerationRequest:
    return GenerationRequest((Message("user", text),), **kw)


def text_of(events: list, row: int = 0) -> str:
    return "".join(t.text for e in events if isinstance(e, TokenBatch) and e.row == row
                   for t in e.tokens)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- pure pieces ----


def test_parse_base_url_roots_and_strips_credentials():
    e = parse_base_url("http://alice:s3cret@127.0.0.1:8000/")
    assert e.api_root == "http://127.0.0.1:8000/v1"
    assert e.display == "http://127.0.0.1:8000"
    assert e.basic_auth == ("alice", "s3cret")
    assert "s3cret" not in repr(e)
    assert parse_base_url("http://h:1/v1").api_root == "http://h:1/v1"
    assert parse_base_url("https://h/openai").api_root == "https://h/openai/v1"
    assert parse_base_url("127.0.0.1:9").api_root == "http://127.0.0.1:9/v1"
    with pytest.raises(OpenAIBackendError, match="http"):
        parse_base_url("ftp://u:p@h/")


def test_sampling_fields_send_extensions_only_when_set():
    body = chat_body(MODEL, (Message("user", "q"),), SamplingParams(), 5)
    assert body["stream"] is True and body["logprobs"] is True and body["top_logprobs"] == 5
    assert body["temperature"] == 0.7 and body["top_p"] == 1.0 and body["max_tokens"] == 512
    for k in ("top_k", "min_p", "repetition_penalty", "repeat_penalty", "seed", "stop",
              "continue_final_message"):
        assert k not in body
    p = SamplingParams(temperature=0.0, top_k=5, min_p=0.1, repetition_penalty=1.2, seed=7,
                       max_new_tokens=9, stop=("\n\n",))
    body = chat_body(MODEL, (Message("user", "q"),), p, 0, AssistantPrefix("Once upon"))
    assert "top_logprobs" not in body
    assert (body["top_k"], body["min_p"], body["repetition_penalty"], body["repeat_penalty"],
            body["seed"], body["max_tokens"], body["stop"]) == (5, 0.1, 1.2, 1.2, 7, 9, ["\n\n"])
    assert body["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    assert body["continue_final_message"] is True and body["add_generation_prompt"] is False


def test_iter_sse_data_handles_comments_fields_and_multiline():
    lines = [": ping", "event: message", "data: {\"a\":", "data: 1}", "", "", "data:[DONE]", ""]
    assert list(iter_sse_data(lines)) == ['{"a":\n1}', "[DONE]"]


def test_server_words_shapes():
    assert server_words('{"error": {"message": "bad top_k"}}') == "bad top_k"
    assert server_words('{"object":"error","message":"vllm says no","code":400}') == "vllm says no"
    assert server_words('{"error": "tgi says no", "error_type": "validation"}') == "tgi says no"
    assert server_words('{"detail":[{"loc":["body","top_k"],"msg":"bad"}]}') == "top_k: bad"
    assert server_words("plain\n text") == "plain text"


def test_mapper_joins_bytes_of_split_glyphs():
    m = ChunkMapper(2)
    e_acute = "é".encode()  # 2 bytes over 2 tokens; the server's content shows U+FFFD
    toks = m.feed({"delta": {"content": "a\ufffd"}, "logprobs": {"content": [
        entry("a", -0.1, [("a", -0.1)], b"a"), entry("\\xc3", -0.2, [], e_acute[:1])]}})
    toks += m.feed({"delta": {"content": "\ufffd"}, "logprobs": {"content": [
        entry("\\xa9", -0.3, [], e_acute[1:])]}})
    emoji = "😀".encode()  # 4 bytes over 3 tokens, one chunk each, content withheld
    for part in (emoji[:1], emoji[1:3], emoji[3:]):
        toks += m.feed({"delta": {"content": ""}, "logprobs": {"content": [
            entry("bytes:" + part.hex(), -0.5, [], part)]}})
    assert [t.text for t in toks] == ["a", "", "é", "", "", "😀"]
    assert [t.glyph_start for t in toks] == [None, None, 1, None, None, 3]
    assert m.text == "aé😀" and "\ufffd" not in m.text
    assert [t.index for t in toks] == list(range(6))
    assert all(t.id is None and t.entropy is None for t in toks)


def test_mapper_without_logprobs_and_with_mismatched_tokens():
    m = ChunkMapper(5)
    toks = m.feed({"delta": {"content": "Hello"}})
    assert toks[0].text == "Hello" and toks[0].logprob is None and toks[0].top == ()
    # token strings that do not add up to the content (no bytes): the content wins
    toks = m.feed({"delta": {"content": " there"}, "logprobs": {"content": [
        entry(" th", -1.0), entry("ERE", -2.0)]}})
    assert [t.text for t in toks] == [" th", "ere"]
    assert m.text == "Hello there"


# ---- against the fake server ----


def test_stream_maps_tokens_logprobs_alternatives_and_usage(fake):
    b = OpenAIBackend(fake.url, None, None)
    assert b.info.name == MODEL and b.info.backend == "openai"
    assert b.info.has_token_ids is False and b.info.has_entropy is False
    assert b.info.context_limit == 2048 and b.info.url == fake.url
    events = run(b, ask(top_logprobs=2))
    assert isinstance(events[0], Started) and events[0].rows == 1
    toks = [t for e in events if isinstance(e, TokenBatch) for t in e.tokens]
    assert [t.text for t in toks] == ["Hel", "lo", " world"]
    assert [t.index for t in toks] == [0, 1, 2]
    assert toks[1].logprob == pytest.approx(-0.2)
    assert [(a.text, a.logprob) for a in toks[1].top] == [("lo", pytest.approx(-0.2)),
                                                         ("alt", -3.0)]
    assert toks[0].id is None and toks[0].top[0].id is None and toks[0].entropy is None
    done = events[-1]
    assert isinstance(done, RowDone) and done.finish_reason == "stop"
    assert done.text == "Hello world"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens,
            done.usage.cached_tokens) == (11, 3, 3)
    sent = fake.requests[0]
    assert sent["model"] == MODEL and sent["top_logprobs"] == 2 and sent["logprobs"] is True
    b.close()


def test_reasoning_content_deltas_fill_the_reasoning(fake):
    """vLLM, SGLang and llama.cpp's server send a reasoning model's thinking as
    ``delta.reasoning_content`` (newer vLLM: ``delta.reasoning``), with logprobs."""

    def chat(h, body):
        h.start_sse()
        h.event(chunk("", None))
        for i, p in enumerate(["Let", " me", " think"]):
            c = chunk(None, [entry(p, -0.5, [(p, -0.5), ("x", -2.0)], p.encode())])
            c["choices"][0]["delta"] = {"reasoning_content": p}
            h.event(c)
        c = chunk(None)
        c["choices"][0]["delta"] = {"reasoning": "."}  # no logprobs for this one
        h.event(c)
        for p in ["Hi", "!"]:
            h.event(chunk(p, [entry(p, -0.1, [(p, -0.1)], p.encode())]))
        h.event(chunk(None, None, "stop"))
        h.end_sse()

    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask(top_logprobs=2))
    toks = [t for e in events if isinstance(e, TokenBatch) for t in e.tokens]
    assert [(t.text, t.channel) for t in toks] == [
        ("Let", "reasoning"), (" me", "reasoning"), (" think", "reasoning"),
        (".", "reasoning"), ("Hi", "answer"), ("!", "answer")]
    assert toks[1].logprob == pytest.approx(-0.5) and toks[3].logprob is None
    assert [t.index for t in toks] == list(range(6))
    assert events[-1].text == "Hi!"
    b.close()


def test_length_finish_and_no_logprobs(fake):
    def chat(h, body):
        h.start_sse()
        h.event(chunk("one"))
        h.event(chunk(" two", None, "length"))
        h.end_sse()
    fake.chat = chat
    b = OpenAIBackend(fake.url, MODEL, None)
    events = run(b, ask())
    toks = [t for e in events if isinstance(e, TokenBatch) for t in e.tokens]
    assert [t.logprob for t in toks] == [None, None]
    assert events[-1] == RowDone(0, "length", "one two", events[-1].usage)
    b.close()


def test_api_key_from_env_and_401_names_the_variable(fake, monkeypatch):
    fake.api_key = "sekrit"
    with pytest.raises(OpenAIBackendError, match="--api-key-env") as err:
        OpenAIBackend(fake.url, None, None)
    assert "401" in err.value.user_message and "Invalid API key" in err.value.user_message
    monkeypatch.setenv("CHATUI_TEST_KEY", "wrong")
    with pytest.raises(OpenAIBackendError, match="CHATUI_TEST_KEY"):
        OpenAIBackend(fake.url, None, "CHATUI_TEST_KEY")
    monkeypatch.delenv("CHATUI_TEST_KEY")
    with pytest.raises(OpenAIBackendError, match="CHATUI_TEST_KEY is not set"):
        OpenAIBackend(fake.url, None, "CHATUI_TEST_KEY")
    monkeypatch.setenv("CHATUI_TEST_KEY", "sekrit")
    b = OpenAIBackend(fake.url.replace("http://", "http://bob:pw@"), None, "CHATUI_TEST_KEY")
    assert b.info.url == fake.url
    assert "sekrit" not in repr(b.info) and "pw" not in repr(b.info)
    events = run(b, ask())
    assert isinstance(events[-1], RowDone)
    assert fake.headers[-1]["Authorization"] == "Bearer sekrit"
    # the key changes on the server: the next reply fails with the variable named
    fake.api_key = "rotated"
    events = run(b, ask())
    assert isinstance(events[-1], Failed) and "CHATUI_TEST_KEY" in events[-1].message
    b.close()


def test_unknown_model_lists_what_the_server_has(fake):
    def chat(h, body):
        h.send_json(404, {"error": {"message": f"The model `{body['model']}` does not exist."}})
    fake.chat = chat
    b = OpenAIBackend(fake.url, "nope", None)
    events = run(b, ask())
    assert isinstance(events[-1], Failed)
    msg = events[-1].message
    assert "'nope'" in msg and "does not exist" in msg and MODEL in msg and "--model" in msg
    assert events[-1].partial == ("",)
    b.close()


def test_rejected_setting_reports_the_servers_words(fake):
    def chat(h, body):
        h.send_json(400, {"object": "error", "type": "BadRequestError", "code": 400,
                          "message": "top_k must be -1 (disable), or at least 1, got 0."})
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask(settings=(SamplingParams(top_k=3),)))
    assert isinstance(events[-1], Failed)
    assert "HTTP 400" in events[-1].message and "top_k must be -1" in events[-1].message
    assert len([e for e in events if isinstance(e, (RowDone, Failed))]) == 1
    b.close()


def test_500_is_one_sentence_and_chat_is_never_retried(fake):
    fake.chat = lambda h, body: h.send_json(500, {"error": {"message": "CUDA error: boom"}})
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask())
    assert isinstance(events[-1], Failed)
    assert "HTTP 500" in events[-1].message and "CUDA error: boom" in events[-1].message
    assert len(fake.requests) == 1
    b.close()


def test_models_list_is_retried_with_backoff_then_gives_up(fake):
    fake.models_failures = 2
    b = OpenAIBackend(fake.url, None, None)
    assert fake.gets == 3 and b.info.name == MODEL
    b.close()
    fake.models_failures = 5
    fake.gets = 0
    with pytest.raises(OpenAIBackendError, match="HTTP 503"):
        OpenAIBackend(fake.url, None, None)
    assert fake.gets == ob.MODELS_ATTEMPTS


def test_no_models_is_an_error_unless_a_name_is_given(fake):
    fake.models = []
    with pytest.raises(OpenAIBackendError, match="lists no models.*--model"):
        OpenAIBackend(fake.url, None, None)
    assert OpenAIBackend(fake.url, "given", None).info.name == "given"


def test_stream_cut_mid_reply_keeps_the_partial_text(fake):
    def chat(h, body):
        h.start_sse()
        h.event(chunk("Hel", [entry("Hel", -0.1)]))
        h.event(chunk("lo", [entry("lo", -0.1)]))
        h.cut()
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask())
    assert text_of(events) == "Hello"
    assert not any(isinstance(e, RowDone) for e in events)
    assert isinstance(events[-1], Failed)
    assert "mid-reply after 2 tokens" in events[-1].message
    assert events[-1].partial == ("Hello",)
    # the backend stays usable
    fake.chat = lambda h, body: stream_tokens(h, ["ok"])
    assert run(b, ask())[-1].text == "ok"
    b.close()


def test_stream_ending_without_finish_or_done_is_a_cut(fake):
    def chat(h, body):
        h.start_sse(chunked=False)
        h.event(chunk("Hi", [entry("Hi", -0.1)]))
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask())
    assert isinstance(events[-1], Failed) and "closed the stream mid-reply" in events[-1].message
    assert events[-1].partial == ("Hi",)
    b.close()


def test_done_without_a_finish_reason_is_not_a_silent_stop(fake):
    def chat(h, body):  # what llama-cpp-python does when another request interrupts it
        h.start_sse()
        h.event(chunk("Hi", [entry("Hi", -0.1)]))
        h.end_sse()
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask())
    assert isinstance(events[-1], Failed) and "without a finish reason" in events[-1].message
    assert events[-1].partial == ("Hi",)
    b.close()


def test_malformed_event_and_error_event(fake):
    def chat(h, body):
        h.start_sse()
        h.event(chunk("Hi", [entry("Hi", -0.1)]))
        h.event("{not json")
        h.end_sse()
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask())
    assert isinstance(events[-1], Failed)
    assert "malformed" in events[-1].message and "not JSON" in events[-1].message
    assert events[-1].partial == ("Hi",)

    def chat_err(h, body):
        h.start_sse()
        h.event(chunk("Hi", [entry("Hi", -0.1)]))
        h.event({"error": {"message": "out of KV cache", "code": 500}})
        h.end_sse()
    fake.chat = chat_err
    events = run(b, ask())
    assert "out of KV cache" in events[-1].message and events[-1].partial == ("Hi",)

    def not_sse(h, body):
        h.send_json(200, {"choices": [{"message": {"content": "whole"}}]})
    fake.chat = not_sse
    events = run(b, ask())
    assert isinstance(events[-1], Failed) and "instead of an event stream" in events[-1].message
    b.close()


def test_connection_refused_is_one_sentence():
    port = free_port()
    with pytest.raises(OpenAIBackendError, match="connection refused") as err:
        OpenAIBackend(f"http://127.0.0.1:{port}", "m", None)
    assert err.value.user_message.count(".") >= 1 and "Traceback" not in err.value.user_message


def test_server_gone_after_load_fails_the_row(fake):
    fake.keepalive = False  # no idle connection left over from GET /v1/models
    b = OpenAIBackend(fake.url, None, None)
    fake.close()
    events = run(b, ask())
    assert isinstance(events[-1], Failed) and "connection refused" in events[-1].message
    b.close()


def test_read_timeout(fake):
    def chat(h, body):
        h.start_sse()
        time.sleep(4)
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None, timeout_s=0.3)
    t = time.perf_counter()
    events = run(b, ask())
    assert time.perf_counter() - t < 3
    assert isinstance(events[-1], Failed) and "within 0.3 s" in events[-1].message
    b.close()


def test_cancel_closes_the_connection_and_keeps_the_partial(fake):
    gone = threading.Event()

    def chat(h, body):
        h.start_sse()
        try:
            for i in range(400):
                h.event(chunk(f"w{i} ", [entry(f"w{i} ", -0.1)]))
                time.sleep(0.02)
            h.end_sse()
        except OSError:  # the client closed the connection
            gone.set()
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    cancel = threading.Event()
    events = []
    for ev in b.generate(ask(), cancel):
        events.append(ev)
        if isinstance(ev, TokenBatch) and ev.tokens[-1].index >= 2:
            cancel.set()
    done = events[-1]
    assert isinstance(done, RowDone) and done.finish_reason == "cancelled"
    assert done.text == text_of(events) and done.text.startswith("w0 w1 w2 ")
    assert gone.wait(3), "the server never saw the connection close"
    b.close()


def test_cancel_while_waiting_for_the_first_token_is_quick(fake):
    def chat(h, body):
        h.start_sse()
        time.sleep(5)
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t = time.perf_counter()
    events = run(b, ask(), cancel)
    assert time.perf_counter() - t < 3
    assert events[-1] == RowDone(0, "cancelled", "", events[-1].usage)
    b.close()


def test_compare_three_rows_run_concurrently(fake):
    barrier = threading.Barrier(3, timeout=5)

    def chat(h, body):
        barrier.wait()  # only passes when all three requests are in flight at once
        word = f"t{body['temperature']:g}"
        stream_tokens(h, [word, " a", " b"], delay=0.01)
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    temps = (0.0, 0.5, 1.0)
    events = run(b, ask(settings=tuple(SamplingParams(temperature=t) for t in temps)))
    assert isinstance(events[0], Started) and events[0].rows == 3
    done = {e.row: e for e in events if isinstance(e, RowDone)}
    assert sorted(done) == [0, 1, 2]
    for row, t in enumerate(temps):
        assert done[row].text == f"t{t:g} a b" == text_of(events, row)
        assert done[row].finish_reason == "stop"
    assert sorted(r["temperature"] for r in fake.requests) == list(temps)
    b.close()


def test_compare_one_failed_row_keeps_the_others(fake):
    def chat(h, body):
        if body["temperature"] == 2.0:
            h.send_json(400, {"error": {"message": "temperature must be <= 1.5"}})
        else:
            stream_tokens(h, ["fine"])
    fake.chat = chat
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask(settings=(SamplingParams(temperature=0.0),
                                  SamplingParams(temperature=2.0))))
    done = [e for e in events if isinstance(e, RowDone)]
    assert [d.row for d in done] == [0] and done[0].text == "fine"
    assert isinstance(events[-1], Failed)
    assert events[-1].message.startswith("Column 2:") and "<= 1.5" in events[-1].message
    assert events[-1].partial == ("fine", "")
    b.close()


def test_prefix_is_sent_as_a_final_assistant_message(fake):
    b = OpenAIBackend(fake.url, None, None)
    events = run(b, ask(prefix=AssistantPrefix("Once upon")))
    sent = fake.requests[-1]
    assert sent["messages"][-1] == {"role": "assistant", "content": "Once upon"}
    assert sent["continue_final_message"] is True and sent["add_generation_prompt"] is False
    assert events[-1].text == "Hello world"
    b.close()


def test_count_tokens_is_an_estimate_and_reset_is_harmless(fake):
    b = OpenAIBackend(fake.url, None, None)
    assert b.count_tokens((Message("user", "x" * 40),)) == 14
    b.reset()
    b.close()


async def test_through_the_async_worker(fake, monkeypatch):
    monkeypatch.setenv("CHATUI_TEST_KEY", "k")
    fake.api_key = "k"
    worker = InferenceWorker(make_openai_factory(fake.url.replace("//", "//u:p@"), None,
                                                 "CHATUI_TEST_KEY"))
    try:
        loaded = await worker.load().collect()
        assert not any(isinstance(e, Failed) for e in loaded)
        assert worker.info is not None and worker.info.url == fake.url
        events = await worker.generate(ask()).collect()
        assert isinstance(events[-1], RowDone) and events[-1].text == "Hello world"
        assert await worker.count_tokens((Message("user", "abcd"),)) == 5
    finally:
        worker.close()
        worker.join(5)


async def test_worker_load_failure_is_one_sentence():
    worker = InferenceWorker(make_openai_factory(f"http://127.0.0.1:{free_port()}", None, None))
    try:
        events = await worker.load().collect()
        assert isinstance(events[-1], Failed)
        assert events[-1].message.startswith("Cannot connect to http://127.0.0.1:")
        assert "connection refused" in events[-1].message
    finally:
        worker.close()
        worker.join(5)


def _counting(honours: bool) -> Callable[[Handler, dict], None]:
    """A chat script whose one-token answers count the prompt as a template would: with the
    continuation fields honoured, the final message stays open (two tokens shorter)."""
    def chat(h: Handler, body: dict) -> None:
        if body.get("stream"):
            stream_tokens(h, ["Hel", "lo", " world"])
            return
        n = 4 * len(body["messages"]) + 6
        if honours and body.get("continue_final_message"):
            n -= 2
        h.send_json(200, {"id": "x", "object": "chat.completion", "model": MODEL,
                          "choices": [{"index": 0, "finish_reason": "length",
                                       "message": {"role": "assistant", "content": "x"}}],
                          "usage": {"prompt_tokens": n, "completion_tokens": 1,
                                    "total_tokens": n + 1}})
    return chat


@pytest.mark.parametrize("honours", [True, False])
def test_a_server_that_would_start_a_new_reply_is_not_asked_to_continue(fake, honours):
    """Found using chatui in tmux: llama-cpp-python's server ignores continue_final_message,
    and /continue showed a new reply joined to the old one. Two one-token requests, once,
    tell such a server apart by the prompt it counts; its continuations fail in one sentence
    (the chat then keeps the reply as it was), and a server that honours them continues."""
    fake.chat = _counting(honours)
    b = OpenAIBackend(fake.url, None, None)
    for _ in range(2):
        events = run(b, ask(prefix=AssistantPrefix("Once upon")))
        if honours:
            assert events[-1].text == "Hello world"
        else:
            assert events == [Failed(ob.continuation.CONTINUE_UNSUPPORTED)]
    probes = [r for r in fake.requests if not r.get("stream")]
    assert len(probes) == 2  # asked once
    assert [r.get("continue_final_message") for r in probes] == [True, None]
    assert run(b, ask())[-1].text == "Hello world"  # a new reply is never refused
    b.close()
