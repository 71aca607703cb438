"""The CLI's shared option groups, in process: each flag defined once and the same in every
command, the chat handed what its flags say (its window replaced by a stand-in)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from chatui.cli import app
from chatui.cli.options import (ModelOptions, PromptOptions, SamplingOptions, ServerOptions,
                                UserError, backend_options)
from chatui.config import AppConfig
from inference.settings import SettingsError

GROUPS = (ModelOptions, ServerOptions, SamplingOptions, PromptOptions)


def _flags_of(command_name: str | None) -> list[str]:
    group = typer.main.get_command(app)
    command = group if command_name is None else group.commands[command_name]  # type: ignore[attr-defined]
    return [opt for p in command.params for opt in p.opts]


@pytest.mark.parametrize("command", [None, "generate", "batch", "compare", "bench"])
def test_each_flag_appears_once_per_command(command):
    flags = _flags_of(command)
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)


def test_a_group_has_the_same_flags_and_help_everywhere():
    group = typer.main.get_command(app)
    seen: dict[str, tuple[str, ...]] = {}
    for command in [group, *group.commands.values()]:  # type: ignore[attr-defined]
        for p in command.params:
            key = max(p.opts, key=len)
            shown = (p.help or "", repr(p.default))
            if key in ("--top-logprobs", "--system", "--json", "--output", "--prompt", "--raw",
                       "--batch"):
                continue  # per-command defaults or meanings (score's --prompt is the text scored; batch --raw continues lines; --batch: rows decoded together, 1 in bench, 32 in batch)
            assert seen.setdefault(key, shown) == shown, (command.name, key)


def test_sampling_flags_become_setting_overrides():
    s = SamplingOptions(temperature=0.5, top_k=3, max_tokens=7, stop=["a,b", "\\n\\n"])
    assert s.overrides() == {"temperature": 0.5, "top_k": 3, "max_tokens": 7,
                             "stop": ("a,b", "\n\n")}
    assert SamplingOptions().overrides() == {}
    with pytest.raises(SettingsError, match="top_p must be in"):
        SamplingOptions(top_p=2.0)


def test_backend_options_refuse_flags_the_backend_would_ignore():
    local = backend_options(ModelOptions(ckpt="/m", quantize="int8"), ServerOptions())
    assert (local.backend, local.ckpt, local.quantize) == ("local", "/m", "int8")
    with pytest.raises(UserError, match="--ckpt, --device applies to --backend local only"):
        backend_options(ModelOptions(ckpt="/m", device="cpu"), ServerOptions(backend="scripted"))
    with pytest.raises(UserError, match="--api-key-env applies to --backend openai only"):
        ServerOptions(api_key_env="KEY")
    remote = backend_options(ModelOptions(), ServerOptions(backend="openai", base_url="http://h"))
    assert (remote.backend, remote.base_url) == ("openai", "http://h")


def test_prompt_options_read_a_file_and_refuse_ambiguity(tmp_path: Path):
    f = tmp_path / "p.txt"
    f.write_text("from a file\n")
    assert PromptOptions(prompt_file=f).text() == "from a file"  # (the file's line break)
    assert PromptOptions(prompt="typed").text() == "typed"
    for bad in (dict(), dict(prompt=""), dict(prompt="x", prompt_file=f)):
        with pytest.raises(UserError):
            PromptOptions(**bad)


def test_groups_are_frozen():
    for group in GROUPS:
        assert dataclasses.fields(group) and group.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.fixture
def opened(monkeypatch) -> list[AppConfig]:
    """The configs the chat would open with (the window is not opened)."""
    import chatui.app

    configs: list[AppConfig] = []

    def fake_run_chat(factory: Any, config: AppConfig) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(chatui.app, "run_chat", fake_run_chat)
    monkeypatch.setattr("chatui.cli.commands.no_terminal", lambda: None)  # (CliRunner has none)
    return configs


def test_the_chat_gets_its_flags(opened, tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path))
    r = CliRunner().invoke(app, ["--backend", "scripted", "--temperature", "0.3", "--stop", "END",
                                 "--stop", "x,y", "--theme", "chatui-light", "--system", "Be brief.",
                                 "--top-logprobs", "7"])
    assert r.exit_code == 0, r.output
    [config] = opened
    assert dict(config.settings_overrides) == {"temperature": 0.3, "stop": ("END", "x,y")}
    assert (config.theme, config.system_prompt, config.top_logprobs) == (
        "chatui-light", "Be brief.", 7)


def test_the_chat_refuses_system_with_load(opened, tmp_path):
    from chatui.conversation import Conversation
    from chatui.transcript import save_transcript

    conv = Conversation()
    conv.add_user("hi")
    save_transcript(conv, tmp_path / "c.json")
    r = CliRunner().invoke(app, ["--backend", "scripted", "--load", str(tmp_path / "c.json"),
                                 "--system", "new"])
    assert r.exit_code == 2 and "--system applies to a new conversation" in r.output
    assert opened == []
    r = CliRunner().invoke(app, ["--backend", "scripted", "--load", str(tmp_path / "c.json")])
    assert r.exit_code == 0 and opened[0].load_path == tmp_path / "c.json"


def test_resume_opens_the_conversation_saved_last(opened, tmp_path, monkeypatch):
    """``--resume`` opens the newest transcript that loads (a damaged newer one is passed
    over), and says in one sentence why it cannot when there is none or --load is given too."""
    import os

    from chatui.conversation import Conversation
    from chatui.transcript import save_transcript

    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path))
    r = CliRunner().invoke(app, ["--backend", "scripted", "--resume"])
    assert r.exit_code == 2 and "no saved conversation to resume" in r.output, r.output
    for i, name in enumerate(["old", "new"]):
        conv = Conversation()
        conv.add_user(name)
        save_transcript(conv, tmp_path / f"{name}.json")
        os.utime(tmp_path / f"{name}.json", (1000 + i, 1000 + i))
    r = CliRunner().invoke(app, ["--backend", "scripted", "--resume"])
    assert r.exit_code == 0 and opened[-1].load_path == tmp_path / "new.json", r.output
    os.utime(tmp_path / "old.json", (2000, 2000))  # saved again since
    (tmp_path / "broken.json").write_text("{not json")  # newest of all, and damaged
    r = CliRunner().invoke(app, ["--backend", "scripted", "--resume"])
    assert r.exit_code == 0 and opened[-1].load_path == tmp_path / "old.json", r.output
    r = CliRunner().invoke(app, ["--backend", "scripted", "--resume", "--load",
                                 str(tmp_path / "new.json")])
    assert r.exit_code == 2 and "give one of them" in r.output
    r = CliRunner().invoke(app, ["--backend", "scripted", "--resume", "--system", "x"])
    assert r.exit_code == 2 and "--system applies to a new conversation" in r.output
    assert len(opened) == 2


def test_a_plain_chat_checks_its_model_flags_without_importing_torch():
    """The UI process stays free of torch (about 1.3 s and 180 MB, the model loads in the
    engine's process): a plain chat, --device cpu and --dtype are checked without it; only a
    GPU device needs torch to be checked."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from chatui.backends import BackendOptions\n"
            "from chatui.cli.headless import check_local_spec\n"
            "check_local_spec(BackendOptions())\n"
            "print('torch' in sys.modules)\n"
            "check_local_spec(BackendOptions(device='cpu', dtype='bf16'))\n"
            "print('torch' in sys.modules)\n"
            "try:\n"
            "    check_local_spec(BackendOptions(device='cuda:7'))\n"
            "except BaseException:\n"
            "    pass\n"
            "print('torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["False", "False", "True"], r.stderr


async def test_bench_errors_raised_for_the_user_become_one_sentence():
    """An ``...Error`` class of inference.bench (the engine's own refusal) is the user's
    sentence; anything else is a bug and stays an exception."""
    from chatui.cli.commands import _bench_call

    class BenchError(Exception):
        pass

    BenchError.__module__ = "inference.bench"

    class Worker:
        def __init__(self, exc: Exception) -> None:
            self.exc = exc

        async def call(self, fn: Any) -> Any:
            raise self.exc

    kw = dict(prompt_tokens=8, new_tokens=2, batch=1, top_logprobs=0, vs_hf=False, repeats=1)
    with pytest.raises(UserError, match="the prompt is longer than the context"):
        await _bench_call(Worker(BenchError("the prompt is longer than the context")),  # type: ignore[arg-type]
                          False, **kw)
    with pytest.raises(KeyError):
        await _bench_call(Worker(KeyError("a bug")), True, **kw)  # type: ignore[arg-type]


def test_load_takes_the_number_history_shows(opened, tmp_path, monkeypatch):
    """``--load N`` opens the N-th conversation as ``/history`` and ``chatui history`` number
    them (newest first), unless a file of that name is here; a number past the list is
    refused in one sentence. Plain ``chatui history`` lists them (it printed its help). Seen in
    tmux: ``chatui --load 1`` said only "no such transcript: 1"."""
    import os

    from chatui.conversation import Conversation
    from chatui.transcript import save_transcript

    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path))
    empty = CliRunner().invoke(app, ["history"])  # says so, on standard error
    assert empty.exit_code == 0 and empty.stdout == "", empty.output
    assert empty.stderr == f"no saved conversations in {tmp_path}\n", empty.output
    for i, name in enumerate(["old", "new"]):
        conv = Conversation()
        conv.add_user(name)
        save_transcript(conv, tmp_path / f"{name}.json")
        os.utime(tmp_path / f"{name}.json", (1000 + i, 1000 + i))
    listed = CliRunner().invoke(app, ["history"])
    assert listed.exit_code == 0, listed.output
    assert listed.output.splitlines()[0] == f"1. {tmp_path / 'new.json'}", listed.output
    assert f"2. {tmp_path / 'old.json'}" in listed.output
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "elsewhere"))
    assert CliRunner().invoke(app, ["history", "--dir", str(tmp_path)]).output == listed.output
    r = CliRunner().invoke(app, ["history", "--dir", str(tmp_path), "list"])
    assert r.exit_code == 2 and "chatui history list --dir D" in r.output, r.output
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path))
    for n, name in (("1", "new"), ("2", "old")):
        r = CliRunner().invoke(app, ["--backend", "scripted", "--load", n])
        assert r.exit_code == 0 and opened[-1].load_path == tmp_path / f"{name}.json", r.output
    r = CliRunner().invoke(app, ["--backend", "scripted", "--load", "3"])
    assert r.exit_code == 2 and "there is no conversation 3 in the history (2 saved" in r.output
    monkeypatch.chdir(tmp_path)
    save_transcript(Conversation(), tmp_path / "2")  # a file named 2 is that file
    r = CliRunner().invoke(app, ["--backend", "scripted", "--load", "2"])
    assert r.exit_code == 0 and opened[-1].load_path == Path("2"), r.output
    assert len(opened) == 3


def test_only_the_chat_takes_ctrl_q_and_ctrl_s_from_the_terminal_driver():
    """``tty_flow`` clears the terminal's IXON for the chat alone: a headless command keeps
    Ctrl+S / Ctrl+Q pausing and resuming what it prints; help and the version print and end."""
    from chatui.cli.commands import command_names, opens_the_chat

    assert {"generate", "bench", "history", "build-kernels"} <= command_names()
    assert opens_the_chat([]) and opens_the_chat(["--ckpt", "/models/x", "--theme", "nord"])
    for args in (["generate", "Hi"], ["--ckpt", "x", "bench"], ["history", "search", "a"],
                 ["build-kernels"], ["--help"], ["--version"]):
        assert not opens_the_chat(args), args


def test_flow_keys_are_left_alone_where_standard_input_is_no_terminal(monkeypatch):
    import io

    from chatui import tty_flow

    monkeypatch.setattr("sys.__stdin__", io.StringIO("piped"))
    assert tty_flow.keep_flow_keys() is False
