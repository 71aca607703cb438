"""Render a conversation for other tools: readable Markdown, or plain role/content messages.

Both are pure functions of a :class:`~chatui.conversation.Conversation`; writing them to disk
(atomically, under a default name) is :func:`chatui.transcript.export_to_file`.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Sequence

from inference.settings import SamplingParams

from .conversation import Conversation, Entry, Reply, first_divergence, reasoning_count

# C0 controls other than tab and newline, DEL and C1 controls. Model output may hold ANSI
# escapes; a Markdown file someone `cat`s must not drive their terminal, so these become
# visible symbols (the transcript keeps the exact text).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _visible(text: str) -> str:
    def sub(m: re.Match[str]) -> str:
        c = ord(m.group())
        if c < 0x20:
            return chr(0x2400 + c)  # U+2400 block: control pictures (␛ for ESC)
        if c == 0x7F:
            return "\u2421"  # ␡
        return f"\\x{c:02x}"

    return _CONTROL.sub(sub, text)


def _one_line(text: str) -> str:
    """A token's text inside a heading: a newline or tab in it shown (as the token view shows
    them), not breaking the line."""
    return _visible(text).replace("\n", "↵").replace("\t", "⇥")


def _when(t: float) -> str:
    try:
        return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")
    except (OverflowError, OSError, ValueError):
        return "?"


def conversation_title(conv: Conversation) -> str:
    """The title to show: the conversation's own, else the first line of the first user
    message, else "Untitled chat"."""
    if conv.title.strip():
        return conv.title.strip().splitlines()[0]
    for e in conv.entries:
        if e.role == "user" and e.text.strip():
            return e.text.strip().splitlines()[0][:80]
    return "Untitled chat"


def model_label(conv: Conversation) -> str:
    """A short name for the model: its name, else the checkpoint, else the backend."""
    m = conv.model
    label = m.name or m.checkpoint or m.url or m.backend or "unknown model"
    return label


def precision_label(quantization: str, dtype: str) -> str:
    """What decoded: the dtype, or with quantized weights what is quantized and what is not
    ("int8 weights, float32 compute"; "float32 · int8" read as a contradiction). The status
    bar and the Markdown export both say it so."""
    if quantization in ("", "none"):
        return dtype
    return f"{quantization} weights, {dtype} compute"


def reply_stats(reply: Reply) -> str:
    """One small line of numbers about a reply: tokens, speed, first token, perplexity."""
    parts: list[str] = []
    u = reply.usage
    # The tokens of the reply, as the chat counts them (the engine's completion count and the
    # reply's records also hold the end-of-turn token: the export said 20 where the chat
    # said 19, then 109 where it said 108).
    n = reply.token_count if reply.tokens or u is None else u.completion_tokens
    if n or reply.tokens:
        parts.append(f"{n} token" + ("" if n == 1 else "s"))
    if u is not None:
        if u.decode_rate is not None:
            parts.append(f"{u.decode_rate:.1f} tok/s")
        parts.append(f"first token {u.ttft_s:.2f} s")
    ppl = reply.perplexity
    if ppl is not None:
        parts.append(f"perplexity {ppl:.2f}")
    if reply.finish_reason and reply.finish_reason != "stop":
        parts.append(reply.finish_reason)
    elif reply.finish_reason is None:
        parts.append("unfinished")
    return " · ".join(parts)


def _settings_label(s: SamplingParams) -> str:
    return s.describe(against=SamplingParams()) if s != SamplingParams() else "default settings"


def _reasoning_block(reply: Reply) -> list[str]:
    """The reply's reasoning as a collapsible block (GitHub and most Markdown viewers fold
    ``<details>``); a blank line after ``<summary>`` so the reasoning renders as Markdown."""
    if not reply.reasoning:
        return []
    n = reasoning_count(reply.tokens)
    count = f" · {n} token{'' if n == 1 else 's'}" if n else ""
    seconds = f" · {reply.reasoning_s:.1f} s" if reply.reasoning_s is not None else ""
    return ["<details><summary>Reasoning" + count + seconds + "</summary>", "",
            _visible(reply.reasoning).strip("\n"), "", "</details>", ""]


def _reply_block(reply: Reply) -> list[str]:
    out = [*_reasoning_block(reply),
           _visible(reply.text) if reply.text else "*(empty reply)*", ""]
    if reply.error:
        out += [f"> error: {_visible(reply.error)}", ""]
    stats = reply_stats(reply)
    if stats:
        out += [f"<sub>{stats}</sub>", ""]
    return out


def _assistant(entry: Entry, on_path: bool = True) -> list[str]:
    if not entry.replies:
        return ["## Assistant", "", _visible(entry.text) or "*(empty reply)*", ""]
    if not entry.is_comparison:
        reply = entry.replies[0]
        return ["## Assistant", "", f"<sub>{_settings_label(reply.settings)}</sub>", "",
                *_reply_block(reply)]
    # (a branch's group said "the conversation continues with this one", which it does not)
    chosen = (" (chosen: the conversation continues with this one)" if on_path
              else " (chosen: the branch goes on from this one)" if entry.children
              else " (chosen)")
    if entry.fan_out:  # one setting; the columns are the alternatives at one token
        pos, _ = first_divergence(entry.replies)
        at = f" at token {pos + 1}" if pos is not None else ""
        out = [f"## Assistant: fan-out{at}, {len(entry.replies)} alternatives decoded together",
               "", f"<sub>{_settings_label(entry.replies[0].settings)}</sub>", ""]
        for i, reply in enumerate(entry.replies):
            token = (f": '{_one_line(reply.tokens[pos].text)}'"
                     if pos is not None and pos < len(reply.tokens) else "")
            out += [f"### Alternative {i + 1}{token}{chosen if i == entry.chosen else ''}", "",
                    *_reply_block(reply)]
        return out
    out = [f"## Assistant: comparison of {len(entry.replies)} replies", ""]
    for i, reply in enumerate(entry.replies):
        out += [f"### Column {i + 1}{chosen if i == entry.chosen else ''}", "",
                f"<sub>{_settings_label(reply.settings)}</sub>", "", *_reply_block(reply)]
    return out


def leaf_paths(conv: Conversation) -> list[tuple[Entry, ...]]:
    """Every branch of the tree, as the path from the first message to its last (one per
    message with no children), oldest first."""
    out: list[tuple[Entry, ...]] = []
    stack: list[tuple[Entry, ...]] = [(e,) for e in reversed(conv.tops)]
    while stack:
        path = stack.pop()
        kids = path[-1].children
        if not kids:
            out.append(path)
        stack.extend(path + (k,) for k in reversed(kids))
    return out


def _messages_md(entries: Sequence[Entry], level: str = "##", on_path: bool = True) -> list[str]:
    lines: list[str] = []
    for e in entries:
        if e.role == "user":
            lines += [f"{level} User", "", _visible(e.text), ""]
        else:
            lines += [x.replace("## ", f"{level} ", 1) if x.startswith("## ") else x
                      for x in _assistant(e, on_path)]
    return lines


def conversation_line(conv: Conversation) -> str:
    """The Markdown header's line naming the conversation: how ``/export`` knows an earlier
    export of it, which it may replace (``chatui.transcript.exporting.is_export_of``)."""
    return f"**Conversation:** `{conv.id}`"


def export_markdown(conv: Conversation, *, all_branches: bool = False) -> str:
    """Readable Markdown: title, model, system prompt, then each message of the chosen
    path; with ``all_branches``, then every other branch from where it leaves the path
    (``/export md --all``).

    Comparison groups show every column with its settings and which one was chosen; each
    reply ends with a small stats line (tokens, tokens/s, time to first token, perplexity).
    Control characters (ANSI escapes...) are shown as visible symbols.
    """
    m = conv.model
    lines = [f"# {_visible(conversation_title(conv))}", ""]
    meta = [f"**Model:** {_visible(model_label(conv))}"]
    if m.checkpoint and m.checkpoint != model_label(conv):
        meta.append(f"**Checkpoint:** `{_visible(m.checkpoint)}`")
    # ("local, float32" for a reply decoded from int8 weights was read as the full precision)
    precision = precision_label(m.quantization, m.dtype) if m.dtype else ""
    details = ", ".join(x for x in (m.backend, precision) if x)
    if details:
        meta.append(f"**Backend:** {_visible(details)}")
    if m.weights_hash:
        meta.append(f"**Weights hash:** `{_visible(m.weights_hash)}`")
    meta.append(f"**Started:** {_when(conv.created)}")
    meta.append(conversation_line(conv))
    lines += ["  \n".join(meta), ""]
    if conv.system_prompt:
        lines += ["## System", "", _visible(conv.system_prompt), ""]
    path = conv.entries
    lines += _messages_md(path)
    if all_branches:
        n = 0
        for branch in leaf_paths(conv):
            at = next((i for i, (a, b) in enumerate(zip(branch, path)) if a is not b),
                      min(len(branch), len(path)))
            if at == len(branch):
                continue  # the chosen path, or a part of it
            n += 1
            where = f"after message {at}" if at else "at the first message"
            lines += ["---", "", f"## Branch {n} (leaves the conversation {where})", ""]
            lines += _messages_md(branch[at:], "###", on_path=False)
    return "\n".join(lines).rstrip("\n") + "\n"


def export_messages(conv: Conversation) -> list[dict[str, str]]:
    """The plain ``[{"role", "content"}, ...]`` list that OpenAI-style clients and
    ``transformers`` chat templates take: system prompt first, chosen replies only; a
    reply's reasoning under ``reasoning_content`` (the key vLLM, SGLang and Qwen3's template
    use)."""
    out = []
    for m in conv.messages():
        d = {"role": m.role, "content": m.content}
        if m.reasoning:
            d["reasoning_content"] = m.reasoning
        out.append(d)
    return out
