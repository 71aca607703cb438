"""Transcripts: one versioned JSON document per conversation, saved atomically, loaded back
exactly, and checked field by field on the way in.

Writing never leaves a half-written file: the document goes to a temporary file in the same
directory, is flushed and fsynced, then renamed over the old one (and the directory is
fsynced). Reading never crashes: any problem becomes a :class:`TranscriptError` whose text is
one sentence naming the file and what is wrong with it.

The format is described in the README ("Transcripts"); :data:`FORMAT_VERSION` is the version
written, and older versions are migrated on load (:func:`_migrate`).
"""

from __future__ import annotations

import datetime as _dt
import errno
import glob
import json
import os
import re
import stat
import sys
import tempfile
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from inference.settings import FIELD_NAMES, SamplingParams, SettingsError
from inference.types import Alternative, Token, Usage

from .conversation import Conversation, Entry, ModelRef, Reply
from .export import conversation_title, export_markdown, export_messages, model_label

__all__ = [
    "FORMAT_VERSION", "MAX_BYTES", "TranscriptError", "TranscriptSummary", "atomic_write",
    "autosave",
    "autosave_path", "data_dir", "delete_transcript", "export_markdown", "export_messages",
    "export_to_file", "from_json_dict", "list_transcripts", "load_transcript",
    "save_transcript", "to_json_dict",
]

FORMAT_VERSION = 2
"""Version written. 1: settings stored flat in each reply. 2: settings in ``reply.settings``."""
FORMAT_NAME = "chatui-transcript"
MAX_BYTES = 64 * 1024 * 1024
"""Transcripts larger than this are refused on load (and on save)."""

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


# ---------------------------------------------------------------------------------------
# Conversation -> JSON document


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


def _entry_json(e: Entry) -> dict[str, Any]:
    d: dict[str, Any] = {"role": e.role, "text": e.text, "time": e.time}
    if e.role == "assistant":
        d["chosen"] = e.chosen
        d["replies"] = [_reply_json(r) for r in e.replies]
    return d


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


def to_json_dict(conv: Conversation) -> dict[str, Any]:
    """The transcript document for ``conv`` (plain JSON types; see the README for the schema).

    Credentials are stripped from the model URL; non-finite logprobs and entropies are
    written as null (unknown) and non-finite timings as 0.
    """
    m = conv.model
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "id": conv.id,
        "created": conv.created,
        "saved": time.time(),
        "title": conv.title,
        "model": {"name": m.name, "checkpoint": m.checkpoint, "weights_hash": m.weights_hash,
                  "dtype": m.dtype, "backend": m.backend, "url": strip_credentials(m.url)},
        "system_prompt": conv.system_prompt,
        "messages": [_entry_json(e) for e in conv.entries],
    }


# ---------------------------------------------------------------------------------------
# JSON document -> Conversation (validating everything)


class _Bad(Exception):
    """Internal: a problem at a location inside the document."""


def _show(v: Any) -> str:
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return "a string" if len(v) > 30 else repr(v)
    r = repr(v)
    return r if len(r) <= 30 else r[:27] + "..."


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Obj:
    """Typed reads from one JSON object, with its location for error messages."""

    __slots__ = ("d", "where")

    def __init__(self, v: Any, where: str) -> None:
        if not isinstance(v, dict):
            raise _Bad(f"{where} must be an object, not {_show(v)}")
        self.d = v
        self.where = where

    def at(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def get(self, key: str, default: Any = ...) -> Any:
        if key in self.d:
            return self.d[key]
        if default is ...:
            raise _Bad(f"{self.at(key)} is missing")
        return default

    def str(self, key: str, default: Any = ..., *, max_len: int | None = None) -> str:
        v = self.get(key, default)
        if not isinstance(v, str):
            raise _Bad(f"{self.at(key)} must be a string, not {_show(v)}")
        if max_len is not None and len(v) > max_len:
            raise _Bad(f"{self.at(key)} is {len(v)} characters long, more than {max_len}")
        return v

    def int(self, key: str, lo: int, hi: int, default: Any = ..., *,
            nullable: bool = False) -> int | None:
        v = self.get(key, default)
        if v is None and nullable:
            return None
        if not _is_int(v):
            raise _Bad(f"{self.at(key)} must be a whole number, not {_show(v)}")
        if not lo <= v <= hi:
            raise _Bad(f"{self.at(key)} must be between {lo} and {hi}, not {_show(v)}")
        return v

    def num(self, key: str, lo: float, hi: float, default: Any = ..., *,
            nullable: bool = False, what: str = "") -> float | None:
        v = self.get(key, default)
        if v is None and nullable:
            return None
        if not _is_num(v):
            raise _Bad(f"{self.at(key)} must be a number, not {_show(v)}")
        if not lo <= v <= hi:  # finite bounds: also refuses NaN, inf and huge integers
            raise _Bad(f"{self.at(key)} must be {what or f'between {lo:g} and {hi:g}'}, "
                       f"not {_show(v)}")
        return v

    def list(self, key: str, default: Any = ...) -> list[Any]:
        v = self.get(key, default)
        if not isinstance(v, list):
            raise _Bad(f"{self.at(key)} must be a list, not {_show(v)}")
        return v


def _token(v: Any, where: str) -> Token:
    # Fast path for the common, valid token (transcripts hold many thousands); anything
    # unusual goes to _token_checked, which finds and words the problem.
    if type(v) is dict:
        index = v.get("index")
        tid = v.get("id", ...)
        text = v.get("text")
        lp = v.get("logprob", ...)
        ent = v.get("entropy", ...)
        top = v.get("top", ())
        if (type(index) is int and 0 <= index <= _MAX_INDEX
                and (tid is None or (type(tid) is int and 0 <= tid <= _MAX_TOKEN_ID))
                and type(text) is str
                and (lp is None or (type(lp) in _NUM and _MIN_LOGPROB <= lp <= _LOGPROB_EPS))
                and (ent is None or (type(ent) in _NUM and -_ENTROPY_EPS <= ent <= _MAX_ENTROPY))
                and type(top) in (list, tuple) and len(top) <= _MAX_TOP
                and type(v.get("special", False)) is bool
                and v.get("glyph_start") is None and type(v.get("raw", "")) is str):
            alts = []
            for a in top:
                if not (type(a) is list and len(a) == 3):
                    break
                aid, atext, alp = a
                if not ((aid is None or (type(aid) is int and 0 <= aid <= _MAX_TOKEN_ID))
                        and type(atext) is str
                        and type(alp) in _NUM and _MIN_LOGPROB <= alp <= _LOGPROB_EPS):
                    break
                alts.append(Alternative(aid, atext, alp))
            else:
                return Token(index, tid, text, lp, ent, tuple(alts), v.get("special", False),
                             None, v.get("raw", ""))
    return _token_checked(v, where)


def _token_checked(v: Any, where: str) -> Token:
    o = _Obj(v, where)
    index = o.int("index", 0, _MAX_INDEX)
    assert index is not None
    top: list[Alternative] = []
    for j, a in enumerate(o.list("top", [])):
        aw = f"{o.at('top')}[{j}]"
        if not (isinstance(a, list) and len(a) == 3):
            raise _Bad(f"{aw} must be a list [id, text, logprob], not {_show(a)}")
        aid, atext, alp = a
        if aid is not None and not (_is_int(aid) and 0 <= aid <= _MAX_TOKEN_ID):
            raise _Bad(f"{aw} has an invalid token id {_show(aid)}")
        if not isinstance(atext, str):
            raise _Bad(f"{aw} has a text that is {_show(atext)}, not a string")
        if not (_is_num(alp) and _MIN_LOGPROB <= alp <= _LOGPROB_EPS):
            raise _Bad(f"{aw} has logprob {_show(alp)}; a log-probability is a number <= 0 "
                       f"(and not absurdly small)")
        top.append(Alternative(aid, atext, alp))
    if len(top) > _MAX_TOP:
        raise _Bad(f"{o.at('top')} has {len(top)} alternatives, more than {_MAX_TOP}")
    special = o.get("special", False)
    if not isinstance(special, bool):
        raise _Bad(f"{o.at('special')} must be true or false, not {_show(special)}")
    glyph_start = o.int("glyph_start", 0, index, None, nullable=True)
    return Token(
        index=index,
        id=o.int("id", 0, _MAX_TOKEN_ID, nullable=True),
        text=o.str("text"),
        logprob=o.num("logprob", _MIN_LOGPROB, _LOGPROB_EPS, nullable=True,
                      what=f"a log-probability between {_MIN_LOGPROB:g} and 0"),
        entropy=o.num("entropy", -_ENTROPY_EPS, _MAX_ENTROPY, nullable=True,
                      what=f"an entropy in nats between 0 and {_MAX_ENTROPY:g}"),
        top=tuple(top), special=special, glyph_start=glyph_start, raw=o.str("raw", ""),
    )


def _settings(v: Any, where: str) -> SamplingParams:
    o = _Obj(v, where)
    for k, x in o.d.items():
        if k not in FIELD_NAMES:
            raise _Bad(f"{where} has an unknown setting {_show(k)}")
        if k == "stop":
            if not (isinstance(x, list) and all(isinstance(s, str) for s in x)):
                raise _Bad(f"{o.at(k)} must be a list of strings, not {_show(x)}")
        elif k == "seed":
            if x is not None and not _is_int(x):
                raise _Bad(f"{o.at(k)} must be a whole number or null, not {_show(x)}")
        elif k in ("top_k", "max_new_tokens"):
            if not _is_int(x):
                raise _Bad(f"{o.at(k)} must be a whole number, not {_show(x)}")
        elif not _is_num(x):
            raise _Bad(f"{o.at(k)} must be a number, not {_show(x)}")
        elif not _finite(x):
            raise _Bad(f"{o.at(k)} is an absurd value {_show(x)}")
    try:
        return SamplingParams.from_dict(o.d)
    except SettingsError as e:
        raise _Bad(f"{where} is invalid: {e}") from None


def _usage(v: Any, where: str) -> Usage | None:
    if v is None:
        return None
    o = _Obj(v, where)
    return Usage(
        prompt_tokens=o.int("prompt_tokens", 0, _MAX_COUNT),  # type: ignore[arg-type]
        completion_tokens=o.int("completion_tokens", 0, _MAX_COUNT),  # type: ignore[arg-type]
        cached_tokens=o.int("cached_tokens", 0, _MAX_COUNT),  # type: ignore[arg-type]
        ttft_s=o.num("ttft_s", 0, _MAX_SECONDS),  # type: ignore[arg-type]
        decode_tokens_per_s=o.num("decode_tokens_per_s", 0, _MAX_RATE),  # type: ignore[arg-type]
    )


def _reply(v: Any, where: str) -> Reply:
    o = _Obj(v, where)
    finish = o.get("finish_reason")
    if finish is not None and finish not in _FINISH:
        raise _Bad(f"{o.at('finish_reason')} must be one of {', '.join(_FINISH)} or null, "
                   f"not {_show(finish)}")
    tokens = o.list("tokens")
    tw = o.at("tokens")
    return Reply(
        settings=_settings(o.get("settings"), o.at("settings")),
        text=o.str("text"),
        tokens=[_token(t, f"{tw}[{i}]") for i, t in enumerate(tokens)],
        finish_reason=finish,
        usage=_usage(o.get("usage", None), o.at("usage")),
        error=o.str("error", ""),
    )


def _entry(v: Any, where: str) -> Entry:
    o = _Obj(v, where)
    role = o.get("role")
    if role not in ("user", "assistant"):
        raise _Bad(f"{o.at('role')} must be \"user\" or \"assistant\", not {_show(role)}")
    text = o.str("text")
    t = o.num("time", 0, _MAX_TIME, what="a time in seconds since 1970")
    if role == "user":
        if o.d.get("replies"):
            raise _Bad(f"{where} is a user message but has replies")
        return Entry("user", text, t)  # type: ignore[arg-type]
    raw = o.list("replies")
    if len(raw) > _MAX_REPLIES:
        raise _Bad(f"{o.at('replies')} has {len(raw)} replies, more than {_MAX_REPLIES}")
    rw = o.at("replies")
    replies = [_reply(r, f"{rw}[{i}]") for i, r in enumerate(raw)]
    chosen = o.int("chosen", 0, max(len(replies) - 1, 0))
    return Entry("assistant", text, t, replies, chosen)  # type: ignore[arg-type]


def _model(v: Any) -> ModelRef:
    o = _Obj(v, "model")
    return ModelRef(
        name=o.str("name", "", max_len=_MAX_SHORT),
        checkpoint=o.str("checkpoint", "", max_len=_MAX_SHORT),
        weights_hash=o.str("weights_hash", "", max_len=_MAX_SHORT),
        dtype=o.str("dtype", "", max_len=_MAX_SHORT),
        backend=o.str("backend", "local", max_len=_MAX_SHORT),
        url=strip_credentials(o.str("url", "", max_len=_MAX_SHORT)),
    )


def _migrate_1_to_2(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 1 stored each reply's sampling settings flat in the reply object
    (``{"temperature": 0.7, "seed": 1, "text": ...}``); version 2 nests them under
    ``"settings"``."""
    msgs = doc.get("messages")
    if not isinstance(msgs, list):
        return doc  # validation reports it
    new_msgs = []
    for m in msgs:
        if isinstance(m, dict) and isinstance(m.get("replies"), list):
            replies = []
            for r in m["replies"]:
                if isinstance(r, dict) and "settings" not in r:
                    flat = {k: v for k, v in r.items() if k in FIELD_NAMES}
                    r = {k: v for k, v in r.items() if k not in FIELD_NAMES}
                    r["settings"] = flat
                replies.append(r)
            m = {**m, "replies": replies}
        new_msgs.append(m)
    return {**doc, "messages": new_msgs, "version": 2}


_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _migrate_1_to_2}


def _migrate(doc: dict[str, Any], version: int) -> dict[str, Any]:
    """Bring a document of an older ``version`` up to :data:`FORMAT_VERSION`, step by step."""
    while version < FORMAT_VERSION:
        doc = _MIGRATIONS[version](doc)
        version += 1
    return doc


def _parse(data: object) -> Conversation:
    """The conversation in ``data``; raises :class:`_Bad` with the problem."""
    if not isinstance(data, dict):
        raise _Bad(f"it is not a chatui transcript (expected a JSON object, found {_show(data)})")
    if "version" not in data or data.get("format", FORMAT_NAME) != FORMAT_NAME:
        raise _Bad("it is not a chatui transcript (it has no \"format\": "
                   "\"chatui-transcript\" and \"version\")")
    version = data["version"]
    if not _is_int(version) or version < 1:
        raise _Bad(f"its format version {_show(version)} is not valid")
    if version > FORMAT_VERSION:
        raise _Bad(f"it was written by a newer chatui (transcript format {version}; this "
                   f"version reads up to {FORMAT_VERSION}); update chatui to open it")
    doc = _migrate(data, version)
    o = _Obj(doc, "")
    conv_id = o.str("id")
    if not _ID_RE.match(conv_id):
        raise _Bad(f"id must be 1 to 64 letters, digits, '-' or '_', not {_show(conv_id)}")
    created = o.num("created", 0, _MAX_TIME, what="a time in seconds since 1970")
    if "saved" in o.d:
        o.num("saved", 0, _MAX_TIME, what="a time in seconds since 1970")
    raw_msgs = o.list("messages")
    return Conversation(
        id=conv_id,
        created=created,  # type: ignore[arg-type]
        title=o.str("title", ""),
        system_prompt=o.str("system_prompt", ""),
        entries=[_entry(m, f"messages[{i}]") for i, m in enumerate(raw_msgs)],
        model=_model(o.get("model", {})),
    )


def from_json_dict(data: object, *, source: str = "<data>") -> Conversation:
    """The conversation in a transcript document, checked field by field.

    Older format versions are migrated first. Unknown keys are ignored.

    Raises:
        TranscriptError: the document is not a transcript, is from a newer chatui, or has a
            missing field, a value of the wrong type or an absurd value (the message names
            ``source`` and the field).
    """
    try:
        return _parse(data)
    except _Bad as e:
        raise TranscriptError(f"Could not load {source}: {e}.") from None
    except RecursionError:
        raise TranscriptError(f"Could not load {source}: it is nested too deeply.") from None


# ---------------------------------------------------------------------------------------
# Files


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _fsync_dir(directory: Path) -> None:
    if sys.platform == "win32":
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is still atomic
    finally:
        os.close(fd)


def _os_problem(e: OSError) -> str:
    if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return "the disk is full"
    if e.errno == errno.EFBIG:
        return "the file would be larger than this system allows"
    if e.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if e.errno == errno.EROFS:
        return "the file system is read-only"
    if e.errno == errno.EISDIR:
        return "it is a directory"
    if e.errno == errno.ENOENT:
        return "no such file or directory"
    return e.strerror or str(e)


def atomic_write(path: Path, data: bytes, *, verb: str = "save") -> None:
    """Replace ``path`` with ``data`` so that it holds either the old or the new bytes,
    never a mix, whatever happens (crash, kill, full disk).

    A temporary file in the same directory is written, flushed, fsynced and renamed over
    ``path``; then the directory is fsynced. An existing file keeps its permissions; a new
    one is private to the user (0600).

    Raises:
        TranscriptError: "Could not save PATH: the disk is full; ..." and the like.
    """
    path = Path(path)
    existed = path.exists()
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:100]}.", suffix=".tmp", dir=path.parent)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if existed:
            try:
                os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
            except OSError:
                pass
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        kept = "the previous file is unchanged" if existed else "nothing was written"
        raise TranscriptError(f"Could not {verb} {path}: {_os_problem(e)}; {kept}.") from e
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    _fsync_dir(path.parent)


def _encode(doc: Any) -> bytes:
    try:
        text = json.dumps(doc, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError as e:  # NaN or inf slipped through
        raise TranscriptError(f"Could not encode the transcript: {e}.") from e
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate in some text: \u-escape everything so it still round-trips.
        return json.dumps(doc, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def save_transcript(conv: Conversation, path: Path) -> None:
    """Write ``conv`` to ``path`` atomically (see :func:`atomic_write`).

    The document is checked as it would be on load first, so every file written loads back.

    Raises:
        TranscriptError: the conversation holds a value a transcript cannot (nothing is
            written), or the file could not be written (the old file is intact).
    """
    path = Path(path)
    doc = to_json_dict(conv)
    try:
        _parse(doc)
    except _Bad as e:
        raise TranscriptError(f"Could not save {path}: the conversation is invalid ({e}); "
                              f"nothing was written.") from None
    data = _encode(doc)
    if len(data) > MAX_BYTES:
        raise TranscriptError(f"Could not save {path}: the transcript would be "
                              f"{_human(len(data))}, more than the {_human(MAX_BYTES)} a "
                              f"transcript may have; nothing was written.")
    atomic_write(path, data)
    _summary_cache.pop(path, None)


def _human(n: int) -> str:
    if n < 2**20:
        return f"{n} bytes" if n < 2**10 else f"{n / 2**10:.0f} KiB"
    return f"{n / 2**20:.1f} MiB".replace(".0 MiB", " MiB")


def _read_json(path: Path) -> Any:
    def fail(problem: str) -> TranscriptError:
        return TranscriptError(f"Could not load {path}: {problem}.")

    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BYTES:
                raise fail(f"it is {_human(size)}, more than the {_human(MAX_BYTES)} a "
                           f"transcript may have")
            raw = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise fail(_os_problem(e)) from None
    if len(raw) > MAX_BYTES:
        raise fail(f"it is more than the {_human(MAX_BYTES)} a transcript may have")
    if not raw.strip():
        raise fail("the file is empty")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise fail(f"it is not UTF-8 text (bad byte at offset {e.start})") from None

    def no_constants(name: str) -> Any:
        raise ValueError(f"{name} is not allowed")

    try:
        return json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            raise fail("it is cut off (the JSON ends before the document does); it may be "
                       "truncated") from None
        raise fail(f"it is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise fail("it is nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, or an integer with thousands of digits
        raise fail(f"it holds a number that is not allowed ({e})") from None


def load_transcript(path: Path) -> Conversation:
    """Read, migrate and validate the transcript at ``path``.

    Raises:
        TranscriptError: one sentence naming the file and the problem (missing, too big, not
            JSON, truncated, from a newer chatui, invalid field...).
    """
    path = Path(path)
    return from_json_dict(_read_json(path), source=str(path))


# ---------------------------------------------------------------------------------------
# Autosave and history


def data_dir() -> Path:
    """Where conversations are autosaved: ``$CHATUI_DATA_DIR`` if set, else
    ``platformdirs.user_data_dir("chatui")/conversations``. Not created here."""
    env = os.environ.get("CHATUI_DATA_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("chatui")) / "conversations"


_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|.)", re.S)


def slug(text: str, *, max_words: int = 6, max_len: int = 40) -> str:
    """``"Hello, World! How are you?"`` -> ``"hello-world-how-are-you"`` (letters of any
    script kept; at most ``max_words`` words and ``max_len`` characters)."""
    text = unicodedata.normalize("NFKC", _ANSI.sub("", text)).lower()
    words = re.findall(r"[^\W_]+", text)[:max_words]
    out = ""
    for w in words:
        cand = f"{out}-{w}" if out else w
        if len(cand) > max_len:
            if not out:
                out = w[:max_len]
            break
        out = cand
    return out


def _safe_id(conv_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", conv_id)[:64] or "chat"


def _stamp(t: float) -> str:
    try:
        return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d_%H%M")
    except (OverflowError, OSError, ValueError):
        return "0000-00-00_0000"


def _base_name(conv: Conversation) -> str:
    """``2026-11-22_0315_first-words-of-title_<id>``: created time, slug, id."""
    source = conv.title or next((e.text for e in conv.entries if e.role == "user"), "")
    return f"{_stamp(conv.created)}_{slug(source) or 'chat'}_{_safe_id(conv.id)}"


def autosave_path(conv: Conversation, directory: Path | None = None) -> Path:
    """The file a conversation autosaves to: ``2026-11-22_0315_first-words-of-title_<id>.json``.

    Stable for a conversation: if a file for its id already exists in the directory, that
    one is returned, so a title that appears or changes later never makes a second file.
    """
    directory = Path(directory) if directory is not None else data_dir()
    cid = _safe_id(conv.id)
    # date_time_slug_id: none of the first three holds "_", so the fourth part is the id
    # (an id "b_c" must not pick up the file of a conversation whose id is "a_b_c").
    existing = sorted(p for p in directory.glob(f"*_{glob.escape(cid)}.json")
                      if not p.name.startswith(".") and p.stem.split("_", 3)[-1] == cid)
    if existing:
        return existing[0]
    return directory / f"{_base_name(conv)}.json"


_STALE_TMP_S = 3600


def _remove_stale_temps(directory: Path) -> None:
    """Temporary files left by a save that was killed mid-write (older than an hour)."""
    now = time.time()
    for p in directory.glob(".*.json.*.tmp"):
        try:
            if now - p.stat().st_mtime > _STALE_TMP_S:
                p.unlink()
        except OSError:
            pass


def autosave(conv: Conversation, directory: Path | None = None) -> Path:
    """Save ``conv`` to its :func:`autosave_path` and return that path.

    Does nothing (but still returns the path) when the conversation has no messages. Call it
    after each message and when a reply is stopped; for very long conversations call it from
    a worker thread (it serialises, validates and fsyncs the whole transcript).

    Raises:
        TranscriptError: as :func:`save_transcript`.
    """
    path = autosave_path(conv, directory)
    if not conv.entries:
        return path
    save_transcript(conv, path)
    _remove_stale_temps(path.parent)
    return path


@dataclass(frozen=True)
class TranscriptSummary:
    """One saved conversation as ``/history`` lists it."""

    path: Path
    id: str
    created: float
    updated: float
    """When it was last saved."""
    model: str
    title: str
    """The title, else the first line of the first message."""
    messages: int
    error: str = ""
    """Why the file cannot be opened ("" when it can); the other fields are then guesses."""


# (path) -> ((mtime_ns, size), summary): /history reopened on an unchanged folder is cheap.
_summary_cache: dict[Path, tuple[tuple[int, int], TranscriptSummary]] = {}


def _summarise(path: Path) -> TranscriptSummary:
    try:
        st = path.stat()
    except OSError as e:
        return TranscriptSummary(path, "", 0.0, 0.0, "", path.name, 0,
                                 f"Could not load {path}: {_os_problem(e)}.")
    key = (st.st_mtime_ns, st.st_size)
    hit = _summary_cache.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    try:
        data = _read_json(path)
        conv = from_json_dict(data, source=str(path))
        saved = data.get("saved") if isinstance(data, dict) else None
        summary = TranscriptSummary(
            path=path, id=conv.id, created=conv.created,
            updated=saved if _is_num(saved) else st.st_mtime,
            model=model_label(conv), title=conversation_title(conv), messages=len(conv.entries))
    except TranscriptError as e:
        summary = TranscriptSummary(path, "", st.st_mtime, st.st_mtime, "", path.name, 0, str(e))
    _summary_cache[path] = (key, summary)
    return summary


def list_transcripts(directory: Path | None = None) -> list[TranscriptSummary]:
    """Every transcript in ``directory`` (default :func:`data_dir`), newest first.

    Files that cannot be read are listed too, with ``error`` set; nothing is raised for them.
    A missing directory gives an empty list.
    """
    directory = Path(directory) if directory is not None else data_dir()
    try:
        paths = [p for p in directory.iterdir()
                 if p.suffix == ".json" and not p.name.startswith(".")
                 and not p.name.endswith(".messages.json") and p.is_file()]
    except OSError:
        return []
    return sorted((_summarise(p) for p in paths), key=lambda s: s.updated, reverse=True)


def delete_transcript(path: Path) -> None:
    """Delete a saved transcript (ask the user first).

    Raises:
        TranscriptError: it is not a ``.json`` file, is gone already, or cannot be removed.
    """
    path = Path(path)
    if path.suffix != ".json" or path.is_dir():
        raise TranscriptError(f"Could not delete {path}: it is not a transcript (.json file).")
    try:
        path.unlink()
    except OSError as e:
        raise TranscriptError(f"Could not delete {path}: {_os_problem(e)}.") from None
    _summary_cache.pop(path, None)
    _fsync_dir(path.parent)


# ---------------------------------------------------------------------------------------
# Export

EXPORT_FORMATS = {"md": ".md", "markdown": ".md", "messages": ".messages.json"}


def export_to_file(conv: Conversation, fmt: str, path: Path | None = None, *,
                   directory: Path | None = None) -> Path:
    """Write ``conv`` as ``fmt`` ("md" or "messages") and return the path written.

    With no ``path`` (or a directory as ``path``) the file is named after the conversation's
    autosave name, e.g. ``2026-11-22_0315_first-words_<id>.md``, in ``directory`` (default:
    the current directory). The write is atomic.

    Raises:
        TranscriptError: an unknown format, or the file could not be written.
    """
    key = fmt.strip().lower()
    if key not in EXPORT_FORMATS:
        raise TranscriptError(f"Could not export: unknown format {fmt!r}; use md or messages.")
    if path is not None:
        path = Path(path).expanduser()
    if path is None or path.is_dir():
        base = path if path is not None else (Path(directory) if directory else Path.cwd())
        path = base / f"{_base_name(conv)}{EXPORT_FORMATS[key]}"
    if EXPORT_FORMATS[key] == ".md":
        data = export_markdown(conv).encode("utf-8", "backslashreplace")
    else:
        text = json.dumps(export_messages(conv), ensure_ascii=False, indent=2) + "\n"
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            data = (json.dumps(export_messages(conv), indent=2) + "\n").encode("ascii")
    atomic_write(path, data, verb="export to")
    return path
