"""A backend that streams from an OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp).

``chatui --backend openai --base-url URL [--model NAME] [--api-key-env VAR]`` runs the same
TUI, token view, comparison and transcripts against a remote server: the worker drives this
backend like any other, and the app never knows where a token came from.

What maps to what:

* One settings row = one streaming ``POST /v1/chat/completions`` (``stream: true``,
  ``logprobs: true``, ``top_logprobs: k``). Compare mode sends the N rows as N concurrent
  requests (a thread each) and interleaves their events into the one iterator.
* Each ``logprobs.content`` entry becomes a :class:`Token` with its text, logprob and top-k
  :class:`Alternative` s. What a server cannot give is ``None``, never invented: token ids
  (``ModelInfo.has_token_ids`` is False), the entropy of the full distribution
  (``has_entropy`` is False), and the logprob itself when the server sends no logprobs.
* ``bytes`` fields are joined across tokens, so a glyph split over several tokens reaches the
  text whole (no U+FFFD): the earlier tokens carry ``""`` and the glyph's last token carries
  the glyph with ``glyph_start`` set to where it began.
* Sampling: ``temperature``, ``top_p``, ``seed``, ``max_tokens``, ``stop`` always; the common
  extensions ``top_k``, ``min_p`` and ``repetition_penalty`` (also sent as llama.cpp's
  ``repeat_penalty``) only when they differ from "disabled", so a server that lacks them
  still works with default settings and the server's own defaults apply otherwise.
* :class:`AssistantPrefix` (continue a partial reply) is sent as a final assistant message with
  ``continue_final_message: true, add_generation_prompt: false`` (vLLM, SGLang). The server
  re-encodes the text, so the continuation is text-exact but not token-exact: token-exact
  continuation (``AssistantPrefix.token_ids``) is only for the local engine. Servers that do
  not know these fields (llama.cpp) start a new assistant turn instead. ``RowDone.text`` is the
  continuation only, like the local engine's.

Events and failures (one clear sentence each, nothing lost):

* ``Started`` first (prompt tokens estimated; the server's count comes in ``RowDone.usage``).
* A row that ends normally gets ``RowDone(row, "stop" | "length", text, usage)``; cancel
  (``cancel`` is polled every 50 ms, not only between chunks) closes that row's connection so
  the server stops generating, and the row ends with ``RowDone(row, "cancelled", partial)``.
* A row that fails (connection refused, timeout, 401/403, unknown model, a 4xx with the
  server's words, a 5xx, a stream cut mid-reply, a malformed event) gets no ``RowDone``: the
  tokens that arrived were already yielded, the other rows run to their end, and then one
  ``Failed(message, partial)`` comes last, where ``partial`` holds every row's text by row
  index (the finished rows' full text, the failed rows' partial text).
* Only ``GET /v1/models`` is retried (bounded, with backoff); a chat completion never is.

The API key is read from the environment variable named by ``--api-key-env`` when the backend
is built, and is never stored in :class:`ModelInfo`, transcripts or messages;
``ModelInfo.url`` is the base URL without ``user:pass@``.
"""

from __future__ import annotations

import codecs
import errno
import json
import logging
import math
import os
import queue
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

import httpx

from .backend import BackendFactory, ProgressCallback
from .settings import SamplingParams
from .types import (
    Alternative,
    AssistantPrefix,
    Event,
    Failed,
    GenerationRequest,
    Message,
    ModelInfo,
    Progress,
    RowDone,
    Started,
    Token,
    TokenBatch,
    Usage,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 120.0
"""Longest wait for the server's next bytes (the first token included) before giving up."""
CONNECT_TIMEOUT_S = 10.0
MODELS_ATTEMPTS = 3
"""``GET /v1/models`` tries (the only call retried: it is idempotent)."""
MODELS_BACKOFF_S = 0.5
"""First pause between tries; doubled after each."""
CANCEL_POLL_S = 0.05


class OpenAIBackendError(RuntimeError):
    """The server cannot be used; ``user_message`` is the one sentence to show."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.user_message = message


# ---- URLs and keys ----


@dataclass(frozen=True)
class Endpoint:
    """Where the server's OpenAI API lives."""

    api_root: str
    """The URL requests go to, ending in ``/v1``, without credentials."""
    display: str
    """The base URL as given, without credentials (for ModelInfo.url, transcripts, messages)."""
    basic_auth: tuple[str, str] | None = field(default=None, repr=False)
    """``user:pass@`` from the URL, used as HTTP basic auth, never shown."""


def parse_base_url(base_url: str) -> Endpoint:
    """Split a base URL into the API root (``.../v1``), a display form and any credentials.

    ``http://host:8000``, ``http://host:8000/`` and ``http://host:8000/v1`` all give the API
    root ``http://host:8000/v1``; a path that does not end in ``/v1`` gets ``/v1`` appended.

    Raises:
        OpenAIBackendError: for a URL that is not http(s) or has no host.
    """
    text = base_url.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OpenAIBackendError(
            f"--base-url must be an http(s) URL such as http://127.0.0.1:8000/v1; "
            f"got {redact_url(base_url)!r}")
    host = parts.hostname
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    path = parts.path.rstrip("/")
    display = urlunsplit((parts.scheme, netloc, path, "", ""))
    api_path = path if path.endswith("/v1") else path + "/v1"
    api_root = urlunsplit((parts.scheme, netloc, api_path, "", ""))
    auth = None
    if parts.username is not None:
        auth = (parts.username, parts.password or "")
    return Endpoint(api_root=api_root, display=display, basic_auth=auth)


def redact_url(url: str) -> str:
    """The URL with any ``user:pass@`` removed."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if parts.username is None and parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def read_api_key(api_key_env: str | None) -> str | None:
    """The key from the environment variable ``api_key_env`` (None when no variable is named).

    Raises:
        OpenAIBackendError: when the variable is named but unset or empty.
    """
    if not api_key_env:
        return None
    key = os.environ.get(api_key_env, "").strip()
    if not key:
        raise OpenAIBackendError(
            f"The environment variable {api_key_env} is not set; put the API key there "
            f"(export {api_key_env}=...) or leave out --api-key-env for a server without a key.")
    return key


# ---- request bodies ----


def sampling_fields(params: SamplingParams) -> dict[str, Any]:
    """Request fields for one settings row (extensions only when not at their "off" value)."""
    body: dict[str, Any] = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": params.max_new_tokens,
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    if params.top_k != 0:
        body["top_k"] = params.top_k
    if params.min_p != 0.0:
        body["min_p"] = params.min_p
    if params.repetition_penalty != 1.0:
        body["repetition_penalty"] = params.repetition_penalty
        body["repeat_penalty"] = params.repetition_penalty  # llama.cpp's name
    return body


def chat_body(model: str, messages: tuple[Message, ...], params: SamplingParams,
              top_logprobs: int, prefix: AssistantPrefix | None = None) -> dict[str, Any]:
    """The JSON body of one streaming chat completion."""
    msgs = [{"role": m.role, "content": m.content} for m in messages]
    body: dict[str, Any] = {"model": model, "messages": msgs, "stream": True,
                            "stream_options": {"include_usage": True}, "logprobs": True}
    if top_logprobs > 0:
        body["top_logprobs"] = top_logprobs
    body.update(sampling_fields(params))
    if prefix is not None:
        msgs.append({"role": "assistant", "content": prefix.text})
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    return body


# ---- server answers ----


def server_words(text: str, limit: int = 400) -> str:
    """The human part of an error body (OpenAI, vLLM, TGI, FastAPI shapes), else the raw text."""
    words = ""
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            words = str(err.get("message") or err.get("msg") or "")
        elif isinstance(err, str):
            words = err
        if not words and isinstance(data.get("message"), str):
            words = data["message"]
        detail = data.get("detail")
        if not words and isinstance(detail, str):
            words = detail
        elif not words and isinstance(detail, list):
            bits = []
            for d in detail:
                if isinstance(d, dict):
                    loc = ".".join(str(x) for x in d.get("loc", ()) if x != "body")
                    bits.append(f"{loc}: {d.get('msg', '')}" if loc else str(d.get("msg", "")))
            words = "; ".join(bits)
    if not words:
        words = " ".join(text.split())
    words = words.strip()
    return words if len(words) <= limit else words[: limit - 1] + "…"


def iter_sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The ``data`` payload of each server-sent event (multi-line data joined with newlines).

    Comments (``:``), ``event:``/``id:``/``retry:`` fields and blank keep-alives are skipped.
    """
    data: list[str] = []
    for line in lines:
        line = line.rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


class _Utf8Joiner:
    """Joins token ``bytes`` into whole glyphs and says where a split glyph began."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._start: int | None = None

    @property
    def pending(self) -> bool:
        return bool(self._decoder.getstate()[0])

    def feed(self, index: int, data: bytes) -> tuple[str, int | None]:
        """Text this token adds and, when it completes a glyph begun earlier, that token."""
        began = self._start
        text = self._decoder.decode(data)
        glyph_start = None
        if began is not None and (text or not self.pending):
            glyph_start = began
            self._start = None
        if self.pending and self._start is None:
            self._start = index
        return text, glyph_start

    def flush(self) -> str:
        """What is left (an incomplete sequence becomes U+FFFD: the bytes were never a glyph)."""
        self._start = None
        return self._decoder.decode(b"", final=True)


def _fit(texts: list[str], content: str) -> list[str]:
    """Make token texts add up to ``content``: matching pieces kept, the rest on the last."""
    out: list[str] = []
    pos = 0
    for t in texts:
        if t and content.startswith(t, pos):
            out.append(t)
            pos += len(t)
        else:
            out.append("")
    if out and pos < len(content):
        out[-1] += content[pos:]
    return out


class ChunkMapper:
    """Turns one row's stream of chunk ``choices`` into :class:`Token` s.

    The reply text is the join of the token texts. When the server sends logprob entries,
    they make the tokens (the chunk's ``delta.content`` decides their text, except where
    ``bytes`` are exact); without logprobs each content piece is one token with logprob None.
    """

    def __init__(self, top_logprobs: int) -> None:
        self.top_logprobs = top_logprobs
        self.index = 0
        self.parts: list[str] = []
        self._joiner = _Utf8Joiner()
        self.saw_logprobs = False

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def feed(self, choice: dict[str, Any]) -> list[Token]:
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError("delta.content is not a string")
        lp = choice.get("logprobs")
        entries = lp.get("content") if isinstance(lp, dict) else None
        if entries:
            return self._from_entries(entries, content)
        if content:
            return self._emit([(content, None, (), None, content)])
        return []

    def _from_entries(self, entries: list[Any], content: str | None) -> list[Token]:
        self.saw_logprobs = True
        rows: list[tuple[str, float | None, tuple[Alternative, ...], int | None, str]] = []
        all_bytes = True
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise ValueError("a logprobs entry is not an object")
            raw = e.get("token")
            raw = raw if isinstance(raw, str) else ""
            data = e.get("bytes")
            glyph_start = None
            if isinstance(data, list) and all(isinstance(b, int) and 0 <= b < 256 for b in data):
                text, glyph_start = self._joiner.feed(self.index + i, bytes(data))
            else:
                all_bytes = False
                text = self._joiner.flush() + raw
            rows.append((text, _logprob(e.get("logprob")), self._alternatives(e), glyph_start, raw))
        texts = [r[0] for r in rows]
        joined = "".join(texts)
        if content is not None and joined != content and not all_bytes and "\ufffd" not in content:
            texts = _fit(texts, content)
            rows = [(t, *r[1:]) for t, r in zip(texts, rows)]
        return self._emit(rows)

    def _alternatives(self, entry: dict[str, Any]) -> tuple[Alternative, ...]:
        top = entry.get("top_logprobs") or []
        alts = []
        for a in top if isinstance(top, list) else []:
            if isinstance(a, dict) and isinstance(a.get("token"), str):
                v = _logprob(a.get("logprob"))
                if v is not None:
                    alts.append(Alternative(None, a["token"], v))
        alts.sort(key=lambda a: -a.logprob)
        return tuple(alts[: self.top_logprobs])

    def _emit(self, rows: list[tuple[str, float | None, tuple[Alternative, ...], int | None, str]]
              ) -> list[Token]:
        out = []
        for text, logprob, top, glyph_start, raw in rows:
            out.append(Token(index=self.index, id=None, text=text, logprob=logprob, entropy=None,
                             top=top, glyph_start=glyph_start, raw=raw))
            self.parts.append(text)
            self.index += 1
        return out


def _logprob(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
        return max(float(v), -1e30)  # -inf (some servers) stays very unlikely but finite
    return None


def map_finish_reason(reason: str) -> str:
    """OpenAI finish reasons -> chatui's (anything else the server ends with is a stop)."""
    return "length" if reason == "length" else "stop"


# ---- one row's request, on its own thread ----


class _RowControl:
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


@dataclass
class _RowResult:
    """What a row thread reports at its end (tokens went out as they came)."""

    row: int
    finish_reason: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None


# ---- the backend ----


class OpenAIBackend:
    """Streams chat completions from an OpenAI-compatible server. See the module docstring."""

    def __init__(self, base_url: str, model: str | None = None, api_key_env: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, *,
                 progress: ProgressCallback | None = None) -> None:
        self.endpoint = parse_base_url(base_url)
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        headers = {"Accept": "application/json"}
        key = read_api_key(api_key_env)
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        auth = httpx.BasicAuth(*self.endpoint.basic_auth) if (
            self.endpoint.basic_auth and key is None) else None
        self._client = httpx.Client(
            headers=headers, auth=auth, follow_redirects=False, trust_env=False,
            timeout=httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s)),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=8))
        del key
        self.models: list[dict[str, Any]] = []
        try:
            if progress:
                progress(Progress(f"Connecting to {self.endpoint.display}", 0.0, 1.0))
            self.models = self._list_models(required=model is None)
            name = model or self._first_model_id()
            entry = next((m for m in self.models if m.get("id") == name), {})
            context = entry.get("max_model_len") if isinstance(entry, dict) else None
            self.info = ModelInfo(
                name=name, backend="openai", device="server", dtype="unknown",
                context_limit=context if isinstance(context, int) and context > 0 else 0,
                checkpoint=name, has_token_ids=False, has_entropy=False,
                url=self.endpoint.display)
            if progress:
                progress(Progress(f"Connecting to {self.endpoint.display}", 1.0, 1.0))
        except BaseException:
            self._client.close()
            raise

    # -- Backend protocol --

    def count_tokens(self, messages: tuple[Message, ...]) -> int:
        """An estimate (4 characters a token, 4 tokens of framing a message): the OpenAI API
        has no tokenizer endpoint; the server's exact count arrives in ``RowDone.usage``."""
        return sum(math.ceil(len(m.content) / 4) + 4 for m in messages)

    def reset(self) -> None:
        """Nothing to drop: the server keeps no conversation for us."""

    def close(self) -> None:
        self._client.close()

    def generate(self, request: GenerationRequest, cancel: threading.Event) -> Iterator[Event]:
        n = len(request.settings)
        prompt_est = self.count_tokens(request.messages + (
            (Message("assistant", request.prefix.text),) if request.prefix else ()))
        yield Started(rows=n, prompt_tokens=prompt_est, cached_tokens=0,
                      context_limit=self.info.context_limit)
        t0 = time.perf_counter()
        events: queue.Queue[TokenBatch | _RowResult] = queue.Queue()
        controls = [_RowControl() for _ in range(n)]
        mappers = [ChunkMapper(request.top_logprobs) for _ in range(n)]
        first_at: list[float | None] = [None] * n
        last_at: list[float] = [0.0] * n
        counts = [0] * n
        open_rows = set(range(n))
        failures: dict[int, str] = {}
        threads = []
        for row, params in enumerate(request.settings):
            body = chat_body(self.info.name, request.messages, params, request.top_logprobs,
                             request.prefix)
            t = threading.Thread(target=self._run_row, name=f"chatui-openai-row{row}",
                                 args=(row, body, mappers[row], controls[row], events),
                                 daemon=True)
            threads.append(t)
        for t in threads:
            t.start()
        try:
            while open_rows:
                if cancel.is_set():
                    for row in sorted(open_rows):
                        controls[row].abort()
                        yield RowDone(row, "cancelled", _sent_text(mappers[row], counts[row]),
                                      self._usage(prompt_est, None, counts[row], first_at[row],
                                                  last_at[row], t0))
                    open_rows.clear()
                    break
                try:
                    item = events.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    continue
                if isinstance(item, TokenBatch):
                    if item.row not in open_rows:
                        continue
                    now = time.perf_counter()
                    if first_at[item.row] is None:
                        first_at[item.row] = now - t0
                    last_at[item.row] = now - t0
                    counts[item.row] += len(item.tokens)
                    yield item
                    continue
                row = item.row
                if row not in open_rows:
                    continue
                open_rows.discard(row)
                if item.error is not None:
                    failures[row] = item.error
                    continue
                yield RowDone(row, item.finish_reason or "stop",  # type: ignore[arg-type]
                              _sent_text(mappers[row], counts[row]),
                              self._usage(prompt_est, item.usage, counts[row], first_at[row],
                                          last_at[row], t0))
        finally:
            for c in controls:  # also when the consumer stops iterating early
                c.abort()
        if failures:
            partial = tuple(_sent_text(mappers[r], counts[r]) for r in range(n))
            yield Failed(_combine(failures, n), partial)

    # -- internals --

    def _usage(self, prompt_est: int, usage: dict[str, Any] | None, count: int,
               first: float | None, last: float, t0: float) -> Usage:
        prompt, completion, cached = prompt_est, count, 0
        if usage:
            if isinstance(usage.get("prompt_tokens"), int):
                prompt = usage["prompt_tokens"]
            if isinstance(usage.get("completion_tokens"), int):
                completion = usage["completion_tokens"]
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                cached = details["cached_tokens"]
        ttft = first if first is not None else time.perf_counter() - t0
        tps = (count - 1) / (last - first) if first is not None and count > 1 and last > first \
            else 0.0
        return Usage(prompt, completion, cached, ttft, tps)

    def _run_row(self, row: int, body: dict[str, Any], mapper: ChunkMapper,
                 control: _RowControl, out: queue.Queue[TokenBatch | _RowResult]) -> None:
        """One streaming request; posts TokenBatch per chunk, then one _RowResult."""
        result = _RowResult(row)
        try:
            result.finish_reason, result.usage = self._stream(row, body, mapper, control, out)
        except _RowAborted:
            return
        except Exception as exc:  # noqa: BLE001 - every failure becomes one sentence
            if control.aborted.is_set():
                return
            result.error = self._describe(exc, mapper)
            log.info("row %d failed: %s", row, result.error)
        finally:
            control.detach()
        out.put(result)

    def _stream(self, row: int, body: dict[str, Any], mapper: ChunkMapper,
                control: _RowControl, out: queue.Queue[TokenBatch | _RowResult]
                ) -> tuple[str, dict[str, Any] | None]:
        url = self.endpoint.api_root + "/chat/completions"
        finish: str | None = None
        usage: dict[str, Any] | None = None
        # A fresh connection per reply: a chat completion is never retried, so it must not
        # meet a keep-alive connection the server has dropped meanwhile (a spurious reset).
        with self._client.stream("POST", url, json=body, headers={
                "Accept": "text/event-stream", "Connection": "close"}) as response:
            if not control.attach(response):
                raise _RowAborted
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
                    raise _RowAborted
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
                raise _RowAborted
            if finish is None:
                raise _Cut(done)
        return finish, usage

    def _describe(self, exc: Exception, mapper: ChunkMapper) -> str:
        """One sentence for a failed row."""
        where = self.endpoint.display
        n = mapper.index
        kept = f" after {n} token{'s' if n != 1 else ''}; the partial reply is kept" if n else ""
        tail = f"; the partial reply ({n} token{'s' if n != 1 else ''}) is kept" if n else ""
        if isinstance(exc, _HTTPStatus):
            return self._describe_status(exc.status, server_words(exc.body), "chat completion")
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
        return self._describe_transport(exc)

    def _describe_transport(self, exc: Exception) -> str:
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

    def _describe_status(self, status: int, words: str, what: str) -> str:
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
            if self.info.name not in names:
                listed = f"; it lists: {', '.join(names[:8])}" if names else ""
                return (f"The server at {where} has no model {self.info.name!r} "
                        f"(HTTP 404{said}){listed}; pick one with --model.")
            return f"The server at {where} has no chat completions endpoint (HTTP 404{said})."
        if 400 <= status < 500:
            return f"The server at {where} rejected the {what} (HTTP {status}{said})."
        return f"The server at {where} failed (HTTP {status}{said}); try again or check its log."

    def _list_models(self, *, required: bool) -> list[dict[str, Any]]:
        """``GET /v1/models``, retried with backoff on connection errors, timeouts and 5xx.

        When ``required`` is False (a model name was given) a 404 gives an empty list.
        """
        url = self.endpoint.api_root + "/models"
        pause = MODELS_BACKOFF_S
        for attempt in range(1, MODELS_ATTEMPTS + 1):
            last = attempt == MODELS_ATTEMPTS
            try:
                response = self._client.get(url)
            except httpx.TransportError as exc:
                if last or not isinstance(exc, (httpx.ConnectError, httpx.TimeoutException,
                                                httpx.RemoteProtocolError, httpx.ReadError)):
                    raise OpenAIBackendError(self._describe_transport(exc)) from None
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
                    msg = self._describe_status(response.status_code, words, "model list request")
                    if response.status_code == 404:
                        msg = msg[:-1] + "; is the base URL right, or pass --model NAME."
                    raise OpenAIBackendError(msg)
            time.sleep(pause)
            pause *= 2
        raise AssertionError("unreachable")

    def _first_model_id(self) -> str:
        for m in self.models:
            if isinstance(m.get("id"), str) and m["id"]:
                return m["id"]
        raise OpenAIBackendError(
            f"The server at {self.endpoint.display} lists no models (GET /v1/models); "
            "pass --model NAME.")


class _RowAborted(Exception):
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


def _sent_text(mapper: ChunkMapper, count: int) -> str:
    """The text of the tokens the generator yielded (a row thread may be a little ahead)."""
    return "".join(mapper.parts[:count])


def _combine(failures: dict[int, str], rows: int) -> str:
    messages = list(dict.fromkeys(failures.values()))
    if rows == 1 or (len(messages) == 1 and len(failures) == rows):
        return messages[0]
    return " ".join(f"Column {r + 1}: {m}" for r, m in sorted(failures.items()))


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


def make_openai_factory(base_url: str, model: str | None, api_key_env: str | None,
                        timeout_s: float = DEFAULT_TIMEOUT_S) -> BackendFactory:
    """A factory for the worker: builds an :class:`OpenAIBackend` on the worker thread.

    Args:
        base_url: the server, e.g. ``http://127.0.0.1:8000`` or ``http://host:8000/v1``.
        model: the model name to ask for; None takes the first one ``GET /v1/models`` lists.
        api_key_env: the environment variable that holds the API key, or None for no key.
        timeout_s: longest wait for the server's next bytes (the first token included).

    The URL is checked at once (a bad URL raises :class:`OpenAIBackendError` here); the
    server is contacted when the worker calls the factory.
    """
    parse_base_url(base_url)

    def factory(progress: ProgressCallback) -> OpenAIBackend:
        return OpenAIBackend(base_url, model, api_key_env, timeout_s, progress=progress)

    return factory


__all__ = ["OpenAIBackend", "OpenAIBackendError", "make_openai_factory", "parse_base_url",
           "redact_url", "chat_body", "sampling_fields", "iter_sse_data", "ChunkMapper",
           "server_words", "Endpoint"]
