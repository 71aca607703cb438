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
