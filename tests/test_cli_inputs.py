"""The CLI refuses what a user can get wrong with one sentence and exit code 2 before anything
starts, and each command does what the README says (issue 14, sections 3 and 4). Real
subprocesses, as a user runs them; ``--backend scripted`` where no model is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def chatui(*args: str, timeout: float = 120, cwd: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m chatui ARGS`` with no terminal: a command that opened the chat instead
    of refusing would fail on the timeout rather than hang the suite."""
    return subprocess.run([sys.executable, "-m", "chatui", *args], capture_output=True,
                          text=True, timeout=timeout, env={**ENV, **(env or {})},
                          stdin=subprocess.DEVNULL, cwd=cwd)


def refused(r: subprocess.CompletedProcess, words: str) -> bool:
    """Exit code 2, the words in one line on stderr, no traceback, nothing on stdout."""
    lines = r.stderr.strip().splitlines()
    return (r.returncode == 2 and len(lines) == 1 and words in lines[0]
            and lines[0].startswith("chatui: ") and "Traceback" not in r.stderr
            and r.stdout == "")


@pytest.fixture
def binary_file(tmp_path: Path) -> Path:
    path = tmp_path / "image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    return path


@pytest.fixture
def latin1_file(tmp_path: Path) -> Path:
    path = tmp_path / "latin1.txt"
    path.write_bytes("un café\nà la crème\n".encode("latin-1"))
    return path


# ---- section 3: one sentence instead of a traceback or a hang ----


def test_bench_over_the_context_is_refused(tiny_model_dir: Path):
    r = chatui("bench", "--ckpt", str(tiny_model_dir), "--prompt-tokens", "600",
               "--new-tokens", "8")  # the tiny model's context is 512 tokens
    assert refused(r, "exceed the model's context of 512 tokens"), r.stderr


@pytest.mark.parametrize("command", [
    ["batch", "--backend", "scripted", "--input-file"],
    ["generate", "--backend", "scripted", "--prompt-file"],
    ["compare", "--backend", "scripted", "--setting", "temperature=0", "--prompt-file"],
])
def test_binary_and_non_utf8_inputs_are_refused_alike(command, binary_file, latin1_file):
    r = chatui(*command, str(binary_file))
    assert refused(r, f"{binary_file} is a binary file, not text"), r.stderr
    r = chatui(*command, str(latin1_file))
    assert refused(r, f"{latin1_file} is not UTF-8 text"), r.stderr


def test_input_file_with_a_byte_order_mark_reads_its_first_line(tmp_path: Path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffhello\n".encode("utf-8"))
    r = chatui("batch", "--backend", "scripted", "--max-tokens", "2", "--input-file", str(path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["prompt"] == "hello"


@pytest.mark.parametrize("args, words", [
    (["--ckpt", "/nonexistent/model"], "No such file or directory: /nonexistent/model"),
    (["--device", "cuda:99"], "'cuda:99'"),  # refused with or without a GPU
    (["--dtype", "float8"], "Unknown dtype 'float8'"),
    (["--ckpt", ""], "--ckpt is empty"),
    (["--theme", "nope"], "unknown theme 'nope'; choose one of: "),
    (["--top-logprobs", "21"], "--top-logprobs must be between 0 and 20"),
    (["--temperature", "-1"], "temperature must be between 0 and 100"),
    (["--stop", ""], "stop must be a list of non-empty strings"),
    (["--load", "/no/such/chat.json"], "no such transcript: /no/such/chat.json"),
    (["--backend", "scripted", "--ckpt", "x"], "--ckpt applies to --backend local only"),
])
def test_the_chat_refuses_before_its_window_opens(args, words):
    assert refused(chatui(*args, timeout=60), words)


def test_the_chat_refuses_a_checkpoint_that_cannot_load(tmp_path: Path):
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hello")
    assert refused(chatui("--ckpt", str(not_a_model), timeout=60), "is a file, not a checkpoint")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    assert refused(chatui("--ckpt", str(tmp_path / "broken"), timeout=60), "not valid JSON")
    assert refused(chatui("--ckpt", "nobody/no-such-model", timeout=60),
                   "is not in the Hugging Face cache")


def test_the_theme_error_lists_the_themes():
    r = chatui("--theme", "nope")
    assert "chatui-dark" in r.stderr and "chatui-light" in r.stderr and "textual-dark" in r.stderr


def test_the_chat_refuses_a_transcript_that_does_not_load(tmp_path: Path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = chatui("--load", str(bad), timeout=60)
    assert r.returncode == 2 and str(bad) in r.stderr and "Traceback" not in r.stderr


# ---- section 4: commands do what the README says ----


def test_export_into_a_folder_says_the_real_path(tmp_path: Path):
    from chatui.conversation import Conversation
    from chatui.transcript import save_transcript

    conv = Conversation()
    conv.add_user("hello there")
    saved = tmp_path / "chat.json"
    save_transcript(conv, saved)
    out = tmp_path / "exports"
    out.mkdir()
    r = chatui("export", str(saved), "--output", str(out), "--format", "md")
    assert r.returncode == 0, r.stderr
    [written] = list(out.iterdir())
    assert written.suffix == ".md" and "hello there" in written.read_text()
    assert r.stderr.strip() == f"wrote {written}"


def test_export_takes_a_conversations_number_as_load_does(tmp_path: Path):
    """`chatui export N` exports the N-th of `chatui history` (it said "Could not load 1: no
    such file or directory" where `--load 1` opened it); a number past the list is refused."""
    from chatui.conversation import Conversation
    from chatui.transcript import autosave

    for words in ("older words", "newer words"):
        conv = Conversation()
        conv.add_user(words)
        autosave(conv, tmp_path)
        time.sleep(0.05)  # (newest first: the files' times decide)
    env = {"CHATUI_DATA_DIR": str(tmp_path)}
    r = chatui("export", "1", "--format", "messages", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["content"] == "newer words"
    r = chatui("export", "3", env=env)
    assert refused(r, "there is no conversation 3 in the history (2 saved")


def test_batch_keeps_each_reply_at_its_line(tmp_path: Path):
    path = tmp_path / "prompts.txt"
    path.write_text("first\n\n   \nsecond\nthird\n")
    r = chatui("batch", "--backend", "scripted", "--max-tokens", "3", "--input-file", str(path))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(x["index"], x["line"], x["prompt"]) for x in rows] == [
        (0, 1, "first"), (3, 4, "second"), (4, 5, "third")]


@pytest.mark.parametrize("args, words", [
    (["generate", "-p", ""], "the prompt given with -p is empty"),
    (["generate", "-p", "   "], "the prompt given with -p is empty"),
    (["compare", "-p", "", "--setting", "temperature=0"], "the prompt given with -p is empty"),
    (["generate", "-p", "hi", "--prompt-file", "README.md"], "not both"),
    (["compare", "-p", "hi", "--prompt-file", "README.md", "--setting", "temperature=0"],
     "not both"),
    (["generate", "-p", "hi", "--json", "--show-logprobs"], "--json or --show-logprobs"),
    (["generate", "-p", "hi", "--ckpt", ""], "--ckpt is empty"),
    (["generate", "-p", "hi", "--top-logprobs", "3"], "--top-logprobs shows only with --json"),
    (["compare", "-p", "hi", "--setting", "seed=1", "--top-logprobs", "3"],
     "--top-logprobs shows only with --json"),
    (["generate", "-p", "hi", "--model", "m"], "--model applies to --backend openai only"),
    (["generate", "-p", "hi", "--backend", "scripted", "--quantize", "int8"],
     "--quantize applies to --backend local only"),
    (["generate", "-p", "hi", "--runner", "slow"], "unknown runner 'slow'"),
    (["bench", "--runner", "hf", "--compile", "on"], "--compile applies to the fast runner"),
    (["generate", "-p", "hi", "--runner", "hf", "--quantize", "int4"],
     "--quantize int4 needs the fast runner"),
    (["bench", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"],
     "--backend local only"),
    (["bench", "--backend", "scripted"], "--backend local only"),
    (["bench", "--repeats", "0"], "--repeats must be at least 1"),
    (["bench", "--compare", "--batch", "2"], "leave out --batch and --vs-hf"),
    (["bench", "--compare", "--vs-hf"], "leave out --batch and --vs-hf"),
    (["bench", "--fan-out", "--batch", "2"], "leave out --batch and --vs-hf"),
    (["bench", "--compare", "--fan-out"], "two benchmarks; run one at a time"),
    (["--ckpt", "x", "generate", "-p", "hi"], "--ckpt before the command name would be ignored"),
    (["batch", "--input-file", "README.md", "--output", "."], "is a folder"),
])
def test_inputs_that_would_be_ignored_or_empty_are_refused(args, words):
    r = chatui(*args, timeout=60)
    assert refused(r, words), r.stderr


def test_an_empty_prompt_file_is_refused(tmp_path: Path):
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n")
    assert refused(chatui("generate", "--prompt-file", str(path)), "is empty")


def test_stop_strings_keep_their_commas():
    r = chatui("generate", "-p", "hi", "--backend", "scripted", "--max-tokens", "40",
               "--stop", "said: hi,", "--stop", "\\nzzz")
    assert r.returncode == 0, r.stderr
    # the scripted reply is "You said: hi" and a list; "said: hi," is not in it, where a split
    # at the comma would have stopped it after "said: hi"
    assert "Here is a list" in r.stdout
    r = chatui("generate", "-p", "hi", "--backend", "scripted", "--stop", "Here is")
    assert r.returncode == 0 and "You said: hi" in r.stdout and "list" not in r.stdout


@pytest.mark.parametrize("command", ["generate", "batch", "compare", "bench"])
def test_every_model_command_takes_the_shared_flags(command):
    h = chatui(command, "--help")
    assert h.returncode == 0
    for flag in ("--ckpt", "--device", "--dtype", "--device-map", "--quantize", "--compile",
                 "--runner", "--trust-remote-code", "--allow-pickle", "--backend", "--base-url",
                 "--model", "--api-key-env"):
        assert flag in h.stdout, (command, flag)
    if command != "bench":
        for flag in ("--temperature", "--top-k", "--top-p", "--min-p", "--repetition-penalty",
                     "--seed", "--max-tokens", "--stop"):
            assert flag in h.stdout, (command, flag)


def test_the_chat_takes_stop_and_the_shared_flags():
    h = chatui("--help")
    for flag in ("--stop", "--ckpt", "--backend", "--temperature", "--theme", "--load",
                 "--system", "--top-logprobs"):
        assert flag in h.stdout, flag


def test_outputs_that_would_lose_work_or_input_are_refused_first(tmp_path: Path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    r = chatui("batch", "--backend", "scripted", "--input-file", str(prompts),
               "--output", str(tmp_path / "missing" / "out.jsonl"))
    assert refused(r, "the folder"), r.stderr
    r = chatui("batch", "--backend", "scripted", "--input-file", str(prompts),
               "--output", str(tmp_path / "." / "prompts.txt"))
    assert refused(r, "is the input file itself") and prompts.read_text() == "hello\n"

    from chatui.conversation import Conversation
    from chatui.transcript import save_transcript

    conv = Conversation()
    conv.add_user("keep me")
    saved = tmp_path / "chat.json"
    save_transcript(conv, saved)
    before = saved.read_bytes()
    r = chatui("export", str(saved), "--output", str(saved))
    assert refused(r, "is the input file itself") and saved.read_bytes() == before


def test_build_kernels_prints_the_libraries(kernel):
    r = chatui("build-kernels", timeout=300)
    assert r.returncode == 0, r.stderr
    paths = [Path(x) for x in r.stdout.split()]
    assert paths and all(p.is_file() and p.suffix == ".so" for p in paths)


def test_build_kernels_failing_is_one_sentence(tmp_path: Path):
    r = chatui("build-kernels", "--force", timeout=120,
               env={"CC": "/bin/false", "CHATUI_CACHE_DIR": str(tmp_path)})
    assert refused(r, "kernels"), r.stderr


def test_the_readme_lists_every_bench_benchmark_flag():
    """The README's row for ``chatui bench`` names each of its own flags (issue 18 added
    ``--fan-out``), and ``chatui bench --help`` offers them."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| `chatui bench [")]
    r = chatui("bench", "--help", env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    for flag in ("--prompt-tokens", "--new-tokens", "--batch", "--repeats", "--vs-hf",
                 "--compare", "--fan-out", "--json"):
        assert f"`{flag}`" in row or f"[{flag}]" in row, flag
        assert flag in r.stdout, flag


def test_a_prompt_can_be_typed_bare_or_piped_in():
    """``chatui generate "TEXT"`` as ``-p TEXT``, and ``--prompt-file -`` reads standard input
    (a bare prompt was refused as an unexpected argument; a pipe needed a file)."""
    r = chatui("generate", "hi there", "--backend", "scripted", "--max-tokens", "6")
    assert r.returncode == 0 and "You said: hi there" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "chatui", "generate", "--prompt-file", "-",
                        "--backend", "scripted", "--max-tokens", "6"], capture_output=True,
                       text=True, timeout=120, env=ENV, input="piped words")
    assert r.returncode == 0 and "You said: piped words" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "chatui", "generate", "--prompt-file", "-",
                        "--backend", "scripted"], capture_output=True, timeout=120, env=ENV,
                       input=b"\x00\x01")
    assert b"standard input is a binary file, not text" in r.stderr and r.returncode == 2
    assert refused(chatui("generate", "hi", "-p", "hi", "--backend", "scripted"), "not both")
    assert refused(chatui("generate", " ", "--backend", "scripted"), "the prompt given is empty")
    assert refused(chatui("generate", "--prompt-file", "-", "--backend", "scripted"),
                   "standard input is empty")
    assert refused(chatui("generate", "--backend", "scripted"), '"TEXT", -p TEXT or --prompt-file')


def test_text_piped_into_chatui_is_answered_and_no_terminal_is_refused():
    """``echo TEXT | chatui`` answers as ``chatui generate`` does (with the chat's sampling
    flags and system prompt), and so does ``chatui generate`` with no prompt but a pipe; the
    chat with no terminal, on either side, is refused in one sentence (it drew its window into
    the pipe and spun on a core until killed)."""
    def piped(*args: str, text: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "chatui", *args], capture_output=True,
                              text=True, timeout=120, env=ENV, input=text)

    r = piped("--backend", "scripted", "--max-tokens", "6", text="piped words\n")
    # (echo's line break is the pipe's, not the prompt's: the reply is the typed words')
    assert r.returncode == 0 and "You said: piped words\n\nHere" in r.stdout, r.stderr
    r = piped("generate", "--backend", "scripted", "--max-tokens", "6", text="more words")
    assert r.returncode == 0 and "You said: more words" in r.stdout, r.stderr
    assert refused(piped("--backend", "scripted", text=""), "standard input is empty")
    assert refused(piped("--backend", "scripted", "--theme", "chatui-dark", text="hi"),
                   "--theme is for the chat's window")
    started = time.monotonic()
    assert refused(chatui("--backend", "scripted", timeout=60),
                   "the chat opens in a terminal, and standard input is not a terminal")
    assert time.monotonic() - started < 30
    import pty

    keyboard, terminal = pty.openpty()  # a terminal to type in, the window sent to a pipe
    try:
        r = subprocess.run([sys.executable, "-m", "chatui", "--backend", "scripted"],
                           stdin=terminal, capture_output=True, text=True, timeout=60, env=ENV)
    finally:
        os.close(keyboard)
        os.close(terminal)
    assert refused(r, "standard output is not a terminal")
