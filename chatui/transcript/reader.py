"""JSON document -> Conversation: every field checked, older format versions migrated.

Reading never crashes: any problem is a :class:`_Bad` naming where in the document it is, and
:func:`from_json_dict` turns it into a one-sentence :class:`TranscriptError`.
"""

from __future__ import annotations

from typing import Any, Callable

from inference.settings import FIELD_NAMES, SamplingParams, SettingsError
from inference.types import Alternative, SamplerCut, Token, Usage

from ..conversation import Conversation, Entry, ModelRef, Reply, index_of
from ..token_records import TokenRecords
from .token_columns import ColumnError
from .token_columns import decode as decode_token_columns
from .schema import (
    _ENTROPY_EPS, _FINISH, _ID_RE, _LOGPROB_EPS, _MAX_COUNT, _MAX_ENTROPY, _MAX_INDEX,
    _MAX_RATE, _MAX_REPLIES, _MAX_SECONDS, _MAX_SHORT, _MAX_TIME, _MAX_TOKEN_ID, _MAX_TOP,
    _MIN_LOGPROB, _NUM, FORMAT_NAME, FORMAT_VERSION, TranscriptError, _finite, strip_credentials,
)

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


_CHANNELS = ("answer", "reasoning")


def _fields(v: Any) -> tuple[Any, ...] | None:
    """The fields of a common, valid token (transcripts hold many thousands) with its
    alternatives as the ``[id, text, logprob]`` lists they are; None for anything unusual,
    which :func:`_token_checked` then finds and words."""
    if type(v) is not dict:
        return None
    index = v.get("index")
    tid = v.get("id", ...)
    text = v.get("text")
    lp = v.get("logprob", ...)
    ent = v.get("entropy", ...)
    top = v.get("top", ())
    special = v.get("special", False)
    raw = v.get("raw", "")
    if not (type(index) is int and 0 <= index <= _MAX_INDEX
            and (tid is None or (type(tid) is int and 0 <= tid <= _MAX_TOKEN_ID))
            and type(text) is str
            and (lp is None or (type(lp) in _NUM and _MIN_LOGPROB <= lp <= _LOGPROB_EPS))
            and (ent is None or (type(ent) in _NUM and -_ENTROPY_EPS <= ent <= _MAX_ENTROPY))
            and type(top) in (list, tuple) and len(top) <= _MAX_TOP
            and type(special) is bool
            and v.get("glyph_start") is None and type(raw) is str
            and v.get("channel", "answer") in _CHANNELS):
        return None
    for a in top:
        if not (type(a) is list and len(a) == 3):
            return None
        aid, atext, alp = a
        if not ((aid is None or (type(aid) is int and 0 <= aid <= _MAX_TOKEN_ID))
                and type(atext) is str
                and type(alp) in _NUM and _MIN_LOGPROB <= alp <= _LOGPROB_EPS):
            return None
    return index, tid, text, lp, ent, special, raw, top


_CUT_NAMES = ("", "top-k", "top-p", "min-p", "greedy")


def _sampler(v: Any, where: str, alternatives: int) -> SamplerCut | None:
    """A token's optional ``"sampler"`` object (what the sampler did; issue 17):
    ``{"prob", "nucleus", "top": [[prob, cut], ...]}``, one ``top`` entry per alternative."""
    if v is None:
        return None
    o = _Obj(v, where)
    prob = o.num("prob", 0, 1 + _LOGPROB_EPS, what="a probability between 0 and 1")
    nucleus = o.int("nucleus", 0, _MAX_TOKEN_ID)
    top = o.list("top", [])
    if len(top) != alternatives:
        raise _Bad(f"{o.at('top')} has {len(top)} entries but the token has {alternatives} "
                   f"alternatives")
    probs, cuts = [], []
    for j, a in enumerate(top):
        if not (isinstance(a, list) and len(a) == 2 and _is_num(a[0])
                and 0 <= a[0] <= 1 + _LOGPROB_EPS and a[1] in _CUT_NAMES):
            raise _Bad(f"{o.at('top')}[{j}] must be [probability, cut] with a cut among "
                       f"{', '.join(repr(c) for c in _CUT_NAMES)}, not {_show(a)}")
        probs.append(float(a[0]))
        cuts.append(a[1])
    return SamplerCut(float(prob), nucleus, tuple(probs), tuple(cuts))  # type: ignore[arg-type]


def _token(v: Any, where: str) -> Token:
    fields = _fields(v)
    if fields is None:
        return _token_checked(v, where)
    index, tid, text, lp, ent, special, raw, top = fields
    return Token(index, tid, text, lp, ent, tuple(Alternative(*a) for a in top), special,
                 None, raw, v.get("channel", "answer"),
                 _sampler(v.get("sampler"), f"{where}.sampler", len(top)))


def _tokens(items: list[Any], where: str) -> TokenRecords:
    """A reply's tokens, read straight into columns (no object per token or alternative);
    a reply with an unusual token goes token by token through :func:`_token`, which checks
    each in full. A token's optional ``"sampler"`` record is read into its own columns."""
    rows = [_fields(v) for v in items]
    if None not in rows:
        reasoning = [v.get("channel") == "reasoning" for v in items]
        samplers = None
        if any("sampler" in v for v in items):
            samplers = [_sampler(v.get("sampler"), f"{where}[{i}].sampler", len(r[7]))
                        for i, (v, r) in enumerate(zip(items, rows))]
        return TokenRecords.from_fields(  # type: ignore[arg-type]
            rows, reasoning if any(reasoning) else None, samplers)
    return TokenRecords([_token(v, f"{where}[{i}]") for i, v in enumerate(items)])


def _reply_tokens(o: _Obj) -> TokenRecords:
    """A reply's tokens: columns (what chatui writes; :mod:`.token_columns`) or a list of
    token objects (what it wrote before)."""
    v = o.get("tokens")
    if isinstance(v, list):
        return _tokens(v, o.at("tokens"))
    try:
        return decode_token_columns(v)
    except ColumnError as e:
        raise _Bad(f"{o.at('tokens')}: {e}") from None


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
    channel = o.get("channel", "answer")
    if channel not in _CHANNELS:
        raise _Bad(f"{o.at('channel')} must be \"reasoning\" or \"answer\", not "
                   f"{_show(channel)}")
    sampler = _sampler(o.get("sampler", None), o.at("sampler"), len(top))
    return Token(
        index=index,
        id=o.int("id", 0, _MAX_TOKEN_ID, nullable=True),
        text=o.str("text"),
        logprob=o.num("logprob", _MIN_LOGPROB, _LOGPROB_EPS, nullable=True,
                      what=f"a log-probability between {_MIN_LOGPROB:g} and 0"),
        entropy=o.num("entropy", -_ENTROPY_EPS, _MAX_ENTROPY, nullable=True,
                      what=f"an entropy in nats between 0 and {_MAX_ENTROPY:g}"),
        top=tuple(top), special=special, glyph_start=glyph_start, raw=o.str("raw", ""),
        channel=channel,
        sampler=sampler,
    )


def _settings(v: Any, where: str) -> SamplingParams:
    o = _Obj(v, where)
    for k, x in o.d.items():
        if k not in FIELD_NAMES:
            raise _Bad(f"{where} has an unknown setting {_show(k)}")
        if k == "stop":
            if not (isinstance(x, list) and all(isinstance(s, str) for s in x)):
                raise _Bad(f"{o.at(k)} must be a list of strings, not {_show(x)}")
        elif k in ("seed", "reasoning_budget"):
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
        context_limit=o.int("context_limit", 0, _MAX_COUNT, 0),  # type: ignore[arg-type]
    )


def _reply(v: Any, where: str) -> Reply:
    o = _Obj(v, where)
    finish = o.get("finish_reason")
    if finish is not None and finish not in _FINISH:
        raise _Bad(f"{o.at('finish_reason')} must be one of {', '.join(_FINISH)} or null, "
                   f"not {_show(finish)}")
    return Reply(
        settings=_settings(o.get("settings"), o.at("settings")),
        text=o.str("text"),
        tokens=_reply_tokens(o),
        finish_reason=finish,
        usage=_usage(o.get("usage", None), o.at("usage")),
        error=o.str("error", ""),
        reasoning=o.str("reasoning", ""),
        reasoning_s=o.num("reasoning_s", 0, _MAX_SECONDS, None, nullable=True),
    )


def _entry(v: Any, where: str, node: str | None = None) -> Entry:
    """One message; its ``node`` id as written, else ``node`` (else a new one)."""
    entry = _entry_fields(v, where)
    o = _Obj(v, where)
    if "node" in o.d:
        node = o.str("node")
        if not _ID_RE.match(node):
            raise _Bad(f"{o.at('node')} must be 1 to 64 letters, digits, '-' or '_', "
                       f"not {_show(node)}")
    if node is not None:
        entry.node = node
    return entry


def _sibling(v: Any, where: str) -> int:
    """A message's place among its parent's children (0 when not written)."""
    return _Obj(v, where).int("sibling", 0, _MAX_INDEX, 0)  # type: ignore[return-value]


def _entry_fields(v: Any, where: str) -> Entry:
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
    fan_out = o.get("fan_out", False)
    if not isinstance(fan_out, bool):
        raise _Bad(f"{o.at('fan_out')} must be true or false, not {_show(fan_out)}")
    return Entry("assistant", text, t, replies, chosen,  # type: ignore[arg-type]
                 fan_out=fan_out and len(replies) > 1)


def _model(v: Any) -> ModelRef:
    o = _Obj(v, "model")
    return ModelRef(
        name=o.str("name", "", max_len=_MAX_SHORT),
        checkpoint=o.str("checkpoint", "", max_len=_MAX_SHORT),
        weights_hash=o.str("weights_hash", "", max_len=_MAX_SHORT),
        dtype=o.str("dtype", "", max_len=_MAX_SHORT),
        quantization=o.str("quantization", "", max_len=_MAX_SHORT),
        backend=o.str("backend", "local", max_len=_MAX_SHORT),
        url=strip_credentials(o.str("url", "", max_len=_MAX_SHORT)),
    )


def _parent(v: Any) -> dict[str, Any]:
    """``{"id": ..., "messages": n}`` -> the Conversation fields of a branch."""
    if v is None:
        return {}
    o = _Obj(v, "parent")
    pid = o.str("id")
    if not _ID_RE.match(pid):
        raise _Bad(f"parent.id must be 1 to 64 letters, digits, '-' or '_', not {_show(pid)}")
    return {"parent": pid, "branched_at": o.int("messages", 0, _MAX_INDEX)}


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


def _migrate_2_to_3(doc: dict[str, Any]) -> dict[str, Any]:
    """Version 2 was one list of messages; version 3 is a tree whose chosen path is
    ``messages``, each message with a ``node`` id. A version 2 conversation is a tree with
    one branch: its messages get the ids ``m0``, ``m1``... (the same each time it is read,
    so a copy and its home still tell the messages they share by content, not by chance)."""
    msgs = doc.get("messages")
    if not isinstance(msgs, list):
        return {**doc, "version": 3}  # validation reports it
    return {**doc, "version": 3, "messages": [
        {**m, "node": f"m{i}"} if isinstance(m, dict) and "node" not in m else m
        for i, m in enumerate(msgs)]}


_MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _migrate_1_to_2, 2: _migrate_2_to_3}


def _tree(o: _Obj) -> dict[str, Any]:
    """``messages`` (the chosen path) and ``branches`` (every other message, parents first)
    -> the Conversation's ``tops`` and ``top``."""
    raw_msgs = o.list("messages")
    path = [_entry(m, f"messages[{i}]", f"m{i}") for i, m in enumerate(raw_msgs)]
    slots: dict[str | None, list[tuple[int, int, Entry]]] = {}
    nodes: dict[str, Entry] = {}

    def place(parent: str | None, pos: int, order: int, entry: Entry, where: str) -> None:
        if entry.node in nodes:
            raise _Bad(f"{where}.node {_show(entry.node)} is used by another message")
        nodes[entry.node] = entry
        slots.setdefault(parent, []).append((pos, order, entry))

    nexts: list[tuple[Entry, int | None, str]] = []
    prev: str | None = None
    for i, (m, e) in enumerate(zip(raw_msgs, path)):
        place(prev, _sibling(m, f"messages[{i}]"), 0, e, f"messages[{i}]")
        prev = e.node
    for i, b in enumerate(o.list("branches", [])):
        where = f"branches[{i}]"
        e = _entry(b, where)
        bo = _Obj(b, where)
        if "node" not in bo.d:
            raise _Bad(f"{where}.node is missing")
        parent = bo.get("parent")
        if parent is not None and (not isinstance(parent, str) or parent not in nodes):
            raise _Bad(f"{where}.parent {_show(parent)} names no message before it")
        place(parent, _sibling(b, where), 1, e, where)
        nexts.append((e, bo.int("next", 0, _MAX_INDEX, -1) if "next" in bo.d else -1, where))
    for parent, kids in slots.items():
        kids.sort(key=lambda k: (k[0], k[1]))
        children = [k[2] for k in kids]
        if parent is not None:
            nodes[parent].children = children
    tops = [k[2] for k in slots.get(None, [])]
    for e, nxt, where in nexts:
        if nxt is not None and nxt >= len(e.children):
            raise _Bad(f"{where}.next is {nxt} but the message has {len(e.children)} replies "
                       "after it")
        e.active = -1 if nxt is None else nxt
    for a, b in zip(path, path[1:]):
        a.active = index_of(a.children, b)
    if path:
        path[-1].active = -1
    return {"tops": tops, "top": index_of(tops, path[0]) if path else -1}


def _migrate(doc: dict[str, Any], version: int) -> dict[str, Any]:
    """Bring a document of an older ``version`` up to :data:`FORMAT_VERSION`, step by step."""
    while version < FORMAT_VERSION:
        doc = _MIGRATIONS[version](doc)
        version += 1
    return doc


def _message_text(o: _Obj) -> str:
    """A message's ``content``: a string, or OpenAI's list of parts, of which only text
    parts are taken (one sentence names any other)."""
    content = o.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _Bad(f"{o.at('content')} must be a string or a list of text parts, not "
                   f"{_show(content)}")
    texts = []
    for i, part in enumerate(content):
        p = _Obj(part, f"{o.at('content')}[{i}]")
        if p.get("type", "text") != "text":
            raise _Bad(f"{p.at('type')} is {_show(p.get('type'))}: only text parts can be "
                       "opened")
        texts.append(p.str("text"))
    return "".join(texts)


def _from_messages(data: list[Any]) -> Conversation:
    """A plain ``[{"role", "content"}, ...]`` list (chatui's messages export, OpenAI's chat
    format) as a new conversation: system messages at its start become the system prompt, the
    others its messages, a reply's ``reasoning_content`` its reasoning. There are no tokens,
    settings or ids in such a file: the replies are text, and the conversation gets an id of
    its own (its autosave is a new file)."""
    if not data:
        raise _Bad("it is an empty list, not a conversation")
    for i, m in enumerate(data):
        if not isinstance(m, dict) or "role" not in m:
            what = 'an object with no "role"' if isinstance(m, dict) else _show(m)
            raise _Bad("it is not a chatui transcript, nor a list of role/content messages "
                       f"([{i}] is {what})")
    if len(data) > _MAX_INDEX:
        raise _Bad(f"it holds {len(data)} messages, more than the {_MAX_INDEX} a "
                   "conversation may have")
    conv = Conversation()
    system: list[str] = []
    for i, item in enumerate(data):
        o = _Obj(item, f"[{i}]")
        role = o.get("role")
        text = _message_text(o)
        if role == "system":
            if conv.entries:
                raise _Bad(f"{o.at('role')} is a system message after the conversation began; "
                           "only the first messages may be")
            system.append(text)
        elif role == "user":
            conv.add_user(text)
        elif role == "assistant":
            entry = conv.add_assistant([SamplingParams()])
            reply = entry.replies[0]
            reply.text, reply.finish_reason = text, "stop"
            reply.reasoning = o.str("reasoning_content", "")
        else:
            raise _Bad(f"{o.at('role')} must be \"system\", \"user\" or \"assistant\", "
                       f"not {_show(role)}")
    if not conv.entries:
        raise _Bad("it holds a system prompt and no messages")
    conv.system_prompt = "\n\n".join(system)
    return conv


def _parse(data: object) -> Conversation:
    """The conversation in ``data``; raises :class:`_Bad` with the problem."""
    if isinstance(data, list):
        return _from_messages(data)
    if not isinstance(data, dict):
        raise _Bad("it is not a chatui transcript (expected a JSON object, or a list of "
                   f"role/content messages, found {_show(data)})")
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
    mode = o.get("mode", "chat")
    if mode not in ("chat", "raw"):
        raise _Bad(f"mode must be \"chat\" or \"raw\", not {_show(mode)}")
    return Conversation(
        mode=mode,
        id=conv_id,
        created=created,  # type: ignore[arg-type]
        title=o.str("title", ""),
        system_prompt=o.str("system_prompt", ""),
        **_tree(o),
        model=_model(o.get("model", {})),
        **_parent(o.get("parent", None)),
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
