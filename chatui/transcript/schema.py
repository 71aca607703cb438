"""The transcript document: its format name and version, its limits, and the writer
(:func:`to_json_dict`, conversation -> plain JSON types).

The reader that checks a document on the way in is :mod:`.reader`; the files are :mod:`.store`.
"""

from __future__ import annotations

import time
from typing import Any

from inference.types import Usage

from ..conversation import Conversation, Entry, ModelRef, Reply, index_of, walk
from ..token_records import TokenRecords
from .token_columns import encode as encode_token_columns
from .limits import (_ENTROPY_EPS, _FINISH, _HUGE, _ID_RE, _LOGPROB_EPS,  # noqa: F401
                     _MAX_COUNT, _MAX_ENTROPY, _MAX_INDEX, _MAX_RATE, _MAX_REPLIES,
                     _MAX_SECONDS, _MAX_SHORT, _MAX_TIME, _MAX_TOKEN_ID, _MAX_TOP, _MIN_LOGPROB,
                     _NUM, _finite)

FORMAT_VERSION = 3
"""Version written. 1: settings stored flat in each reply. 2: settings in ``reply.settings``.
3: the conversation is a tree (issue 18): every message has a ``node`` id, ``messages`` is the
chosen path and ``branches`` every other message, each naming its ``parent`` node."""
FORMAT_NAME = "chatui-transcript"


class TranscriptError(Exception):
    """A transcript could not be saved, loaded, listed or deleted.

    ``str()`` is one sentence naming the file and the problem, fit to show to the user.
    """


def _usage_json(u: Usage | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {
        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "cached_tokens": u.cached_tokens,
        "ttft_s": u.ttft_s if _finite(u.ttft_s) else 0.0,
        "decode_tokens_per_s": u.decode_tokens_per_s if _finite(u.decode_tokens_per_s) else 0.0,
        "context_limit": u.context_limit,
    }


def _reply_json(r: Reply) -> dict[str, Any]:
    d = {
        "settings": r.settings.to_dict(), "text": r.text, "finish_reason": r.finish_reason,
        "error": r.error, "usage": _usage_json(r.usage),
        "tokens": encode_token_columns(
            r.tokens if isinstance(r.tokens, TokenRecords) else TokenRecords(r.tokens)),
    }
    if r.reasoning:  # optional keys (no version bump): written only for a reasoning reply
        d["reasoning"] = r.reasoning
        if r.reasoning_s is not None and _finite(r.reasoning_s):
            d["reasoning_s"] = r.reasoning_s
    return d


def entry_json(e: Entry, sibling: int = 0) -> dict[str, Any]:
    """One message; ``sibling`` is its place among the alternatives of its parent's
    children (written when not 0)."""
    d: dict[str, Any] = {"role": e.role, "text": e.text, "time": e.time, "node": e.node}
    if sibling:
        d["sibling"] = sibling
    if e.role == "assistant":
        d["chosen"] = e.chosen
        if e.fan_out:
            d["fan_out"] = True
        d["replies"] = [_reply_json(r) for r in e.replies]
    return d


def path_positions(conv: Conversation) -> list[int]:
    """Each path message's place among its siblings."""
    path = conv.entries
    return [conv.top if i == 0 else path[i - 1].active for i in range(len(path))]


def path_json(conv: Conversation, start: int = 0) -> list[dict[str, Any]]:
    """The chosen path's messages from ``start`` on."""
    path = conv.entries
    pos = path_positions(conv)
    return [entry_json(path[i], pos[i]) for i in range(start, len(path))]


def branches_json(conv: Conversation) -> list[dict[str, Any]]:
    """Every message off the chosen path, parents before children, each with its
    ``parent`` node id (null: a first message)."""
    on_path = {id(e) for e in conv.entries}
    out: list[dict[str, Any]] = []
    for parent, e in walk(conv.tops):
        if id(e) in on_path:
            continue
        kids = conv.tops if parent is None else parent.children
        d = entry_json(e, index_of(kids, e))
        d["parent"] = None if parent is None else parent.node
        if e.active >= 0:
            d["next"] = e.active  # the branch it goes on with, when it is chosen again
        out.append(d)
    return out


def strip_credentials(url: str) -> str:
    """``url`` without a user name, password, or secret-looking query parameters."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = parts.query
    if query:
        secret = ("key", "token", "secret", "password", "auth", "signature")
        kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True)
                if not any(s in k.lower() for s in secret)]
        if len(kept) != len(parse_qsl(query, keep_blank_values=True)):
            query = urlencode(kept)
    if netloc == parts.netloc and query == parts.query:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def model_json(m: ModelRef) -> dict[str, Any]:
    return {"name": m.name, "checkpoint": m.checkpoint, "weights_hash": m.weights_hash,
            "dtype": m.dtype, "quantization": m.quantization, "backend": m.backend,
            "url": strip_credentials(m.url)}


def parent_json(conv: Conversation) -> dict[str, Any] | None:
    return {"id": conv.parent, "messages": conv.branched_at} if conv.parent else None


def to_json_dict(conv: Conversation) -> dict[str, Any]:
    """The transcript document for ``conv`` (plain JSON types; see the README for the schema).

    Credentials are stripped from the model URL; non-finite logprobs and entropies are
    written as null (unknown) and non-finite timings as 0.
    """
    doc: dict[str, Any] = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "id": conv.id,
        "created": conv.created,
        "saved": time.time(),
        "title": conv.title,
        "model": model_json(conv.model),
        "system_prompt": conv.system_prompt,
        "messages": path_json(conv),
    }
    branches = branches_json(conv)
    if branches:
        doc["branches"] = branches
    if conv.parent:
        doc["parent"] = parent_json(conv)
    if conv.mode != "chat":  # optional (issue 17): raw mode's notebook
        doc["mode"] = conv.mode
    return doc
