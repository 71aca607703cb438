"""The transcript document: its format name and version, its limits, and the writer
(:func:`to_json_dict`, conversation -> plain JSON types).

The reader that checks a document on the way in is :mod:`.reader`; the files are :mod:`.store`.
"""

from __future__ import annotations

import re
import time
from typing import Any

from inference.types import Token, Usage

from ..conversation import Conversation, Entry, ModelRef, Reply, index_of, walk

FORMAT_VERSION = 3
"""Version written. 1: settings stored flat in each reply. 2: settings in ``reply.settings``.
3: the conversation is a tree (issue 18): every message has a ``node`` id, ``messages`` is the
chosen path and ``branches`` every other message, each naming its ``parent`` node."""
FORMAT_NAME = "chatui-transcript"

# Plausibility bounds for loaded values ("absurd values" are refused, not clamped).
_LOGPROB_EPS = 1e-3          # float16/32 log_softmax may round a certain token a hair above 0
_ENTROPY_EPS = 1e-3
_MAX_TIME = 1e11             # seconds since 1970: year ~5100
_MAX_TOKEN_ID = 2**31 - 1
_MAX_TOP = 100
_MAX_INDEX = 100_000_000
_MIN_LOGPROB = -1e9
_MAX_ENTROPY = 1e6
_HUGE = 1e300
_NUM = (int, float)
_MAX_REPLIES = 256
_MAX_COUNT = 2**40
_MAX_SECONDS = 1e7
_MAX_RATE = 1e9
_MAX_SHORT = 4096            # model name, dtype, backend, URL, hash...
_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
_FINISH = ("stop", "length", "cancelled", "error")


class TranscriptError(Exception):
    """A transcript could not be saved, loaded, listed or deleted.

    ``str()`` is one sentence naming the file and the problem, fit to show to the user.
    """


def _finite(x: float) -> bool:
    # Not math.isfinite: that raises OverflowError on an enormous int.
    return -_HUGE <= x <= _HUGE


def _finite_or_none(x: float | None) -> float | None:
    return x if x is None or _finite(x) else None


def _token_json(t: Token) -> dict[str, Any]:
    # Non-finite statistics (a -inf logprob from a masked logit) are written as unknown
    # rather than making the whole conversation unsavable.
    d: dict[str, Any] = {
        "index": t.index, "id": t.id, "text": t.text,
        "logprob": _finite_or_none(t.logprob), "entropy": _finite_or_none(t.entropy),
    }
    if t.top:
        d["top"] = [[a.id, a.text, a.logprob] for a in t.top if _finite(a.logprob)]
    if t.special:
        d["special"] = True
    if t.glyph_start is not None:
        d["glyph_start"] = t.glyph_start
    if t.raw:
        d["raw"] = t.raw
    return d


def _usage_json(u: Usage | None) -> dict[str, Any] | None:
    if u is None:
        return None
    return {
        "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "cached_tokens": u.cached_tokens,
        "ttft_s": u.ttft_s if _finite(u.ttft_s) else 0.0,
        "decode_tokens_per_s": u.decode_tokens_per_s if _finite(u.decode_tokens_per_s) else 0.0,
    }


def _reply_json(r: Reply) -> dict[str, Any]:
    return {
        "settings": r.settings.to_dict(), "text": r.text, "finish_reason": r.finish_reason,
        "error": r.error, "usage": _usage_json(r.usage),
        "tokens": [_token_json(t) for t in r.tokens],
    }


def entry_json(e: Entry, sibling: int = 0) -> dict[str, Any]:
    """One message; ``sibling`` is its place among the alternatives of its parent's
    children (written when not 0)."""
    d: dict[str, Any] = {"role": e.role, "text": e.text, "time": e.time, "node": e.node}
    if sibling:
        d["sibling"] = sibling
    if e.role == "assistant":
        d["chosen"] = e.chosen
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
            "dtype": m.dtype, "backend": m.backend, "url": strip_credentials(m.url)}


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
    return doc
