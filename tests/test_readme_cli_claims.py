"""README claims about the headless CLI that no other test checked: each test here fails if
its claim stops being true. Real subprocesses, as a user runs them, on the scripted backend
(``--backend scripted``: no model, a few tenths of a second a run).

Where a claim is about what reaches the model (a system prompt) or needs a reasoning model,
the run swaps the CLI's scripted factory for one whose reply quotes the request's messages
(:data:`REVEALING`); everything else is ``python -m chatui`` itself.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "COLUMNS": "120"}
SYSTEM = "Answer in French."

REVEALING = """
import chatui.cli.headless as headless
from chatui.cli import main
from inference.scripted import ScriptedFactory

def reply(request, row):
    said = " | ".join(f"{m.role}: {m.content}" for m in request.messages)
    return (f"Thinking about {said}.", f"Answer to {said}.") if REASONING else said

headless.make_factory = lambda opts: ScriptedFactory(reply=reply)
main()
"""
"""``chatui`` whose scripted replies say what the backend was sent (``system: S | user: U``),
or with ``REASONING`` reason about it first (as a reasoning model's reply does)."""


def chatui(*args: str, stdin: str | None = None, reveal: bool = False,
           reasoning: bool = False) -> subprocess.CompletedProcess:
    """Run ``python -m chatui ARGS`` (with ``reveal``, the :data:`REVEALING` one); ``stdin``
    is piped in, else standard input is nothing."""
    program = (["-c", f"REASONING = {reasoning!r}\n{REVEALING}"] if reveal or reasoning
               else ["-m", "chatui"])
    return subprocess.run([sys.executable, *program, *args], capture_output=True, text=True,
                          timeout=60, env=ENV, input=stdin,
                          stdin=subprocess.DEVNULL if stdin is None else None)


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


# ---- --system (README: the commands table) ----


@pytest.mark.parametrize("command", ["generate", "batch", "compare", "piped"])
def test_system_prompt_reaches_the_model_in_every_command(command, tmp_path: Path):
    """``--system S`` is listed for ``chatui generate``, ``batch`` and ``compare`` and for text
    piped into plain ``chatui`` ("with ``--system``, ``--raw`` and the sampling flags"). A flag
    parsed but never put into the request would go unnoticed in help-text tests: the reply
    here quotes the messages the backend got, the system message first."""
    flags = ("--backend", "scripted", "--system", SYSTEM)
    said = f"system: {SYSTEM} | user: hello"
    if command == "generate":
        r = chatui("generate", "-p", "hello", *flags, reveal=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout == said + "\n"
    elif command == "piped":  # echo hello | chatui --system S
        r = chatui(*flags, stdin="hello\n", reveal=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout == said + "\n"
    elif command == "batch":
        prompts = tmp_path / "prompts.txt"
        prompts.write_text("hello\n")
        r = chatui("batch", "--input-file", str(prompts), *flags, reveal=True)
        assert r.returncode == 0, r.stderr
        [record] = json_lines(r.stdout)
        assert record["text"] == said
    else:
        r = chatui("compare", "-p", "hello", "--setting", "temperature=0",
                   "--setting", "temperature=1", "--json", *flags, reveal=True)
        assert r.returncode == 0, r.stderr
        tokens = [x for x in json_lines(r.stdout) if x["type"] == "token"]
        for column in (0, 1):
            assert "".join(t["text"] for t in tokens if t["column"] == column) == said


# ---- compare's table ----


def test_compare_prints_a_table_whose_columns_start_from_the_sampling_flags():
    """``chatui compare``: "a table, or ``--json`` lines tagged by ``"column"``; the sampling
    flags set what every column starts from", and the table says how a reply that did not end
    on its own ended, as ``generate`` does. Both columns here set only their temperature, so
    ``--max-tokens 4`` must cut each one off after 4 tokens (the scripted reply is ~30)."""
    r = chatui("compare", "-p", "hi", "--backend", "scripted", "--max-tokens", "4",
               "--setting", "temperature=0", "--setting", "temperature=1,top_p=0.9")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert not any(line.startswith("{") for line in lines)  # not JSON lines
    header = next(line for line in lines if "settings" in line)
    assert all(word in header for word in ("#", "settings", "reply", "stats")), r.stdout
    assert "temperature=1 top_p=0.9" in r.stdout  # one row per column
    assert r.stdout.count("4 tokens") == 2, r.stdout
    assert r.stdout.count("cut off at the token limit") == 2, r.stdout
    assert "Here" in r.stdout and "list" not in r.stdout  # "You said: hi\n\nHere" and no more


# ---- generate --fork-at ----


def test_fork_at_decodes_three_branches_that_say_how_they_ended():
    """``--fork-at N [--fork-k K]`` decodes "the K (2-8, default 3) most likely tokens" as K
    branches, and in the plain output "``--fork-at``'s branches say" how a reply that did not
    end on its own ended, as ``generate``'s plain output does (``[cut off at the token
    limit]``). No ``--fork-k`` here: three branches, each with its ending in words (they are
    printed on the branch's first line, before its text)."""
    r = chatui("generate", "-p", "hello there", "--backend", "scripted", "--fork-at", "2",
               "--max-tokens", "6")
    assert r.returncode == 0, r.stderr
    assert "--- 3 branches at token 2 " in r.stdout
    heads = [line for line in r.stdout.splitlines() if line[:1] == "[" and line[1:2].isdigit()]
    assert [h[:3] for h in heads] == ["[0]", "[1]", "[2]"], r.stdout
    assert all(h.endswith("[cut off at the token limit]") for h in heads), heads


# ---- batch ----


def test_batch_puts_a_reasoning_models_reasoning_apart_from_its_answer(tmp_path: Path):
    """``chatui batch``: "a reasoning model's reasoning under ``"reasoning"``, ``"text"`` its
    answer". A record whose "text" held the reasoning too (or no "reasoning" at all) would
    give a batch's reader the model's thoughts as its answer."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("two plus two?\n")
    r = chatui("batch", "--backend", "scripted", "--input-file", str(prompts), reasoning=True)
    assert r.returncode == 0, r.stderr
    [record] = json_lines(r.stdout)
    assert record["reasoning"] == "Thinking about user: two plus two?."
    assert record["text"].strip() == "Answer to user: two plus two?."
    assert "Thinking" not in record["text"]


def test_batch_raw_refuses_a_system_prompt(tmp_path: Path):
    """``chatui batch --raw``: "``--system`` is refused" (a raw continuation has no chat
    template to put it in, so it would be dropped), in one sentence, exit code 2, before any
    model loads."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n")
    r = chatui("batch", "--raw", "--system", SYSTEM, "--backend", "scripted",
               "--input-file", str(prompts))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.splitlines() == [
        "chatui: --raw continues plain texts, which have no system prompt; leave out --system"]


# ---- JSON output fields ----


def test_score_json_ends_with_the_totals():
    """``chatui score --json`` prints one object per token and "a last ``{"type": "score",
    "tokens", "scored_tokens", "sum_logprob", "perplexity"}``": the totals a script reads
    instead of summing the token lines itself."""
    r = chatui("score", "-p", "one two three four", "--backend", "scripted", "--json")
    assert r.returncode == 0, r.stderr
    *tokens, last = json_lines(r.stdout)
    assert set(last) == {"type", "tokens", "scored_tokens", "sum_logprob", "perplexity"}
    assert last["type"] == "score" and last["tokens"] == len(tokens) == 4
    logprobs = [t["logprob"] for t in tokens if t["logprob"] is not None]
    assert last["scored_tokens"] == len(logprobs) == 3  # the first has nothing before it
    assert last["sum_logprob"] == pytest.approx(sum(logprobs))
    assert last["perplexity"] == pytest.approx(math.exp(-sum(logprobs) / len(logprobs)))


def test_generate_json_done_line_has_every_documented_field():
    """``generate --json`` ends with ``{"type": "done", "finish_reason", "prompt_tokens",
    "completion_tokens", "cached_tokens", "ttft_s", "decode_tokens_per_s"}``; a field left out
    (``cached_tokens``: how much of the prompt the prefix cache reused) breaks a reader."""
    r = chatui("generate", "-p", "hi", "--backend", "scripted", "--json", "--max-tokens", "3")
    assert r.returncode == 0, r.stderr
    done = json_lines(r.stdout)[-1]
    assert set(done) == {"type", "finish_reason", "prompt_tokens", "completion_tokens",
                         "cached_tokens", "ttft_s", "decode_tokens_per_s"}
    assert done["type"] == "done" and done["cached_tokens"] == 0  # (scripted: no cache)
    assert (done["finish_reason"], done["completion_tokens"]) == ("length", 3)


# ---- score takes the model flags ----


def test_score_takes_the_shared_model_and_backend_flags():
    """"Every command but ``export``, ``history`` and ``build-kernels`` takes the model flags
    ... and the backend flags". ``tests/test_cli_inputs.py``'s
    ``test_every_model_command_takes_the_shared_flags`` was written before ``chatui score``
    existed and names generate, batch, compare and bench only; this covers score: its help
    lists every flag, and a ``--ckpt`` given to it is checked as the others check it."""
    h = chatui("score", "--help")
    assert h.returncode == 0, h.stderr
    for flag in ("--ckpt", "--device", "--dtype", "--device-map", "--quantize", "--compile",
                 "--runner", "--trust-remote-code", "--allow-pickle", "--backend", "--base-url",
                 "--model", "--api-key-env"):
        assert flag in h.stdout, flag
    r = chatui("score", "-p", "hi", "--ckpt", "/no/such/model")
    assert r.returncode == 2 and "No such file or directory: /no/such/model" in r.stderr
    r = chatui("score", "-p", "hi", "--backend", "scripted", "--quantize", "int8")
    assert r.returncode == 2 and "--quantize applies to --backend local only" in r.stderr


# ---- Ctrl+C ----


def interrupted(*args: str, after: bytes) -> tuple[subprocess.Popen, bytes, str]:
    """Run ``chatui generate ARGS`` on a long scripted reply (its prompt quoted back, 0.02 s a
    token: about 6 s), send SIGINT once stdout holds ``after``; (process, stdout, stderr)."""
    words = " ".join(f"w{i}" for i in range(300))
    proc = subprocess.Popen([sys.executable, "-m", "chatui", "generate", "-p", words,
                             "--backend", "scripted", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=ENV)
    assert proc.stdout is not None
    watchdog = threading.Timer(60, proc.kill)  # (a hang fails the test, not the suite)
    watchdog.start()
    try:
        out = b""
        while after not in out:
            chunk = os.read(proc.stdout.fileno(), 4096)
            assert chunk, out
            out += chunk
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
    return proc, out + rest, err.decode()


def test_ctrl_c_stops_generate_and_keeps_the_reply_so_far():
    """"Ctrl+C stops a reply and keeps what was generated (finish reason ``cancelled``)", and
    the plain output then ends with ``[stopped]`` on standard error. Without ``stream``'s
    SIGINT handler the command exits 130 some seconds later with neither (tried)."""
    proc, out, err = interrupted(after=b" w2")
    assert proc.returncode == 0, err
    text = out.decode()
    assert text.startswith("You said: w0 w1 w2") and text.endswith("\n")
    assert "w299" not in text  # stopped well before the end
    assert err.splitlines()[-1:] == ["[stopped]"] and "Traceback" not in err

    proc, out, err = interrupted("--json", after=b'w2"')
    assert proc.returncode == 0, err
    *tokens, done = json_lines(out.decode())
    assert done["type"] == "done" and done["finish_reason"] == "cancelled"
    assert len(tokens) >= 4 and done["completion_tokens"] == len(tokens)
    assert "".join(t["text"] for t in tokens).startswith("You said: w0 w1 w2")
