"""What each slash command does: one handler per command, each taking a narrow
:class:`CommandContext` (what the chat offers commands) and the argument text.

The registry (:data:`chatui.commands.COMMANDS`) pairs every command's name, synopsis and help
with its handler here; the prompt's completion, the command palette and ``/help`` all read that
table. No Textual import: the context does the drawing.
"""

from __future__ import annotations

import asyncio
import dataclasses

import datetime
import difflib
import os
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

from inference.settings import SamplingParams, SettingsError, parse_assignments
from inference.types import AssistantPrefix, Failed, Scored, ScoreRequest

from .conversation import Conversation, Entry, ModelRef, Reply, index_of, walk
from .kept_settings import RESET_WORDS, keep, kept_after, kept_values, model_key
from .recorder import prefix_of, spellings
from .state import kept_change, settings_change, settings_label

if TYPE_CHECKING:
    from inference.worker import InferenceWorker

    from .config import AppConfig
    from .screens.compare_flow import CompareFlow
    from .state import ChatState

log = logging.getLogger(__name__)


class AppServices(Protocol):
    """What the app lends the chat: the worker, the config and persistence."""

    worker: InferenceWorker
    config: AppConfig

    @property
    def model_ref(self) -> ModelRef | None: ...

    def save_conversation(self, conv: Conversation | None = None) -> None: ...

    def flush_autosaves(self) -> None: ...

    async def keep_conversation(self) -> str | None: ...

    def open_saved(self, path: Path) -> Conversation: ...


class CommandContext(Protocol):
    """What a command may do (the chat screen provides it)."""

    state: ChatState
    services: AppServices
    compare: CompareFlow

    def notice(self, text: str, kind: str = "info") -> object: ...

    def notify(self, text: str, **kwargs: Any) -> None: ...

    def open_help(self) -> None: ...

    def open_history(self, query: str = "") -> None: ...

    async def quit(self) -> None: ...

    async def stop_generation(self) -> None: ...

    async def show_conversation(self, conversation: Conversation, *,
                                cleared: bool = False) -> None: ...

    async def remove_entry(self, entry: Entry) -> None: ...

    async def rewind(self, entry: Entry) -> None: ...

    async def step_sibling(self, delta: int, entry: Entry | None = None) -> None: ...

    async def sync_path(self, *, in_place: bool = False) -> None: ...

    def open_tree(self) -> None: ...

    def settings_changed(self) -> None: ...

    def answer(self, prompt_text: str, again: Entry | None = None) -> None: ...

    def start_reply(self, entry: Entry, *, prompt_text: str = "",
                    prefix: AssistantPrefix | None = None,
                    max_new_tokens: int | None = None,
                    branch_of: Entry | None = None) -> None: ...

    def put_prompt(self, text: str) -> None: ...

    def begin_edit(self, entry: Entry) -> None: ...

    def toggle_token_mode(self) -> None: ...

    def show_score(self, label: str, scored: Scored) -> None: ...

    def probe_point(self) -> tuple[Entry, Reply, int] | None: ...

    def open_notebook(self, notice: str = "", opened: Conversation | None = None) -> None: ...

    def toggle_raw(self) -> bool: ...

    def toggle_reasoning(self) -> bool | None: ...

    def theme_names(self) -> list[str]: ...

    def current_theme(self) -> str: ...

    def set_theme(self, name: str) -> None: ...

    def copy_to_clipboard(self, text: str) -> None: ...


Handler = Callable[[CommandContext, str], Awaitable[None]]


async def cmd_help(ctx: CommandContext, arg: str = "") -> None:
    ctx.open_help()


async def cmd_exit(ctx: CommandContext, arg: str = "") -> None:
    await ctx.quit()


async def cmd_clear(ctx: CommandContext, arg: str = "") -> None:
    await ctx.stop_generation()
    old = ctx.state.conversation
    unsaved = await ctx.services.keep_conversation()  # (as it is now: the stopped reply too)
    if unsaved is not None:
        ctx.notice(unsaved, "error")
        return
    await ctx.show_conversation(Conversation(system_prompt=old.system_prompt), cleared=True)
    ctx.notice("Conversation cleared; the previous one is saved (/history lists it)."
               if old.entries and ctx.services.config.autosave else "Conversation cleared.")


async def cmd_system(ctx: CommandContext, arg: str = "") -> None:
    from .widgets.text import shorten  # (the widgets package patches Textual on import)

    conv = ctx.state.conversation
    if not arg:
        ctx.notice(f"System prompt: {conv.system_prompt or '(none)'}")
        return
    if arg.strip().lower() in CLEARED:  # (a system prompt, once set, stayed: /clear keeps it)
        conv.system_prompt = ""
        ctx.notice("System prompt cleared.")
        return
    conv.system_prompt = arg
    ctx.notice(f"System prompt set: {shorten(arg, 200)}")


TITLE_MAX = 120
"""The most characters ``/title`` takes (a title is one line of ``/history``'s listing)."""


async def cmd_title(ctx: CommandContext, arg: str = "") -> None:
    conv = ctx.state.conversation
    text = " ".join(arg.split())  # one line, whatever was pasted
    if not text:
        ctx.notice(f"Title: {conv.title}" if conv.title else
                   "No title yet: the first message gives one, /title TEXT names it.")
        return
    if len(text) > TITLE_MAX:
        ctx.notice(f"A title may have at most {TITLE_MAX} characters; this one has "
                   f"{len(text)}.", "error")
        return
    conv.title = text
    ctx.services.save_conversation()  # (an empty conversation is saved with its first reply)
    ctx.notice(f"Title set: {text}")


CLEARED = ("none", "off", '""', "''")
"""What ``/set stop VALUE`` takes to mean "no stop strings" (the literal word needs a comma:
``/set stop none,``)."""


def _is_stop(name: str) -> bool:
    return name.strip().lower() in ("stop", "stops", "stop_strings")


async def cmd_set(ctx: CommandContext, arg: str) -> None:
    state = ctx.state
    if arg.strip().lower() in RESET_WORDS:
        _reset_settings(ctx)
        return
    name, _, value = arg.partition(" ")
    try:
        # several pairs (``/set temp 0 max 64``: one pair's value was "0 max 64"), but a stop
        # string keeps its spaces
        if "=" in arg or (not _is_stop(name) and len(value.split()) > 1):
            new = parse_assignments(arg, state.settings)
            named = [a.partition("=") for a in arg.split()]
            if any(_is_stop(n) and v.strip().lower() in CLEARED for n, _, v in named):
                new = new.with_values(stop=())
        else:
            if _is_stop(name) and value.strip().lower() in (*CLEARED, ""):
                new = state.settings.with_values(stop=())
            elif not value.strip():
                raise SettingsError(f"/set needs a value, e.g. /set {name} 0.7")
            else:
                new = state.settings.with_values(**{name: value.strip()})
    except SettingsError as exc:
        ctx.notice(str(exc), "error")
        return
    old, state.settings = state.settings, new
    state.settings_from_user = True
    ctx.settings_changed()
    kept = ""
    if state.info is not None:  # kept for this model's next chat (kept_settings)
        defaults = state.info.default_settings
        keep(ctx.services.config.resolved_config_dir(), model_key(state.info),
             lambda values: kept_after(values, old, new, defaults))
        kept = " Kept for your next chat with this model (/set reset forgets it)."
    # what changed, then all that is on, as the status line and /set write them (it listed
    # every field as name=value, "repetition_penalty=1 seed=None", after "/set max 40")
    change = settings_change(old, new)
    ctx.notice(f"{f'Set {change}' if change else 'Nothing changed'}. "
               f"In force: {settings_label(new)}.{kept if change else ''}")


def _reset_settings(ctx: CommandContext) -> None:
    """``/set reset``: the model's defaults (the command line's flags on top), and nothing
    kept for its next chat."""
    state = ctx.state
    if state.info is None:
        ctx.notice("The model is still loading; /set reset needs its defaults.", "error")
        return
    old = state.settings
    state.settings = state.with_overrides(state.info.default_settings)
    state.settings_from_user = True
    keep(ctx.services.config.resolved_config_dir(), model_key(state.info), lambda _: {})
    ctx.settings_changed()
    change = settings_change(old, state.settings)
    flags = " with the command line's flags" if state.overrides else ""
    done = (f"Back to the model's defaults{flags}: {change}" if change
            else f"The model's defaults{flags}")
    ctx.notice(f"{done}. Nothing kept for its next chat. "
               f"In force: {settings_label(state.settings)}.")


async def cmd_settings(ctx: CommandContext, arg: str = "") -> None:
    state = ctx.state
    default = state.info.default_settings if state.info else SamplingParams()
    kept = (kept_values(ctx.services.config.resolved_config_dir(), model_key(state.info))
            if state.info is not None else {})
    change = kept_change(default, kept)
    kept_line = (f"Kept for this model's next chat: {change} (/set reset forgets it)\n"
                 if change else "")
    ctx.notice(f"Settings in force: {settings_label(state.settings, every=True)}\n"
               f"Model defaults: {settings_label(default, every=True)}\n{kept_line}"
               f"Top alternatives per token: {state.top_logprobs}")


def _numbered(ctx: CommandContext, arg: str, command: str) -> Entry | None:
    """Message ``arg`` of the conversation shown (1 = the first; replies count too, as /score
    and the exports number them), or None after saying why there is none."""
    entries = ctx.state.conversation.entries
    if not arg.isdigit() or not 1 <= int(arg) <= len(entries):
        ctx.notice(f"/{command} takes a message number from 1 to {len(entries)}"
                   if entries else f"There is no message {arg} to {command}.", "error")
        return None
    return entries[int(arg) - 1]


async def cmd_retry(ctx: CommandContext, arg: str = "") -> None:
    """``/retry``: the last reply again; ``/retry N``: reply N again (your message N: the
    reply to it). The old reply and the messages after it stay in the tree, a branch (‹ ›):
    users of every chat tool ask to regenerate any message, not only the last."""
    await ctx.stop_generation()
    entries = ctx.state.conversation.entries
    arg = arg.strip()
    if arg:
        entry = _numbered(ctx, arg, "retry")
        if entry is None:
            return
        if entry.role != "assistant":
            at = index_of(entries, entry)
            if at + 1 < len(entries):
                entry = entries[at + 1]
            else:  # your last message, not answered yet: answered now
                ctx.answer(entry.text)
                return
    else:
        entry = entries[-1] if entries else None
        if entry is None or entry.role != "assistant":
            ctx.notice("There is no reply to retry.", "error")
            return
    await ctx.rewind(entry)  # it and what followed stay in the tree: the new one's sibling
    ctx.answer("", again=entry)


async def cmd_edit(ctx: CommandContext, arg: str = "") -> None:
    """``/edit``: the last prompt back in the box; ``/edit N``: your message N. Sending it
    adds the new text beside the old, and the conversation goes on from it; the old message
    and what followed it stay in the tree (‹ ›)."""
    await ctx.stop_generation()
    conv = ctx.state.conversation
    arg = arg.strip()
    if arg:
        user = _numbered(ctx, arg, "edit")
        if user is None:
            return
        if user.role != "user":
            ctx.notice(f"Message {arg} is a reply: /edit takes one of your messages (/retry "
                       f"{arg} regenerates the reply).", "error")
            return
    else:
        user = conv.last_user
    if user is None:
        ctx.notice("There is no prompt to edit.", "error")
        return
    ctx.begin_edit(user)  # sending it adds a sibling; the conversation is unchanged till then


async def cmd_continue(ctx: CommandContext, arg: str = "") -> None:
    state = ctx.state
    if state.generating:
        ctx.notice("A reply is still being generated.", "error")
        return
    entries = state.conversation.entries
    last = entries[-1] if entries else None
    reply = last.reply if last is not None else None
    if reply is None or last is None:
        ctx.notice("There is no reply to continue.", "error")
        return
    if last.is_comparison and last.fan_out:
        ctx.notice("Pick the branch to go on with first (/pick N or F6); /continue then "
                   "continues it.", "error")
        return
    what = f"Column {last.chosen + 1}" if last.is_comparison else "The last reply"
    if reply.finish_reason == "error" and not reply.tokens:
        ctx.notice(f"{what} failed before its first token ({reply.error}); /retry "
                   "generates it again.", "error")
        return
    if reply.finish_reason not in ("length", "cancelled", "error"):
        ctx.notice(f"{what} finished on its own; only a stopped, cut-off or failed "
                   "reply can be continued" + (" (/pick N chooses the column)."
                                               if last.is_comparison else "."), "error")
        return
    if last.is_comparison:
        await _continue_column(ctx, last, reply)
        return
    reply.settings = state.settings  # e.g. a larger max_tokens set after a cut-off
    ctx.start_reply(last, prefix=prefix_of(reply))


async def _continue_column(ctx: CommandContext, group: Entry, reply: Reply) -> None:
    """/continue on a comparison: its chosen column (★: /pick N, F6 or a click on its header)
    goes on as a new alternative to the comparison (‹ ›), with that column's own settings and
    the max_tokens in force; the comparison stays as it was. (The columns cannot go on
    together: one request has one prefix for all its rows.)"""
    settings = dataclasses.replace(reply.settings,
                                   max_new_tokens=ctx.state.settings.max_new_tokens)
    new = Reply(settings, text=reply.text, tokens=reply.tokens.copy(),
                usage=reply.usage)  # (the continuation's joins it: recorder.joined_usage)
    entry = ctx.state.conversation.add_sibling(group, Entry("assistant", replies=[new]))
    await ctx.sync_path()
    ctx.notify(f"Continuing column {group.chosen + 1} as a new alternative to the "
               "comparison (‹ › goes back to it).", timeout=3)
    ctx.start_reply(entry, prefix=prefix_of(new), branch_of=group)


async def cmd_logprobs(ctx: CommandContext, arg: str = "") -> None:
    ctx.toggle_token_mode()


async def cmd_score(ctx: CommandContext, arg: str = "") -> None:
    """Score a message under the model: the last user message, message N of the
    conversation (1 = the first; replies count too), the system prompt (``system``), or any
    other text typed after it (as ``chatui score -p TEXT``; it said "There is no message to
    score" or asked for a number)."""
    state = ctx.state
    if state.generating:
        ctx.notice("A reply is still being generated; /score it after it ends.", "error")
        return
    entries = state.conversation.entries
    arg = arg.strip()
    if arg == "system":
        text = state.conversation.system_prompt
        if not text:
            ctx.notice("There is no system prompt to score; /system TEXT sets one.", "error")
            return
        await _score_text(ctx, text, "the system prompt")
        return
    if arg and not arg.isdigit():
        await _score_text(ctx, probe_text(arg), "the text given")
        return
    if arg:
        if not 1 <= int(arg) <= len(entries):
            ctx.notice(f"/score takes a message number from 1 to {len(entries)}, 'system' or "
                       f"a text; there is no message {arg}."
                       if entries else f"There is no message {arg} to score (/score TEXT "
                       "scores a text).", "error")
            return
        entry = entries[int(arg) - 1]
        label = f"message {arg} ({entry.role})"
    else:
        entry = state.conversation.last_user
        if entry is None:
            ctx.notice("There is no message to score (/score TEXT scores a text).", "error")
            return
        label = f"message {entries.index(entry) + 1} (user)"
    if not entry.text:
        ctx.notice(f"{label.capitalize()} is empty: there is nothing to score.", "error")
        return
    await _score_text(ctx, entry.text, label)


async def _scored(ctx: CommandContext, request: ScoreRequest) -> Scored | None:
    """The worker's answer to ``request``; None after a failure (said in one sentence)."""
    scored: Scored | None = None
    async for group in ctx.services.worker.score(request):
        for ev in group:
            if isinstance(ev, Failed):
                ctx.notice(ev.message, "error")
                return None
            if isinstance(ev, Scored):
                scored = ev
    return scored


async def _score_text(ctx: CommandContext, text: str, label: str) -> None:
    scored = await _scored(ctx, ScoreRequest(text, ctx.state.top_logprobs))
    if scored is not None:
        ctx.show_score(label, scored)


def probe_text(arg: str) -> str:
    """The text ``/probe`` asks about (and ``/score TEXT`` scores): the argument as typed, or
    inside one pair of quotes (``/probe " Paris"``: a leading space is part of most tokens,
    and the prompt strips it)."""
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
        return arg[1:-1]
    return arg


def _pct(logprob: float) -> str:
    import math

    from .widgets.text import show_prob

    return show_prob(math.exp(logprob), 2)


def describe_probe(text: str, at: str, scored: Scored) -> str:
    """The notice ``/probe`` shows: the first token's probability and rank, and the whole
    text's probability over its tokens (a forced continuation)."""
    toks = [t for t in scored.tokens if t.logprob is not None]
    first = toks[0]
    rank = scored.ranks[scored.tokens.index(first)]
    line = (f"/probe {text!r} {at}: its first token {first.text or first.raw!r} "
            f"{_pct(first.logprob)}"  # type: ignore[arg-type]
            + (f" (rank {rank:,})" if rank is not None else ""))
    if len(toks) > 1:
        total = sum(t.logprob for t in toks)  # type: ignore[misc]
        parts = " · ".join(f"{t.text or t.raw!r} {_pct(t.logprob)}" for t in toks)  # type: ignore[arg-type]
        line += f"; the whole text, {len(toks)} tokens: {_pct(total)} ({parts})"
    return line + "."


async def cmd_probe(ctx: CommandContext, arg: str = "") -> None:
    """How likely the model found TEXT as the next token at the token view's cursor: the
    context is the reply's prompt and its tokens before the cursor; one forward over TEXT's
    tokens from there (the score path) gives each token's probability and rank."""
    state = ctx.state
    text = probe_text(arg)
    if not text:
        ctx.notice("/probe needs a text, e.g. /probe \" Paris\" (quotes keep its spaces).",
                   "error")
        return
    if state.generating:
        ctx.notice("A reply is still being generated; /probe after it ends.", "error")
        return
    point = ctx.probe_point()
    if point is None:
        ctx.notice("Put the token view's cursor on a token of a reply first (Ctrl+T, then "
                   "the arrow keys): /probe asks what the model thought there.", "error")
        return
    entry, reply, position = point
    ids = reply.tokens.ids()[:position]
    prefix = (AssistantPrefix(reply.tokens.text(0, position)) if any(i is None for i in ids)
              else AssistantPrefix(reply.tokens.text(0, position), ids,  # type: ignore[arg-type]
                                   spellings(reply.tokens, position + 1)))
    request = ScoreRequest(text, state.top_logprobs, context=state.messages_before(entry),
                           prefix=prefix)
    scored = await _scored(ctx, request)
    if scored is not None and scored.scored:
        ctx.notice(describe_probe(text, f"at token {position + 1} of the reply", scored))


async def cmd_raw_mode(ctx: CommandContext, arg: str = "") -> None:
    """Open raw mode's notebook (F4 there comes back)."""
    if ctx.state.generating:
        ctx.notice("A reply is still being generated; open raw mode after it ends.", "error")
        return
    ctx.open_notebook()


async def cmd_raw(ctx: CommandContext, arg: str = "") -> None:
    on = ctx.toggle_raw()
    ctx.notice("Raw token view " + ("on: special tokens and exact spellings are shown."
                                    if on else "off."))


NO_SWITCH = ("This model's chat template has no reasoning switch (enable_thinking), so /think "
             "changes nothing; /set reasoning_budget 0 ends its reasoning at once instead.")


async def cmd_think(ctx: CommandContext, arg: str = "") -> None:
    state = ctx.state
    word = arg.strip().lower()
    info = state.info
    if not word:
        now = {None: "as the template has it", True: "on", False: "off"}[state.thinking]
        ctx.notice(f"Reasoning: {now}."
                   + ("" if info is None or info.thinking_switch else " " + NO_SWITCH))
        return
    if word not in ("on", "off"):
        ctx.notice(f"/think takes on or off, not {arg.strip()!r}.", "error")
        return
    state.thinking = word == "on"
    if info is not None and not info.thinking_switch:
        ctx.notice(NO_SWITCH, "warning")
        return
    ctx.settings_changed()
    ctx.notice(f"Reasoning {word}: the next replies are asked to "
               f"{'reason first' if state.thinking else 'answer without reasoning'}.")


async def cmd_reasoning(ctx: CommandContext, arg: str = "") -> None:
    shown = ctx.toggle_reasoning()
    if shown is None:
        ctx.notice("The last reply has no reasoning to show.")


async def cmd_theme(ctx: CommandContext, arg: str = "") -> None:
    names = ctx.theme_names()
    if not arg:
        ctx.notice(f"Theme: {ctx.current_theme()}. Available: {', '.join(names)}")
        return
    if arg not in names:
        close = difflib.get_close_matches(arg, names, n=1, cutoff=0.4)
        hint = f" Did you mean {close[0]}?" if close else ""
        ctx.notice(f"Unknown theme {arg!r}.{hint} Available: {', '.join(names)}", "error")
        return
    ctx.set_theme(arg)


async def cmd_copy(ctx: CommandContext, arg: str = "") -> None:
    from .widgets.text import code_blocks

    last = ctx.state.conversation.last_assistant
    if last is None or not last.content:
        ctx.notice("There is no reply to copy yet.", "error")
        return
    text = last.content
    what = "the last reply"
    if arg.strip().lower() == "code":
        blocks = code_blocks(text)
        if not blocks:
            ctx.notice("The last reply has no code block.", "error")
            return
        text, what = blocks[-1], "the last code block"
    try:
        ctx.copy_to_clipboard(text)
    except Exception as exc:  # noqa: BLE001 - no clipboard is not an error worth dying for
        log.warning("copy failed: %s", exc)
        ctx.notice("Could not reach a clipboard; select the text with the mouse "
                   "(Shift+drag in most terminals) instead.", "error")
        return
    ctx.notify(f"Copied {what} ({len(text)} characters).")


# ---- transcripts ----

def _with_model(ctx: CommandContext, conv: Conversation) -> Conversation:
    ref = ctx.services.model_ref
    if ref is not None and not conv.model.name:
        conv.model = ref
    return conv


def _same_place(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def save_target(arg: str) -> Path | None:
    """``/save [PATH]``'s file: None with no PATH (the conversation's own file); a PATH with
    no extension that is not a folder gets ``.json``, as ``/export`` gives its formats' ("/save
    notes" wrote a file named ``notes`` that nothing opens as JSON)."""
    arg = arg.strip()
    if not arg:
        return None
    return with_suffix_if_none(Path(arg).expanduser(), ".json")


def with_suffix_if_none(path: Path, suffix: str) -> Path:
    """``path`` with ``suffix`` added where it has no extension and is not a folder."""
    if not path.suffix and path.name and not path.is_dir():
        return path.with_name(path.name + suffix)
    return path


def load_target(arg: str) -> Path:
    """``/load PATH``'s file: PATH, or PATH.json where PATH has no extension and is not there
    but that is (what ``/save PATH`` wrote: :func:`save_target`)."""
    path = Path(arg).expanduser()
    if not path.suffix and path.name and not path.exists():
        saved = path.with_name(path.name + ".json")
        if saved.is_file():
            return saved
    return path


async def cmd_save(ctx: CommandContext, arg: str = "") -> None:
    from . import transcript

    conv = ctx.state.conversation
    if not conv.entries:
        ctx.notice("There is nothing to save yet.", "error")
        return
    _with_model(ctx, conv)
    folder = ctx.services.config.transcripts_dir()
    path = save_target(arg)
    try:
        if path is None or _same_place(path, folder or transcript.data_dir()):
            ctx.services.flush_autosaves()  # no older autosave may land after this one
            path = transcript.autosave(conv, folder)
        else:
            if path.is_dir():
                # a folder, as `/export` takes one: the conversation's own file name, there
                path = transcript.autosave_path(conv, path)
            transcript.save_transcript(conv, path)
    except transcript.TranscriptError as exc:
        ctx.notice(str(exc), "error")
        return
    ctx.notice(f"Saved to {path.absolute()}")  # (where, for a relative PATH)


async def cmd_history(ctx: CommandContext, arg: str = "") -> None:
    from . import transcript

    word, _, rest = arg.strip().partition(" ")
    if word.lower() in ("delete", "del", "rm", "remove"):
        await _delete_saved(ctx, rest.strip())
        return
    if word:
        await _search_saved(ctx, arg.strip())
        return
    ctx.services.flush_autosaves()
    history = ctx.state.history = transcript.list_transcripts(
        ctx.services.config.transcripts_dir())
    if not history:
        ctx.notice("No saved conversations yet.")
        return
    lines = ["Saved conversations (/load N opens one, /history delete N removes one):"]
    shown = history[:30]
    number = {s.id: i for i, s in enumerate(shown, 1)}
    from .widgets.text import messages_label, shorten

    for i, s in enumerate(shown, 1):
        # two short lines each, the details under the title (one long line wrapped back to
        # the notice's margin, under the numbers)
        when = datetime.datetime.fromtimestamp(s.updated).strftime("%Y-%m-%d %H:%M")
        if s.error:  # (the sentence, whole, wrapped back under the numbers; /load N says it)
            lines.append(f"{i:>3}. {when}  {shorten(Path(s.path).name, HISTORY_TITLE)}")
            lines.append(f"       {shorten('cannot be opened: ' + s.error, HISTORY_TITLE + 11)}")
            continue
        lines.append(f"{i:>3}. {when}  {shorten(s.title or '(untitled)', HISTORY_TITLE)}")
        what = f"{messages_label(s.messages)} · {s.model}"
        if s.parent:  # (a branch and its conversation share their title)
            what += f" · a branch of {number[s.parent]}" if s.parent in number else " · a branch"
        lines.append(f"       {what}")
    ctx.notice("\n".join(lines))


HISTORY_TITLE = 51
"""Characters of a title ``/history`` shows: its line then fits 80 columns (a notice there
has 74 cells; at 56 every long title wrapped its last two characters: seen in tmux)."""


async def cmd_find(ctx: CommandContext, arg: str = "") -> None:
    """``/find [WORDS]`` (Ctrl+F): the search box over every saved conversation."""
    ctx.services.flush_autosaves()
    ctx.open_history(arg.strip())


async def _search_saved(ctx: CommandContext, text: str) -> None:
    """``/history WORDS``: the saved conversations holding every word, numbered as /history
    numbers them (so /load N and /history delete N act on the results)."""
    from . import transcript
    from .transcript.search import search_transcripts
    from .widgets.text import messages_label, shorten, shorten_around

    ctx.services.flush_autosaves()
    directory = ctx.services.config.transcripts_dir()
    hits = await asyncio.to_thread(search_transcripts, text, directory)
    if not hits:
        ctx.notice(f"No saved conversation holds {text!r}.")
        return
    ctx.state.history = [
        transcript.TranscriptSummary(h.path, h.id, 0.0, h.updated, "", h.title, h.messages)
        for h in hits]
    lines = [f"Saved conversations with {text!r} (/load N opens one):"]
    for i, h in enumerate(hits, 1):
        # the listing's two lines (a whole title and snippet were one long line, wrapped back
        # under the numbers: seen in tmux), the words found kept in view on the second
        when = datetime.datetime.fromtimestamp(h.updated).strftime("%Y-%m-%d %H:%M")
        lines.append(f"{i:>3}. {when}  {shorten(h.title or '(untitled)', HISTORY_TITLE)}")
        what = f"{messages_label(h.messages)} · {h.where}: "
        lines.append(f"       {what}{shorten_around(h.snippet, HISTORY_TITLE + 11 - len(what))}")
    ctx.notice("\n".join(lines))


TRASH = "deleted"
"""The folder, inside the transcripts' folder, where ``/history delete`` moves a file: out of
the list, still on disk (nothing chatui does makes a saved conversation disappear)."""


async def _delete_saved(ctx: CommandContext, arg: str) -> None:
    """``/history delete N``: move the N-th listed conversation out of the history."""
    from . import transcript

    directory = ctx.services.config.transcripts_dir()
    if not arg.isdigit():
        ctx.notice("/history delete needs the number /history shows, e.g. /history delete 2.",
                   "error")
        return
    ctx.services.flush_autosaves()
    history = ctx.state.history or transcript.list_transcripts(directory)
    n = int(arg)
    listed = _listed(ctx, history, n)
    if listed is None:
        return
    path = Path(listed.path)
    if listed.id and listed.id == ctx.state.conversation.id:
        ctx.notice("That is the conversation open now; /clear it first, then delete it.",
                   "error")
        return
    trash = Path(directory if directory is not None else path.parent) / TRASH
    try:
        trash.mkdir(parents=True, exist_ok=True)
        target = trash / path.name
        path.replace(target)
    except OSError as exc:
        ctx.notice(f"Could not delete {path}: {exc.strerror or exc}.", "error")
        return
    # the other numbers keep meaning what the listing on screen shows (the list was read again,
    # and /load 5 then opened what had been number 6; seen in tmux)
    ctx.state.history = [None if i == n - 1 else s for i, s in enumerate(history)]
    ctx.notice(f"Deleted conversation {n} from the history (the file is kept in {trash}; "
               "/load a file there to bring it back).")


def _listed(ctx: CommandContext, history: list[Any], n: int) -> Any:
    """The conversation numbered ``n`` in the listing shown (``/load N``, ``/history delete
    N``); None, said in one sentence, when there is none or it was deleted since."""
    if not 1 <= n <= len(history):
        ctx.notice(f"There is no conversation {n}; /history lists them.", "error")
        return None
    if history[n - 1] is None:
        ctx.notice(f"Conversation {n} was deleted from the history; /history lists them "
                   "again.", "error")
    return history[n - 1]


async def cmd_load(ctx: CommandContext, arg: str) -> None:
    from . import transcript

    arg = arg.strip()
    state = ctx.state
    if arg.isdigit():
        if not state.history:
            ctx.services.flush_autosaves()
            state.history = transcript.list_transcripts(ctx.services.config.transcripts_dir())
        listed = _listed(ctx, state.history, int(arg))
        if listed is None:
            return
        path = listed.path
    else:
        path = load_target(arg)
    unsaved = await ctx.services.keep_conversation()  # kept before another opens
    if unsaved is not None:
        ctx.notice(unsaved, "error")
        return
    try:
        conv = await asyncio.to_thread(ctx.services.open_saved, path)
    except transcript.TranscriptError as exc:
        ctx.notice(str(exc), "error")
        return
    interrupted = conv.stop_unfinished()
    if conv.mode == "raw":  # a notebook's continuation: its text, in the notebook
        ctx.open_notebook(opened=conv)
        ctx.notice(f"Opened {path.absolute()} in raw mode's notebook (F4 comes back to this "
                   f"conversation, as it was).")
        return
    await ctx.show_conversation(conv)
    note = (" A reply was still streaming when it was saved: it is kept as stopped (/continue "
            "goes on with the last one)." if interrupted else "")
    home = transcript.autosave_path(conv, ctx.services.config.transcripts_dir())
    if conv.parent and not home.exists():  # a branch made just now (its file comes next save)
        note += (" Its conversation has gone on since this copy was saved, so it opens as a "
                 "branch: new messages go to a new file and the newer one stays as it is.")
    elif home.exists() and not same_file(home, path) \
            and len(conv.all_entries()) > len(conv.entries):
        note += (" It opens inside its conversation's tree: the messages saved since stay as "
                 "a branch (‹ › under a message, or /tree), and new ones are saved with them.")
    if conv.system_prompt:  # (shown nowhere else, and every reply heeds it)
        from .widgets.text import shorten

        note += f" Its system prompt: {shorten(conv.system_prompt, 200)}"
    ctx.notice(f"Loaded {path.absolute()} ({len(conv.entries)} messages).{note}")


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (False where either is missing)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


EXPORT_WORDS = {"md": "md", "markdown": "md", "messages": "messages", "json": "messages"}
"""The format words ``/export`` takes before its (optional) path."""


def export_target(arg: str) -> tuple[str, Path | None]:
    """``/export [md|messages] [PATH]`` as (format, path): a leading format word picks the
    format; without one, a ``.json`` path means messages, anything else Markdown. No path:
    a file named after the conversation in the current folder. A path with no extension that
    is not a folder gets the format's (``.md``, ``.json``): "/export html" or "/export notes"
    wrote Markdown into a file named ``html`` or ``notes`` that nothing opens as Markdown."""
    arg = arg.strip()
    word, _, rest = arg.partition(" ")
    if word.lower() in EXPORT_WORDS:
        fmt, raw = EXPORT_WORDS[word.lower()], rest.strip()
    else:
        fmt, raw = "", arg
    path = Path(raw).expanduser() if raw else None
    if not fmt:
        fmt = "messages" if path is not None and path.suffix.lower() == ".json" else "md"
    if path is not None:
        path = with_suffix_if_none(path, ".md" if fmt == "md" else ".json")
    return fmt, path


async def cmd_export(ctx: CommandContext, arg: str = "") -> None:
    from . import transcript

    if not ctx.state.conversation.entries:
        ctx.notice("There is nothing to export yet.", "error")
        return
    words = arg.split()
    all_branches = "--all" in words
    if all_branches:
        arg = " ".join(w for w in words if w != "--all")
    fmt, path = export_target(arg)
    try:
        written = transcript.export_to_file(ctx.state.conversation, fmt, path,
                                            all_branches=all_branches, keep_others=True)
    except transcript.TranscriptError as exc:
        ctx.notice(str(exc), "error")
        return
    ctx.notice(f"Exported to {written.absolute()}")  # (where, for a relative PATH)


# ---- the tree (issue 18) ----

async def cmd_sibling(ctx: CommandContext, arg: str = "") -> None:
    """``/sibling prev|next`` (Alt+Left/Right): another alternative of the last message that
    has several."""
    word = arg.strip().lower() or "next"
    if word not in ("prev", "previous", "next", "-1", "+1", "1"):
        ctx.notice(f"/sibling takes prev or next; got {arg.strip()!r}.", "error")
        return
    await ctx.step_sibling(-1 if word in ("prev", "previous", "-1") else +1)


async def cmd_tree(ctx: CommandContext, arg: str = "") -> None:
    ctx.open_tree()


FAN_OUT_MOST = 8
"""The most branches ``f`` decodes at once."""


async def cmd_fanout(ctx: CommandContext, arg: str = "") -> None:
    """``/fanout [K]``: how many alternatives ``f`` in the token view decodes (2 to 8, and no
    more than each token keeps: ``/fanout 8`` was taken with the default 5, and every ``f``
    then said the token had too few)."""
    arg = arg.strip()
    kept = ctx.state.top_logprobs
    most = min(FAN_OUT_MOST, kept)
    if arg:
        if not arg.isdigit() or not 2 <= int(arg) <= most:
            why = (f" (each token keeps its {kept} most likely alternatives; chatui "
                   f"--top-logprobs {FAN_OUT_MOST} keeps {FAN_OUT_MOST})"
                   if most < FAN_OUT_MOST else "")
            ctx.notice(f"/fanout takes a number of branches from 2 to {most}{why}; got "
                       f"{arg!r}." if most >= 2 else
                       f"Fan-out needs 2 alternatives a token or more, and each keeps {kept} "
                       f"here; start chatui with --top-logprobs {FAN_OUT_MOST}.", "error")
            return
        ctx.state.fan_k = int(arg)
    ctx.notice(f"Fan-out: f in the token view decodes the {ctx.state.fan_k} most likely "
               "tokens at the cursor as branches, side by side (/pick chooses one).")


async def cmd_delete(ctx: CommandContext, arg: str = "") -> None:
    """``/delete``: say what would go; ``/delete yes``: delete the alternative shown at the
    last message with alternatives, and everything after it (the one thing that removes a
    reply from the tree and, at the next save, from its file)."""
    state = ctx.state
    if state.generating:
        ctx.notice("A reply is still being generated: press Esc to stop it first.", "error")
        return
    conv = state.conversation
    path = conv.entries
    entry = next((e for e in reversed(path) if len(conv.siblings(e)) > 1), None)
    if entry is None:
        ctx.notice("Only an alternative can be deleted, and no message here has one; "
                   "/clear starts a new conversation (this one stays saved).", "error")
        return
    kids = conv.siblings(entry)
    n = sum(1 for _ in walk([entry]))
    what = (f"alternative {index_of(kids, entry) + 1} of {len(kids)} at message "
            f"{index_of(path, entry) + 1} ({n} message{'s' if n != 1 else ''} with what "
            "follows it)")
    if arg.strip().lower() not in ("yes", "y", "confirm"):
        ctx.notice(f"/delete yes deletes {what}, from the tree and its file; the other "
                   "alternatives stay.")
        return
    conv.delete(entry)
    if kids:
        conv.select(kids[-1])
    await ctx.sync_path(in_place=True)
    ctx.services.save_conversation()
    ctx.notice(f"Deleted {what}.")


# ---- compare mode (the compare flow does the work) ----

async def cmd_compare(ctx: CommandContext, arg: str = "") -> None:
    ctx.compare.command(arg)


async def cmd_pick(ctx: CommandContext, arg: str = "") -> None:
    ctx.compare.pick(arg)
