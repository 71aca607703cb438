"""The OpenAI chat completions protocol, without any I/O: base URLs and API keys, request
bodies from chatui's settings, server-sent events, and streamed chunks mapped to chatui's
tokens (``ChunkMapper``). Pure functions and small classes, each testable on strings."""

from __future__ import annotations

import codecs
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit, urlunsplit

from ..settings import SamplingParams
from ..types import Alternative, AssistantPrefix, Message, Token


class OpenAIBackendError(RuntimeError):
    """The server cannot be used; ``user_message`` is the one sentence to show."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.user_message = message


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
        # the reasoning of a reasoning model, split by the server's own parser:
        # ``reasoning_content`` (vLLM, SGLang, llama.cpp's server), ``reasoning`` (newer vLLM)
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError("delta.reasoning_content is not a string")
        lp = choice.get("logprobs")
        entries = lp.get("content") if isinstance(lp, dict) else None
        out: list[Token] = []
        if reasoning:
            if entries and not content:  # the chunk's logprobs are the reasoning's tokens
                return self._from_entries(entries, reasoning, "reasoning")
            out = self._emit([(reasoning, None, (), None, reasoning)], "reasoning")
        if entries:
            return out + self._from_entries(entries, content)
        if content:
            return out + self._emit([(content, None, (), None, content)])
        return out

    def _from_entries(self, entries: list[Any], content: str | None,
                      channel: str = "answer") -> list[Token]:
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
        return self._emit(rows, channel)

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

    def _emit(self, rows: list[tuple[str, float | None, tuple[Alternative, ...], int | None, str]],
              channel: str = "answer") -> list[Token]:
        out = []
        for text, logprob, top, glyph_start, raw in rows:
            out.append(Token(index=self.index, id=None, text=text, logprob=logprob, entropy=None,
                             top=top, glyph_start=glyph_start, raw=raw,
                             channel=channel))  # type: ignore[arg-type]
            self.parts.append(text if channel == "answer" else "")  # parts: the answer's
            self.index += 1
        return out


def _logprob(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v):
        return max(float(v), -1e30)  # -inf (some servers) stays very unlikely but finite
    return None


def map_finish_reason(reason: str) -> str:
    """OpenAI finish reasons -> chatui's (anything else the server ends with is a stop)."""
    return "length" if reason == "length" else "stop"
