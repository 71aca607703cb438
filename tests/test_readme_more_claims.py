"""More README claims that no test checked: SIGTERM, an internal error's rescue copy and the
log's place, the transcript's documented encoding, ``//text`` and keys typed right after a key
that opens a screen. Each test fails if its claim (quoted in its docstring) stops being true."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import signal
import struct
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from textual import events

from chatui import prompt_history as ph
from chatui import transcript as tr
from chatui.conversation import Conversation, Entry, ModelRef
from chatui.textual_compat.testing import deliver
from inference.settings import SamplingParams
from inference.types import Alternative, SamplerCut, Token, Usage
from test_app import SIZE, config_dir, loaded, make_app, notices, send  # noqa: F401

# ---- SIGTERM (README: "The chat") ----


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_sigterm_quits_as_ctrl_q_does(tmp_path):
    """README: "SIGTERM quits as Ctrl+Q does": the streaming reply is stopped and kept, the
    conversation saved, the unsent draft kept, and the process exits 0 with the terminal
    restored (SIGHUP's path ends at once, leaving the window drawn; an uncaught SIGTERM kills
    the process and the reply with it)."""
    from test_tmux_input import start_chatui, tmux, wait_for

    name = f"chatui-term-{uuid.uuid4().hex[:8]}"
    data, status_file = tmp_path / "data", tmp_path / "status"
    pid = start_chatui(name, tmp_path, status_file=status_file)
    try:
        wait_for(name, "Message the model")
        time.sleep(0.5)
        tmux("send-keys", "-t", name, "-l", "tell " + "me more " * 150 + "ENDS")
        wait_for(name, "ENDS")
        tmux("send-keys", "-t", name, "Enter")
        wait_for(name, "You said: tell me")  # streaming: the scripted reply takes ~10 s
        tmux("send-keys", "-t", name, "-l", "an unsent draft")
        wait_for(name, "an unsent draft")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while not (status_file.exists() and status_file.read_text().strip()):
            assert time.monotonic() < deadline, "chatui went on running after SIGTERM"
            time.sleep(0.1)
        alternate = tmux("display-message", "-p", "-t", name, "#{alternate_on}").strip()
        shown = tmux("capture-pane", "-t", name, "-p")
    finally:
        tmux("kill-session", "-t", name)
    status = status_file.read_text().strip()
    assert status == "0", f"exit status {status} (143: killed by SIGTERM)"
    assert alternate == "0", "the terminal was left in the app's alternate screen"
    assert "Traceback" not in shown, shown
    [path] = data.glob("*.json")
    reply = tr.load_transcript(path).entries[1].replies[0]
    assert reply.finish_reason == "cancelled" and reply.text.startswith("You said: tell me")
    assert ph.load(data).draft == "an unsent draft"


# ---- an internal error's rescue copy; where the rescue folder and the log are ----


async def test_an_internal_errors_exit_writes_a_rescue_copy(tmp_path, monkeypatch):
    """README: "When the conversations' folder cannot be written ..., quitting, `/clear` and
    `/load` ... write it to `chatui-rescue/` ... and say where, as does an internal error's
    exit"."""
    from test_ux_status import unwritable_app

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    rescue = tmp_path / "rescue"
    app = unwritable_app(tmp_path, monkeypatch, rescue)
    said: list[str] = []
    message = app.fatal_error_message  # (the sentence the terminal gets as the app ends)
    app.fatal_error_message = lambda error: said.append(message(error)) or said[-1]

    def boom() -> None:
        raise RuntimeError("scripted failure")

    with pytest.raises(RuntimeError, match="scripted failure"):
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "keep me")
            app.call_later(boom)
            await pilot.pause(0.5)
    [copy] = rescue.glob("*.json")
    assert tr.load_transcript(copy).entries[0].text == "keep me"
    [sentence] = said
    assert sentence.startswith("chatui stopped after an internal error: scripted failure.")
    assert f"The conversation was saved to {copy}." in sentence, sentence
    assert f"Details are in {tmp_path / 'xdg' / 'chatui' / 'chatui.log'}." in sentence


def test_the_rescue_folder_is_chatui_rescue_in_the_temporary_folder(tmp_path, monkeypatch):
    """README: "write it to `chatui-rescue/` in the system's temporary folder"."""
    from chatui import rescue

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what gettempdir() answers
    assert rescue.rescue_dir() == tmp_path / "chatui-rescue"
    conv = Conversation()
    conv.add_user("rescue me")
    copy = rescue.write_rescue_copy(conv)
    assert copy is not None and copy.parent == tmp_path / "chatui-rescue"
    assert tr.load_transcript(copy).entries[0].text == "rescue me"


def test_logs_go_to_chatui_log_in_the_user_data_dir(tmp_path, monkeypatch):
    """README: "Logs go to `<user data dir>/chatui/chatui.log`, never to the screen" (the
    chat's configuration as the CLI builds it: no folder of its own)."""
    import platformdirs

    from chatui.app import setup_logging
    from chatui.config import AppConfig

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    log_file = tmp_path / "xdg" / "chatui" / "chatui.log"
    assert Path(platformdirs.user_data_dir()) / "chatui" / "chatui.log" == log_file
    config = AppConfig()
    assert config.resolved_log_file() == log_file
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # (pytest's, put back after)
    try:
        setup_logging(config)
        logging.getLogger("chatui.test").info("a line for the log")
        streams = [h for h in root.handlers if type(h) is logging.StreamHandler]
    finally:
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)
    assert "a line for the log" in log_file.read_text("utf-8")
    assert not streams  # nothing to the terminal


# ---- the transcript's documented encoding (README: "Schema", "Token columns") ----


def _column(doc: dict, key: str, code: str) -> list:
    raw = base64.b64decode(doc[key], validate=True)
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw))


TOKEN_KEYS = {"n", "index", "id", "flags", "logprob", "entropy", "glyph_start", "text",
              "text_ends", "raw", "raw_ends", "top_ends", "top_id", "top_logprob", "top_text",
              "top_text_ends"}
SAMPLER_KEYS = {"sampler_prob", "sampler_nucleus", "sampler_top_ends", "sampler_top_prob",
                "sampler_top_cut"}


def test_a_saved_transcript_holds_the_documented_fields_and_encodings(tmp_path):
    """README, "Schema (version 3)" and "Token columns": the field names, the tree's
    `parent`/`next`/`sibling`, `usage.context_limit`, and each token column as base64 of
    little-endian values (flags one byte: 1 special, 2 id known, 4 logprob known, 8 entropy
    known, 16 `glyph_start` set, 32 reasoning, 64 a sampler record), an unknown value stored
    as 0, an alternative's unknown id as -1, text pieces' ends in code points."""
    conv = Conversation(model=ModelRef(name="tiny"))
    first = conv.add_user("first question")
    entry = conv.add_assistant([SamplingParams(temperature=0.0)])
    reply = entry.replies[0]
    reply.tokens = [
        Token(0, 9906, "Fine", -0.25, 1.5,
              (Alternative(9906, "Fine", -0.25), Alternative(None, "Gööd😀", -1.75)),
              raw="Fine", sampler=SamplerCut(0.9, 3, (0.9, 0.0), ("", "top-k"))),
        Token(1, None, "é😀", None, None, channel="reasoning"),
        Token(2, 2, "", -0.125, 0.5, special=True, glyph_start=1, raw="<|im_end|>"),
    ]
    reply.text, reply.finish_reason = "Fineé😀", "stop"
    reply.usage = Usage(10, 3, 4, 0.5, 20.0, context_limit=8192)
    conv.add_sibling(first, Entry("user", "edited question"))  # the first one: a branch
    path = tmp_path / "t.json"
    tr.save_transcript(conv, path)
    doc = json.loads(path.read_text("utf-8"))

    assert (doc["format"], doc["version"]) == ("chatui-transcript", 3)
    assert {"id", "created", "saved", "title", "model", "system_prompt", "messages",
            "branches"} <= doc.keys()
    assert set(doc["model"]) == {"name", "checkpoint", "weights_hash", "dtype",
                                 "quantization", "backend", "url"}
    [shown] = doc["messages"]
    assert (shown["role"], shown["text"], shown["sibling"]) == ("user", "edited question", 1)
    old, answer = doc["branches"]
    assert (old["text"], old["parent"], old["next"]) == ("first question", None, 0)
    assert answer["parent"] == old["node"] == first.node and answer["chosen"] == 0
    [r] = answer["replies"]
    assert {"settings", "text", "finish_reason", "error", "usage", "tokens"} <= r.keys()
    assert set(r["settings"]) == {"temperature", "top_k", "top_p", "min_p",
                                  "repetition_penalty", "seed", "max_new_tokens", "stop"}
    assert r["usage"] == {"prompt_tokens": 10, "completion_tokens": 3, "cached_tokens": 4,
                          "ttft_s": 0.5, "decode_tokens_per_s": 20.0, "context_limit": 8192}
    t = r["tokens"]
    assert set(t) == TOKEN_KEYS | SAMPLER_KEYS and t["n"] == 3
    assert _column(t, "index", "q") == [0, 1, 2]
    assert _column(t, "id", "q") == [9906, 0, 2]  # unknown: 0
    assert list(base64.b64decode(t["flags"])) == [2 | 4 | 8 | 64, 32, 1 | 2 | 4 | 8 | 16]
    assert _column(t, "logprob", "d") == [-0.25, 0.0, -0.125]
    assert _column(t, "entropy", "d") == [1.5, 0.0, 0.5]
    assert _column(t, "glyph_start", "q") == [0, 0, 1]
    assert (t["text"], _column(t, "text_ends", "Q")) == ("Fineé😀", [4, 6, 6])  # code points
    assert (t["raw"], _column(t, "raw_ends", "Q")) == ("Fine<|im_end|>", [4, 4, 14])
    assert _column(t, "top_ends", "Q") == [2, 2, 2]
    assert _column(t, "top_id", "q") == [9906, -1]  # an alternative's unknown id: -1
    assert _column(t, "top_logprob", "d") == [-0.25, -1.75]
    assert (t["top_text"], _column(t, "top_text_ends", "Q")) == ("FineGööd😀", [4, 9])
    assert _column(t, "sampler_prob", "d") == [0.9, 0.0, 0.0]
    assert _column(t, "sampler_nucleus", "q") == [3, 0, 0]
    assert _column(t, "sampler_top_ends", "Q") == [2, 2, 2]
    assert _column(t, "sampler_top_prob", "d") == [0.9, 0.0]
    assert list(base64.b64decode(t["sampler_top_cut"])) == [0, 1]  # kept, top-k


HAND_WRITTEN = """{
  "format": "chatui-transcript", "version": 3, "id": "3f9c0a1b2c4d",
  "created": 1760000000.0, "saved": 1760000100.0, "title": "by hand",
  "model": {"name": "tiny", "checkpoint": "", "weights_hash": "", "dtype": "",
            "quantization": "", "backend": "local", "url": ""},
  "system_prompt": "Be brief.",
  "messages": [
    {"role": "user", "text": "second question", "time": 1760000001.0, "node": "u2",
     "sibling": 1},
    {"role": "assistant", "text": "Hi", "time": 1760000002.0, "node": "a2", "chosen": 0,
     "replies": [
       {"settings": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                     "repetition_penalty": 1.0, "seed": null, "max_new_tokens": 64,
                     "stop": []},
        "text": "Hi", "finish_reason": "stop", "error": "",
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "cached_tokens": 0,
                  "ttft_s": 0.1, "decode_tokens_per_s": 30.0, "context_limit": 2048},
        "tokens": {"n": 2,
                   "index": "AAAAAAAAAAABAAAAAAAAAA==", "id": "KgAAAAAAAAACAAAAAAAAAA==",
                   "flags": "Dg8=", "logprob": "AAAAAAAA4L8AAAAAAADQvw==",
                   "entropy": "AAAAAAAA8D8AAAAAAADQPw==",
                   "glyph_start": "AAAAAAAAAAAAAAAAAAAAAA==",
                   "text": "Hi", "text_ends": "AgAAAAAAAAACAAAAAAAAAA==",
                   "raw": "Hi<|im_end|>", "raw_ends": "AgAAAAAAAAAMAAAAAAAAAA==",
                   "top_ends": "AgAAAAAAAAACAAAAAAAAAA==",
                   "top_id": "KgAAAAAAAAD//////////w==",
                   "top_logprob": "AAAAAAAA4L8AAAAAAAD4vw==",
                   "top_text": "HiYo", "top_text_ends": "AgAAAAAAAAAEAAAAAAAAAA=="}}]}],
  "branches": [
    {"role": "user", "text": "first question", "time": 1760000000.5, "node": "u1",
     "parent": null, "next": 0},
    {"role": "assistant", "text": "Hello", "time": 1760000000.7, "node": "a1", "chosen": 0,
     "parent": "u1",
     "replies": [
       {"settings": {"temperature": 0.7, "top_k": 0, "top_p": 1.0, "min_p": 0.0,
                     "repetition_penalty": 1.0, "seed": 7, "max_new_tokens": 512,
                     "stop": []},
        "text": "Hello", "finish_reason": "stop", "error": "", "usage": null,
        "tokens": {"n": 0, "index": "", "id": "", "flags": "", "logprob": "",
                   "entropy": "", "glyph_start": "", "text": "", "text_ends": "",
                   "raw": "", "raw_ends": "", "top_ends": "", "top_id": "",
                   "top_logprob": "", "top_text": "", "top_text_ends": ""}}]}]
}"""
"""A version 3 transcript written by hand from the README, its base64 columns too: token 0
"Hi", id 42, logprob -0.5, entropy 1, alternatives 42 "Hi" -0.5 and an unknown id (-1) "Yo"
-1.5, flags 14 (id, logprob, entropy known); token 1 special, id 2, raw "<|im_end|>", logprob
-0.25, entropy 0.25, flags 15; ends in code points."""


def test_a_hand_written_transcript_as_the_readme_describes_loads(tmp_path):
    """README, "Schema (version 3)" and "Token columns", read the other way: a document
    written by hand from them loads, as it says."""
    path = tmp_path / "by-hand.json"
    path.write_text(HAND_WRITTEN, "utf-8")
    conv = tr.load_transcript(path)
    assert (conv.id, conv.title, conv.system_prompt) == ("3f9c0a1b2c4d", "by hand", "Be brief.")
    assert [e.text for e in conv.entries] == ["second question", "Hi"]
    reply = conv.entries[1].reply
    assert reply.usage.context_limit == 2048 and reply.settings.max_new_tokens == 64
    assert list(reply.tokens) == [
        Token(0, 42, "Hi", -0.5, 1.0, (Alternative(42, "Hi", -0.5),
                                       Alternative(None, "Yo", -1.5)), raw="Hi"),
        Token(1, 2, "", -0.25, 0.25, special=True, raw="<|im_end|>")]
    old, new = conv.tops  # "sibling" orders them; "next" is the old one's chosen child
    assert (old.text, new.text, old.next.text) == ("first question", "second question", "Hello")


# ---- //text (README: "Slash commands") ----


async def test_a_double_slash_sends_a_message_starting_with_a_slash():
    """README: "`//text` sends a message starting with a slash"."""
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "//etc is a folder")
        user, answer = app.chat.conversation.entries
        assert (user.role, user.text) == ("user", "/etc is a folder")
        assert answer.reply.text.startswith("You said: /etc is a folder")
        sent = app.holder["backend"].requests[-1].messages[-1]
        assert (sent.role, sent.content) == ("user", "/etc is a folder")
        assert not notices(app)  # no command ran (an unknown one says so)


# ---- keys typed before a screen a key opened is up (README: "Nothing typed is lost") ----


async def until(pilot, condition, timeout_s: float = 5.0) -> None:
    """Pause until ``condition()`` holds or ``timeout_s`` has passed (the assertions then say
    what is wrong)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        await pilot.pause(0.02)


def type_now(app, text: str) -> None:
    """Keys as the terminal driver delivers them, without waiting for the app."""
    for ch in text:
        deliver(app, events.Key(ch, ch))


async def test_keys_typed_right_after_ctrl_p_go_to_the_palette():
    """README: "keys typed right after ... a key that opens one (F5, F1, Ctrl+F, Ctrl+P)
    wait for it and act there, in order"."""
    from textual.command import CommandInput

    from chatui.screens.once import ChatPalette

    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        deliver(app, events.Key("ctrl+p", None))
        type_now(app, "sett")  # at once: the palette is not up yet
        await until(pilot, lambda: isinstance(app.screen, ChatPalette)
                    and app.screen.query(CommandInput)
                    and app.screen.query_one(CommandInput).value == "sett")
        assert isinstance(app.screen, ChatPalette)
        assert app.screen.query_one(CommandInput).value == "sett"
        assert app.chat.prompt.text == ""


async def test_keys_typed_right_after_f1_go_to_the_help_screen():
    """README: "keys typed right after ... a key that opens one (F5, F1, Ctrl+F, Ctrl+P)
    wait for it and act there, in order": F1 and Esc at once open the help and close it, and
    what follows is the chat's."""
    from chatui.screens.help import HelpScreen

    app = make_app()
    opened = []
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)
        real_push = app.push_screen

        def push_screen(screen, *args, **kwargs):
            opened.append(screen)
            return real_push(screen, *args, **kwargs)

        app.push_screen = push_screen  # type: ignore[method-assign]
        deliver(app, events.Key("f1", None))
        deliver(app, events.Key("escape", None))
        type_now(app, "after")
        await until(pilot, lambda: app.screen is app.chat and app.chat.prompt.text == "after")
        assert [type(s) for s in opened] == [HelpScreen]
        assert app.screen is app.chat and app.chat.prompt.text == "after"


# ---- the test command (README: "Development") ----


def test_the_test_command_runs_two_workers_a_file_each_and_ci_calls_it():
    """README: "`./dev.sh test` runs everything (`.ci/run` calls exactly that), on two
    pytest-xdist workers that each take one test file at a time ... `./dev.sh test -n 0` runs
    them in one process." The options are dev.sh's, before the caller's (so that a later
    ``-n 0`` wins), and the plugin is in the test extras the set-up installs."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    ci = [line for line in (root / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith("#")]
    assert ci[-1] == "exec ./dev.sh test -q -rs"
    dev = (root / "dev.sh").read_text()
    run = [line.split() for line in dev.splitlines() if "-m pytest" in line]
    assert len(run) == 1
    words = run[0]
    opts = words[words.index("pytest") + 1:]
    assert opts[-2:] == ['"$@"', ";;"]
    assert opts[:-2] == ["-n", "auto", "--maxprocesses", "2", "--dist", "loadfile"]
    extras = tomllib.loads((root / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["test"]
    assert any(e.startswith("pytest-xdist") for e in extras)
