"""Slash commands: the registry, parsing, completion and "did you mean" suggestions.

Pure logic with no Textual import, so it is unit-tested on its own. :data:`COMMANDS` is the
one table of commands: name, synopsis, help and handler (:mod:`chatui.chat_commands`, each
taking a narrow context). The chat screen runs the handler of a parsed command; the help
screen, the command palette and the prompt's completion all read the same table.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from . import chat_commands as run
from .chat_commands import Handler


@dataclass(frozen=True)
class CommandSpec:
    """One slash command as the user sees it."""

    name: str
    """The word after the slash, e.g. ``"set"``."""
    help: str
    """One sentence for /help and the command palette."""
    args: str = ""
    """Argument synopsis for /help, e.g. ``"NAME VALUE"``; empty when it takes none."""
    needs_arg: bool = False
    """True when the command is useless without an argument."""
    key: str = ""
    """The key binding that does the same, shown in /help."""
    handler: Handler = field(compare=False, repr=False, kw_only=True)
    """What it does (given the chat's command context and the argument)."""


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("help", "Show commands and keys.", key="F1", handler=run.cmd_help),
    CommandSpec("clear", "Empty the conversation and the model's cache.",
                handler=run.cmd_clear),
    CommandSpec("exit", "Quit; the conversation is kept.", key="Ctrl+Q", handler=run.cmd_exit),
    CommandSpec("system", "Set the system prompt (no text: show it; /system none clears it).",
                args="TEXT",
                handler=run.cmd_system),
    CommandSpec("title", "Name the conversation, as /history, the search and exports show it "
                "(no text: show its name).", args="TEXT", handler=run.cmd_title),
    CommandSpec("set", "Change sampling settings, e.g. /set temperature 0.2, or several as "
                "the status line writes them: /set temp 0 max 64 (/set stop none clears the "
                "stop strings); kept for the model's next chat, /set reset forgets them.",
                args="NAME VALUE", needs_arg=True, handler=run.cmd_set),
    CommandSpec("settings", "Show the sampling settings in force.", handler=run.cmd_settings),
    CommandSpec("retry", "Regenerate the last reply, or reply N of the conversation (the old "
                "one and what followed it are kept: ‹ ›).", args="[N]", key="Ctrl+R",
                handler=run.cmd_retry),
    CommandSpec("edit", "Put the last prompt, or your message N, back in the box: sending it "
                "adds the new text beside the old (‹ ›, what followed kept with the old); Esc "
                "leaves it as it was.", args="[N]", key="Ctrl+G", handler=run.cmd_edit),
    CommandSpec("continue", "Continue a reply that was stopped, failed, or was cut off by the "
                "length limit (a comparison: its picked column, as a new alternative).",
                key="Ctrl+O", handler=run.cmd_continue),
    CommandSpec("logprobs", "Toggle the token view (per-token probabilities).", key="Ctrl+T",
                handler=run.cmd_logprobs),
    CommandSpec("score", "Score the last user message (or message N, the system prompt, or a "
                "text) under the model: its tokens coloured by their own probability, its "
                "perplexity and least likely tokens.", args="[N|system|TEXT]",
                handler=run.cmd_score),
    CommandSpec("raw-mode", "Open raw mode: a notebook whose text the model continues in place "
                "as plain text (no chat template), for base models; F4 comes back.",
                handler=run.cmd_raw_mode),
    CommandSpec("probe", "The probability that the next token at the token view's cursor "
                "would be TEXT: its first token's probability and rank, and the whole text's "
                "over its tokens (quotes keep spaces: /probe \" Paris\").", args="TEXT",
                needs_arg=True, handler=run.cmd_probe),
    CommandSpec("raw", "Toggle the raw token view (special tokens, exact spellings).",
                handler=run.cmd_raw),
    CommandSpec("think", "Turn the model's reasoning on or off through its chat template's "
                "switch (enable_thinking); no argument: show it.", args="on|off",
                handler=run.cmd_think),
    CommandSpec("reasoning", "Unfold or fold the last reply's reasoning block.", key="F4",
                handler=run.cmd_reasoning),
    CommandSpec("theme", "Switch the theme (no name: list themes).", args="NAME",
                handler=run.cmd_theme),
    CommandSpec("copy", "Copy the last reply (/copy code: its last code block).",
                args="[code]", key="F2/F3", handler=run.cmd_copy),
    CommandSpec("save", "Save the conversation (optionally to PATH).", args="[PATH]",
                key="Ctrl+S", handler=run.cmd_save),
    CommandSpec("load", "Load a saved conversation (PATH or number from /history); a "
                "role/content messages JSON opens too.",
                args="PATH|N", needs_arg=True, handler=run.cmd_load),
    CommandSpec("find", "Search box over saved conversations; Enter opens one.",
                args="[WORDS]", key="Ctrl+F", handler=run.cmd_find),
    CommandSpec("history", "List saved conversations, search them, delete one.",
                args="[WORDS | delete N]", handler=run.cmd_history),
    CommandSpec("export", "Export to Markdown or messages JSON (by the word, or by a .json "
                "PATH); no PATH: a file named after the conversation here; --all: every "
                "branch (Markdown). A file at PATH is replaced only by an export of this "
                "conversation.",
                args="[md|messages] [--all] [PATH]", handler=run.cmd_export),
    CommandSpec("compare", "Answer the next prompt with 2-6 settings side by side; no "
                "argument: the compare screen.", args="A | B ...|PRESET|off",
                handler=run.cmd_compare),
    CommandSpec("pick", "Continue with column N of the last comparison.", args="N",
                needs_arg=True, key="F6: next", handler=run.cmd_pick),
    CommandSpec("sibling", "Show the previous or next alternative of the last message that "
                "has several (‹ 2/3 ›); the conversation below follows it.",
                args="prev|next", key="Alt+Left / Alt+Right", handler=run.cmd_sibling),
    CommandSpec("tree", "The whole conversation as a tree of branches; Enter opens one.",
                key="F5", handler=run.cmd_tree),
    CommandSpec("fanout", "Set how many alternatives (2-8, default 3; at most the 5 a "
                "token keeps unless chatui --top-logprobs N) f in the token view decodes as "
                "branches in one batch, side by side.", args="[K]",
                key="f (token view)", handler=run.cmd_fanout),
    CommandSpec("delete", "Delete the alternative shown (and what follows it) from the tree "
                "and its file: /delete says what, /delete yes does it.", args="[yes]",
                handler=run.cmd_delete),
)

BY_NAME: dict[str, CommandSpec] = {c.name: c for c in COMMANDS}

# Other spellings people type out of habit (ollama, llama.cpp, transformers chat).
ALIASES: dict[str, str] = {"quit": "exit", "q": "exit", "bye": "exit", "reset": "clear",
                           "new": "clear", "regen": "retry", "regenerate": "retry",
                           "cont": "continue", "tokens": "logprobs", "h": "help", "?": "help"}


@dataclass(frozen=True)
class ParsedCommand:
    """A slash command the user typed, resolved to its spec."""

    spec: CommandSpec
    arg: str
    """Everything after the command word, stripped."""

    @property
    def name(self) -> str:
        return self.spec.name


class CommandError(ValueError):
    """The text is not a known command; the message says so and suggests the nearest one."""

    def __init__(self, message: str, suggestion: str | None = None) -> None:
        super().__init__(message)
        self.suggestion = suggestion


def is_command(text: str) -> bool:
    """True when the prompt text is a slash command, not a message for the model.

    ``//text`` escapes a message that starts with a slash; a lone path like ``/usr/bin`` on one
    line is still treated as a command (and reported as unknown), which is the safer mistake.
    """
    stripped = text.lstrip()
    return stripped.startswith("/") and not stripped.startswith("//")


def command_after_draft(text: str, draft: str | None) -> str | None:
    """The known slash command typed straight after ``draft``, the message left unsent when
    chatui last ended and put back in the box (``"a draft about whales/history"``: the user
    typed a command without seeing the box was not empty, and Enter sent both to the model;
    seen in tmux), or None: a message to send as it is."""
    if not draft or not text.startswith(draft):
        return None
    rest = text[len(draft):].strip()
    if "\n" in rest or not is_command(rest):
        return None
    word = (rest[1:].split() or [""])[0].lower()
    return rest if ALIASES.get(word, word) in BY_NAME else None  # (its errors: its own)


def unescape(text: str) -> str:
    """The message to send for text that starts with ``//`` (one slash removed)."""
    stripped = text.lstrip()
    return stripped[1:] if stripped.startswith("//") else text


def nearest(word: str) -> str | None:
    """The known command nearest to ``word`` (by prefix, then edit similarity), or None."""
    word = word.lower()
    names = [c.name for c in COMMANDS]
    prefixed = [n for n in names if n.startswith(word)] if word else []
    if prefixed:
        return prefixed[0]
    close = difflib.get_close_matches(word, names + list(ALIASES), n=1, cutoff=0.5)
    if not close:
        return None
    return ALIASES.get(close[0], close[0])


def parse(text: str) -> ParsedCommand:
    """Resolve ``"/set temperature 0.2"`` to its spec and argument.

    Raises:
        CommandError: unknown command (with the nearest one as a suggestion) or a missing
            argument.
    """
    stripped = text.strip()
    if not stripped.startswith("/"):
        raise CommandError("commands start with '/'")
    parts = stripped[1:].split(None, 1)
    word = parts[0] if parts else ""
    arg = parts[1] if len(parts) > 1 else ""
    key = word.lower()
    key = ALIASES.get(key, key)
    spec = BY_NAME.get(key)
    if spec is None:
        hint = nearest(word)
        msg = f"Unknown command /{word}."
        if hint:
            msg += f" Did you mean /{hint}?"
        msg += " Type /help for the list."
        raise CommandError(msg, hint)
    arg = arg.strip()
    if spec.needs_arg and not arg:
        raise CommandError(f"/{spec.name} needs {spec.args}: {spec.help}")
    return ParsedCommand(spec, arg)


def completions(text: str, extra: dict[str, list[str]] | None = None) -> list[str]:
    """Full prompt texts that complete ``text`` (for the suggester), best first.

    Args:
        text: what the user has typed so far (``"/se"``, ``"/theme ch"``).
        extra: argument candidates per command name (``{"theme": [...], "set": [...]}``).
    """
    if not text.startswith("/") or "\n" in text:
        return []
    word, space, arg = text[1:].partition(" ")
    if not space:
        return [f"/{c.name}" + (" " if c.args else "") for c in COMMANDS
                if c.name.startswith(word.lower()) and c.name != word.lower()] if word else []
    candidates = (extra or {}).get(word.lower(), [])
    return [f"/{word} {c}" for c in candidates if c.startswith(arg) and c != arg]


def help_rows() -> list[tuple[str, str, str]]:
    """(usage, key, help) rows for the help screen."""
    return [(f"/{c.name}" + (f" {c.args}" if c.args else ""), c.key, c.help) for c in COMMANDS]


def hint_text(text: str) -> str:
    """The line under the prompt while a command is typed: the matching commands (their
    synopsis and help when one is left), or the nearest one to an unknown word."""
    word = text[1:].split(" ", 1)[0].lower()
    if " " in text:
        spec = BY_NAME.get(ALIASES.get(word, word))
        rows = [spec] if spec else []
    else:
        rows = [c for c in COMMANDS if c.name.startswith(word)]
    if not rows:
        near = nearest(word)
        return f"unknown command /{word}" + (f" — did you mean /{near}?" if near else "")
    return "   ".join(
        f"/{c.name}{' ' + c.args if c.args else ''} — {c.help}" if len(rows) == 1
        else f"/{c.name}" for c in rows[:12]) + "   (Tab completes)"
