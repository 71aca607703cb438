"""Slash command parsing, completion and suggestions (pure logic)."""

import pytest

from chatui import commands
from chatui.commands import CommandError, completions, is_command, nearest, parse


def test_parse_resolves_command_and_argument():
    cmd = parse("/set temperature 0.2")
    assert cmd.name == "set" and cmd.arg == "temperature 0.2"
    assert parse("  /HELP ").name == "help"
    assert parse("/system be brief\nand kind").arg == "be brief\nand kind"


def test_aliases():
    assert parse("/quit").name == "exit"
    assert parse("/regen").name == "retry"


def test_unknown_command_suggests_nearest():
    with pytest.raises(CommandError) as err:
        parse("/clera")
    assert err.value.suggestion == "clear"
    assert "Did you mean /clear?" in str(err.value)
    with pytest.raises(CommandError) as err:
        parse("/zzzzzz")
    assert err.value.suggestion is None and "Unknown command /zzzzzz." in str(err.value)


def test_missing_argument_is_an_error():
    with pytest.raises(CommandError, match="needs NAME VALUE"):
        parse("/set")


def test_nearest_prefers_prefix():
    assert nearest("con") == "continue"
    assert nearest("sett") == "settings"
    assert nearest("exti") == "exit"


def test_is_command_and_escape():
    assert is_command("/help") and is_command("  /x")
    assert not is_command("hello /help") and not is_command("//not a command")
    assert commands.unescape("//etc/hosts is a file") == "/etc/hosts is a file"


def test_completions():
    assert completions("/se") == ["/set ", "/settings"]
    assert completions("/theme ch", {"theme": ["chatui-dark", "chatui-light", "nord"]}) == [
        "/theme chatui-dark", "/theme chatui-light"]
    assert completions("hello") == [] and completions("/") == []


def test_help_rows_cover_every_command():
    rows = commands.help_rows()
    assert len(rows) == len(commands.COMMANDS)
    assert any(r[0] == "/set NAME VALUE" for r in rows)


def test_help_never_runs_a_key_into_its_description():
    """Every help line keeps at least two spaces between its command, its key and its text,
    however long they are (it showed "Alt+Left / Alt+RightShow the previous ...")."""
    import re

    from chatui.screens.help import KEYS, help_text

    lines = help_text().plain.splitlines()
    for usage, key, text in commands.help_rows():
        line = next(ln for ln in lines if ln.startswith(f"  {usage} "))
        cells = [re.escape(usage)] + ([re.escape(key)] if key else []) + [re.escape(text)]
        assert re.fullmatch(r"  " + r" {2,}".join(cells), line), line
    for key, text in KEYS:
        line = next(ln for ln in lines if ln.startswith(f"  {key} "))
        assert re.fullmatch(rf"  {re.escape(key)} {{2,}}{re.escape(text)}", line), line


def test_help_descriptions_begin_in_one_column():
    """At the help box's width every command's description begins in the same column, on the
    command's line or, where the command or its key is longer than its cell, on the next (one
    began 15 columns right of the others: "/sibling prev|next  Alt+Left / Alt+Right  Show
    ...", seen in tmux)."""
    from chatui.screens.help import help_text

    lines = help_text(92).plain.splitlines()
    columns = set()
    for usage, key, text in commands.help_rows():
        i = next(i for i, ln in enumerate(lines) if f"{ln} ".startswith(f"  {usage} "))
        first = text.split()[0]
        line = lines[i] if first in lines[i][2 + len(usage) + len(key):] else lines[i + 1]
        columns.add(line.index(first, 2 + len(usage) + len(key) if line is lines[i] else 0))
    assert columns == {36}


@pytest.mark.parametrize("width", [60, 92])
def test_help_wraps_a_description_under_itself(width):
    """At the page's width every row fits, and a description's wrapped words go on under its
    first word (or all below a long key, indented), never back at the page's left edge under
    the command names ("(/set stop none clears the stop strings)." began in column 0 of the
    help box)."""
    from chatui.screens.help import KEYS, help_text

    lines = help_text(width).plain.splitlines()
    assert all(len(line) <= width for line in lines)
    rows = [(u, k, t) for u, k, t in commands.help_rows()] + [(k, "", t) for k, t in KEYS]
    wrapped = 0
    for usage, key, text in rows:
        i = next(i for i, ln in enumerate(lines) if f"{ln} ".startswith(f"  {usage} "))
        head = lines[i][2 + len(usage):].strip()
        head = head[len(key):].strip() if key else head
        words, column = head.split(), (lines[i].index(head) if head else None)
        while i + 1 < len(lines) and lines[i + 1].startswith("   "):
            i += 1
            wrapped += 1
            indent = len(lines[i]) - len(lines[i].lstrip())
            column = indent if column is None else column
            assert indent == column >= 6, lines[i]
            words += lines[i].split()
        assert words == text.split(), usage
    assert wrapped  # (some descriptions are longer than these widths)
