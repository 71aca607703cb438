"""The HTTP side of the OpenAI backend: one ``httpx`` client per backend, ``GET /v1/models``
(the only request retried), one streaming chat completion per row whose socket another thread
can shut to cancel it (``RowControl``), and every transport or server failure described in one
sentence."""

from __future__ import annotations

import errno
import json
import queue
import socket
import threading
import time
from typing import Any

import httpx

from ..types import TokenBatch
from .protocol import (ChunkMapper, Endpoint, OpenAIBackendError, iter_sse_data, map_finish_reason,
                       read_api_key, server_words)

DEFAULT_TIMEOUT_S = 120.0
"""Longest wait for the server's next bytes (the first token included) before giving up."""
CONNECT_TIMEOUT_S = 10.0
MODELS_ATTEMPTS = 3
"""``GET /v1/models`` tries (the only call retried: it is idempotent)."""
MODELS_BACKOFF_S = 0.5
"""First pause between tries; doubled after each."""


class RowControl:
    """Lets the generator abort one row's request from its own thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.aborted = threading.Event()
        self._sock: socket.socket | None = None

    def attach(self, response: httpx.Response) -> bool:
        """Remember the response's socket; False when the row was aborted already."""
        stream = response.extensions.get("network_stream")
        sock = None
        if stream is not None:
            try:
                sock = stream.get_extra_info("socket")
            except Exception:  # noqa: BLE001 - no socket: cancel falls back to between chunks
                sock = None
        with self._lock:
            if self.aborted.is_set():
                return False
            self._sock = sock
            return True

    def detach(self) -> None:
        """The request is over: forget the socket (it may go back to the pool)."""
        with self._lock:
            self._sock = None

    def abort(self) -> None:
        """Stop the row; a read blocked on the socket returns at once (so the server sees the
        connection close and stops generating)."""
        with self._lock:
            self.aborted.set()
            sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Server:
    """One OpenAI-compatible server as the backend uses it. ``model`` is the name requests ask
    for (set by the backend once chosen); ``models`` what ``GET /v1/models`` listed."""

    def __init__(self, endpoint: Endpoint, api_key_env: str | None, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.model = ""
        self.models: list[dict[str, Any]] = []
        self.continues: bool | None = None
        """Whether it honours ``continue_final_message`` (``continuation``; None: unknown)."""
        self.asked_continues = False
        headers = {"Accept": "application/json"}
        key = read_api_key(api_key_env)
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        auth = httpx.BasicAuth(*endpoint.basic_auth) if (
            endpoint.basic_auth and key is None) else None
        self.client = httpx.Client(
            headers=headers, auth=auth, follow_redirects=False, trust_env=False,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=8))
        del key

    def close(self) -> None:
        self.client.close()

    def stream_chat(self, row: int, body: dict[str, Any], mapper: ChunkMapper,
                    control: RowControl, out: queue.Queue[Any]
                    ) -> tuple[str, dict[str, Any] | None]:
        """One streaming chat completion: a ``TokenBatch`` into ``out`` per chunk with tokens;
        returns (finish reason, the server's usage). Raises ``RowAborted`` when ``control``
        was aborted, else the failure ``describe`` turns into a sentence."""
        url = self.endpoint.api_root + "/chat/completions"
        finish: str | None = None
        usage: dict[str, Any] | None = None
        # A fresh connection per reply: a chat completion is never retried, so it must not
        # meet a keep-alive connection the server has dropped meanwhile (a spurious reset).
        with self.client.stream("POST", url, json=body, headers={
                "Accept": "text/event-stream", "Connection": "close"}) as response:
            if not control.attach(response):
                raise RowAborted
            if response.status_code >= 400:
                response.read()
                raise _HTTPStatus(response.status_code, response.text)
            ctype = response.headers.get("content-type", "")
            if "text/event-stream" not in ctype:
                response.read()
                words = server_words(response.text, 200)
                raise _Malformed(f"the server answered with {ctype or 'no content type'} "
                                 f"instead of an event stream ({words!r})")
            done = False
            for data in iter_sse_data(response.iter_lines()):
                if control.aborted.is_set():
                    raise RowAborted
                if data.strip() == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    raise _Malformed(f"an event is not JSON ({_clip(data)!r})") from None
                if not isinstance(chunk, dict):
                    raise _Malformed(f"an event is not a JSON object ({_clip(data)!r})")
                if "error" in chunk:
                    raise _StreamError(server_words(json.dumps(chunk)))
                if isinstance(chunk.get("usage"), dict):
                    usage = chunk["usage"]
                choices = chunk.get("choices")
                if choices is None:
                    continue
                if not isinstance(choices, list):
                    raise _Malformed(f"'choices' is not a list ({_clip(data)!r})")
                for choice in choices:
                    if not isinstance(choice, dict):
                        raise _Malformed(f"a choice is not an object ({_clip(data)!r})")
                    try:
                        tokens = mapper.feed(choice)
                    except ValueError as exc:
                        raise _Malformed(f"{exc} ({_clip(data)!r})") from None
                    if tokens:
                        out.put(TokenBatch(row, tuple(tokens)))
                    reason = choice.get("finish_reason")
                    if isinstance(reason, str) and reason:
                        finish = map_finish_reason(reason)
            if control.aborted.is_set():
                raise RowAborted
            if finish is None:
                raise _Cut(done)
        return finish, usage

    def describe(self, exc: Exception, mapper: ChunkMapper) -> str:
        """One sentence for a failed row."""
        where = self.endpoint.display
        n = mapper.index
        kept = f" after {n} token{'s' if n != 1 else ''}; the partial reply is kept" if n else ""
        tail = f"; the partial reply ({n} token{'s' if n != 1 else ''}) is kept" if n else ""
        if isinstance(exc, _HTTPStatus):
            return self.describe_status(exc.status, server_words(exc.body), "chat completion")
        if isinstance(exc, _Cut) and exc.args and exc.args[0]:
            return (f"The server at {where} ended the stream without a finish reason"
                    f"{kept or ' before any token'} (llama-cpp-python does this when another "
                    "request interrupts the reply: start it with --interrupt_requests false).")
        if isinstance(exc, _Cut) and not n:
            return (f"The server at {where} closed the stream before any token; its log says why "
                    "(often a prompt longer than its context window).")
        if isinstance(exc, _Cut):
            return f"The server at {where} closed the stream mid-reply{kept}."
        if isinstance(exc, _Malformed):
            return f"The server at {where} sent a malformed stream: {exc.args[0]}{tail}."
        if isinstance(exc, _StreamError):
            return f"The server at {where} reported an error mid-stream: {exc.args[0]}{tail}."
        if isinstance(exc, httpx.ReadTimeout):
            if mapper.index:
                return (f"The server at {where} sent nothing for {self.timeout_s:g} s mid-reply"
                        f"{kept}.")
            return (f"The server at {where} did not start replying within {self.timeout_s:g} s "
                    "(read timeout); it may be overloaded or still loading the model.")
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)) and mapper.index:
            return f"The connection to {where} broke mid-reply{kept}."
        return self.describe_transport(exc)

    def describe_transport(self, exc: Exception) -> str:
        where = self.endpoint.display
        if isinstance(exc, httpx.ConnectTimeout):
            return f"Connecting to {where} timed out after {min(CONNECT_TIMEOUT_S, self.timeout_s):g} s."
        if isinstance(exc, httpx.ConnectError):
            if _refused(exc):
                return (f"Cannot connect to {where}: connection refused (is the server "
                        "running and listening on that host and port?).")
            return f"Cannot connect to {where}: {_reason(exc)}."
        if isinstance(exc, httpx.TimeoutException):
            return f"The server at {where} did not answer within {self.timeout_s:g} s."
        if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
            return f"The connection to {where} broke before a reply ({_reason(exc)})."
        if isinstance(exc, httpx.HTTPError):
            return f"The request to {where} failed: {_reason(exc)}."
        return f"The OpenAI backend failed unexpectedly: {_reason(exc)} ({type(exc).__name__})."

    def describe_status(self, status: int, words: str, what: str) -> str:
        where = self.endpoint.display
        said = f": {words}" if words else ""
        if status in (401, 403):
            if self.api_key_env:
                fix = (f"check the API key in the environment variable {self.api_key_env}")
            else:
                fix = ("the server wants an API key: put it in an environment variable and "
                       "pass --api-key-env NAME")
            word = "unauthorized" if status == 401 else "forbidden"
            return f"The server at {where} refused the {what} as {word} (HTTP {status}{said}); {fix}."
        if status == 404 and what == "chat completion":
            names = [str(m.get("id")) for m in self.models if m.get("id")]
            if self.model not in names:
                listed = f"; it lists: {', '.join(names[:8])}" if names else ""
                return (f"The server at {where} has no model {self.model!r} "
                        f"(HTTP 404{said}){listed}; pick one with --model.")
            return f"The server at {where} has no chat completions endpoint (HTTP 404{said})."
        if 400 <= status < 500:
            return f"The server at {where} rejected the {what} (HTTP {status}{said})."
        return f"The server at {where} failed (HTTP {status}{said}); try again or check its log."

    def list_models(self, *, required: bool) -> list[dict[str, Any]]:
        """``GET /v1/models``, retried with backoff on connection errors, timeouts and 5xx.

        When ``required`` is False (a model name was given) a 404 gives an empty list.
        """
        url = self.endpoint.api_root + "/models"
        pause = MODELS_BACKOFF_S
        for attempt in range(1, MODELS_ATTEMPTS + 1):
            last = attempt == MODELS_ATTEMPTS
            try:
                response = self.client.get(url)
            except httpx.TransportError as exc:
                if last or not isinstance(exc, (httpx.ConnectError, httpx.TimeoutException,
                                                httpx.RemoteProtocolError, httpx.ReadError)):
                    raise OpenAIBackendError(self.describe_transport(exc)) from None
            else:
                if response.status_code < 400:
                    try:
                        data = response.json()
                    except ValueError:
                        raise OpenAIBackendError(
                            f"The server at {self.endpoint.display} answered GET /v1/models "
                            f"with something that is not JSON ({_clip(response.text)!r}); is "
                            "this an OpenAI-compatible server?") from None
                    items = data.get("data") if isinstance(data, dict) else None
                    return [m for m in items if isinstance(m, dict)] if isinstance(items, list) \
                        else []
                if response.status_code == 404 and not required:
                    return []
                if response.status_code < 500 or last:
                    words = server_words(response.text)
                    msg = self.describe_status(response.status_code, words, "model list request")
                    if response.status_code == 404:
                        msg = msg[:-1] + "; is the base URL right, or pass --model NAME."
                    raise OpenAIBackendError(msg)
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")

    def first_model_id(self) -> str:
        for m in self.models:
            if isinstance(m.get("id"), str) and m["id"]:
                return m["id"]
        raise OpenAIBackendError(
            f"The server at {self.endpoint.display} lists no models (GET /v1/models); "
            "pass --model NAME.")


class RowAborted(Exception):
    """The generator aborted this row (cancel or the consumer went away)."""


class _Cut(Exception):
    """The stream ended without a finish reason (``args[0]``: whether [DONE] came)."""


class _Malformed(Exception):
    """The stream had an event that is not a chat completion chunk."""


class _StreamError(Exception):
    """The server put an error object into the stream."""


class _HTTPStatus(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(status)
        self.status = status
        self.body = body


def _refused(exc: BaseException) -> bool:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ConnectionRefusedError) or getattr(e, "errno", None) == errno.ECONNREFUSED:
            return True
        if "refused" in str(e).lower():
            return True
        e = e.__cause__ or e.__context__
    return False


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
