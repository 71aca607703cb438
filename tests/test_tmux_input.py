"""Issue 14, section 2: keys typed at the start are never lost. chatui is started in a real
terminal (tmux) with the scripted backend, again and again, and a message is typed and sent
at once (as a fast typist or a paste would: before the screen is drawn, while it is drawn, just
after); after quitting, the message must be in the autosaved transcript. On main every run
that typed within about a second of the start lost the message. And what a real terminal
shows after ``/score`` (its scrolls raced the layout there, not in the pilot).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")

DELAYS_S = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.3, 1.8)
"""When the message is typed, counted from the start of the process (the app appears after
about a second here)."""


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], check=False, capture_output=True,
                          text=True).stdout


def start_chatui(name: str, tmp: Path, size: tuple[int, int] = (100, 30),
                 program: list[str] | None = None, args: tuple[str, ...] = (),
                 status_file: Path | None = None, before: str = "", after: str = "") -> int:
    """chatui (the scripted backend, data, config and logs under ``tmp``) in a new tmux
    session ``name``; its process id (the pane's: the command is exec'd). With
    ``status_file``, a shell runs it and writes its exit status there (tmux left an exited
    pane's process a zombie for 30 s in some runs, its status unknown), the pane kept; that
    shell runs ``before`` and ``after`` (commands) before and after it."""
    env = {"PYTHONPATH": str(ROOT), "CHATUI_CONFIG_DIR": str(tmp / "config"),
           "CHATUI_DATA_DIR": str(tmp / "data"), "XDG_DATA_HOME": str(tmp / "xdg"),
           "TERM": "xterm-256color"}
    command = " ".join(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable,
                        *(program or ["-m", "chatui"]), "--backend", "scripted", *args])
    command = (f"{before}{'; ' if before else ''}{command}; echo $? > {status_file}"
               f"{'; ' if after else ''}{after}" if status_file is not None
               else f"exec {command}")
    tmux("new-session", "-d", "-s", name, "-x", str(size[0]), "-y", str(size[1]), command)
    pane = int(tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())
    if status_file is None:
        return pane
    tmux("set-option", "-w", "-t", name, "remain-on-exit", "on")  # (the screen stays)
    children = Path(f"/proc/{pane}/task/{pane}/children")
    deadline = time.monotonic() + 10
    while not children.read_text().split():
        assert time.monotonic() < deadline, "chatui did not start"
        time.sleep(0.05)
    return int(children.read_text().split()[0])


def wait_for(name: str, text: str, timeout: float = 30) -> str:
    """The screen of session ``name`` once it shows ``text``."""
    deadline = time.monotonic() + timeout
    shown = ""
    while time.monotonic() < deadline:
        shown = tmux("capture-pane", "-t", name, "-p")
        if text in shown:
            return shown
        time.sleep(0.2)
    raise AssertionError(f"{text!r} did not appear:\n{shown}")


def run_once(tmp: Path, delay_s: float, text: str, program: list[str] | None = None) -> bool:
    name = f"chatui-input-{uuid.uuid4().hex[:8]}"
    start_chatui(name, tmp, program=program)
    try:
        time.sleep(delay_s)
        tmux("send-keys", "-t", name, "-l", text)
        tmux("send-keys", "-t", name, "Enter")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the reply has ended: the autosave is written
            if any(text in p.read_text(errors="replace")
                   for p in (tmp / "data").rglob("*.json")):
                break
            time.sleep(0.2)
        tmux("send-keys", "-t", name, "C-q")
        time.sleep(1.0)
    finally:
        tmux("kill-session", "-t", name)
    return any(text in p.read_text(errors="replace") for p in (tmp / "data").rglob("*.json"))


def test_a_message_typed_right_after_starting_is_sent(tmp_path):
    lost = []
    for i, delay in enumerate(DELAYS_S):
        text = f"typed at once {i}"
        if not run_once(tmp_path / str(i), delay, text):
            lost.append(delay)
    assert not lost, f"the message typed {lost} s after starting was lost"


def test_ctrl_q_typed_while_chatui_starts_quits_it_and_flow_control_comes_back(tmp_path):
    """Ctrl+Q sent 0.3 or 0.6 s after the start, before Textual has put the terminal in raw
    mode: the terminal driver took it as XON (IXON) and chatui went on running, every time
    (seen in tmux); now the chat clears IXON as it starts (``chatui/tty_flow.py``), the key
    waits with the others typed early, and chatui quits with status 0. The terminal has IXON
    again afterwards, as it had before."""
    kept_open = []
    for i, delay in enumerate((0.3, 0.6)):
        tmp = tmp_path / str(i)
        tmp.mkdir()
        name = f"chatui-flow-{uuid.uuid4().hex[:8]}"
        status = tmp / "status"
        start_chatui(name, tmp, status_file=status, before=f"stty -a > {tmp / 'before'}",
                     after=f"stty -a > {tmp / 'after'}")
        try:
            time.sleep(delay)
            tmux("send-keys", "-t", name, "C-q")
            deadline = time.monotonic() + 15
            while not (tmp / "after").is_file() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            tmux("kill-session", "-t", name)
        if not status.is_file():
            kept_open.append(delay)
            continue
        assert status.read_text().strip() == "0"
        flags = [(tmp / f).read_text().split() for f in ("before", "after")]
        assert "ixon" in flags[0] and "ixon" in flags[1], flags
    assert not kept_open, f"Ctrl+Q sent {kept_open} s after the start left chatui open"


LATE_INPUT = """import sys, time
import textual.drivers.linux_driver as linux
started = linux.LinuxDriver.run_input_thread
def late(self):
    time.sleep(1.5)
    started(self)
linux.LinuxDriver.run_input_thread = late
from chatui.cli import main
main()
"""


def test_keys_typed_in_line_mode_are_sent_when_read_after_the_prompt_exists(tmp_path):
    """Keys typed before the terminal leaves line mode end in a line feed (Ctrl+J, the
    prompt's newline key); the app holds them and turns it back into Enter. Textual's input
    thread reads the terminal on its own schedule: started 1.5 s late here, so that it reads
    them after the prompt box exists (as it did once in a full test run), the messages typed
    at 0.0 and 0.3 s must still be sent (before ``chatui/early_input.py``, both were lost in
    every run)."""
    program = tmp_path / "late_input.py"
    program.write_text(LATE_INPUT)
    lost = []
    for i, delay in enumerate((0.0, 0.3)):
        text = f"typed in line mode {i}"
        if not run_once(tmp_path / str(i), delay, text, [str(program)]):
            lost.append(delay)
    assert not lost, f"the message typed {lost} s after starting was lost"


def test_score_shows_its_message_in_a_real_terminal(tmp_path):
    """``/score`` ends with the scored message on screen, above the prompt box, in a real
    terminal: the token view it switches on re-wraps the replies beside the inspector, and
    the scrolls made on the heights from before (the last reply focused, the cursor put on
    the least likely token) left the log mid-reply with the message off the screen (seen in
    tmux; the pilot's layout settles between steps, so the pilot tests passed)."""
    name = f"chatui-score-{uuid.uuid4().hex[:8]}"
    start_chatui(name, tmp_path, (120, 36))
    words = "\n\n```python\n" + "".join(
        f"def function_number_{i}(text: str, prefix: str) -> str:\n    return text[::-1]\n\n"
        for i in range(12)) + "```\n\n"

    def screen() -> str:
        return tmux("capture-pane", "-t", name, "-p")

    def send(text: str) -> None:  # (pasted: its line breaks stay in the box)
        tmux("set-buffer", "-b", name, text)
        tmux("paste-buffer", "-p", "-d", "-b", name, "-t", name)
        time.sleep(0.3)
        tmux("send-keys", "-t", name, "Enter")

    try:
        wait_for(name, "Message the model")
        for i in range(3):  # the last reply taller than the screen; the first message short
            send(f"question {i}: {words if i else 'a short one'} end{i}")
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the reply (which quotes end{i}) has ended
                shown = screen()
                if f"end{i}" in shown and "TTFT" in shown.rsplit(f"end{i}", 1)[1]:
                    break
                time.sleep(0.2)
        send("/settings")
        wait_for(name, "Settings in force")
        send("/score 1")
        wait_for(name, "scored message")
        time.sleep(1.5)
        lines = screen().splitlines()
        box = next(i for i, line in enumerate(lines) if "▔▔▔" in line and i > 3)
        above = "\n".join(lines[max(0, box - 6):box])
        assert "scored message 1" in above and "end0" in above, "\n".join(lines)
    finally:
        tmux("kill-session", "-t", name)


@pytest.mark.parametrize("raw", [False, True], ids=["chat", "notebook"])
def test_a_closed_terminal_stops_and_saves_the_streaming_reply(tmp_path, raw):
    """The terminal closed mid-reply (SIGHUP: a window closed, an SSH connection dropped):
    the process ends (it hung, when it quit as Ctrl+Q does: Textual's output thread had died
    on the gone terminal), and the reply is saved as far as it got, stopped (it was lost: the
    file held the question and an empty reply)."""
    from chatui import transcript as tr

    name = f"chatui-hup-{uuid.uuid4().hex[:8]}"
    data = tmp_path / "data"
    pid = start_chatui(name, tmp_path, args=("--raw",) if raw else ())
    try:
        deadline = time.monotonic() + 30
        while ("continue" if raw else "Message the model") not in tmux(
                "capture-pane", "-t", name, "-p"):
            assert time.monotonic() < deadline, "chatui did not start"
            time.sleep(0.2)
        time.sleep(0.5)
        tmux("send-keys", "-t", name, "-l", "tell " + "me more " * 150 + "ENDS")
        while "ENDS" not in tmux("capture-pane", "-t", name, "-p"):  # all of it typed
            assert time.monotonic() < deadline, "the text did not arrive"
            time.sleep(0.2)
        tmux("send-keys", "-t", name, "C-o" if raw else "Enter")
        time.sleep(3.0)  # the scripted reply (it quotes the message) streams for ~10 s
    finally:
        tmux("kill-session", "-t", name)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "chatui went on running after its terminal closed"
        time.sleep(0.2)
    [path] = [p for p in data.rglob("*.json")]
    conv = tr.load_transcript(path)
    reply = conv.entries[1].replies[0]
    assert reply.finish_reason == "cancelled" and reply.text.startswith("You said: tell me")
    assert conv.mode == ("raw" if raw else "chat")


def test_esc_and_a_command_typed_at_once_are_both_read(tmp_path):
    """Esc and the next keys sent in one burst (a fast typist; tmux's send-keys): Esc closes
    the search screen and the command runs in the message box. Textual read ESC "/" as "/"
    alone: the search box got "/settings", and the Esc was lost (or typed as "^")."""
    name = f"chatui-esc-{uuid.uuid4().hex[:8]}"
    start_chatui(name, tmp_path)
    try:
        wait_for(name, "Message the model")
        tmux("send-keys", "-t", name, "C-f")
        wait_for(name, "Search saved conversations")
        tmux("send-keys", "-t", name, "-l", "lemon")
        wait_for(name, "lemon")
        tmux("send-keys", "-t", name, "Escape", "/settings", "Enter")  # one write
        shown = wait_for(name, "Settings in force", timeout=10)
        assert "lemon" not in shown and "^/" not in shown, shown
    finally:
        tmux("kill-session", "-t", name)


def test_a_paste_of_coloured_text_is_pasted_whole(tmp_path):
    """Text copied from a coloured terminal holds ESC sequences: Textual ended the paste at its
    first ESC and typed the rest as keys after it ("^[31mred^[0m and done /clearcolour codes:
    " in the message box). The paste arrives whole, in order, its colours taken out, and its
    line break is a newline in the box, not Enter."""
    name = f"chatui-paste-{uuid.uuid4().hex[:8]}"
    start_chatui(name, tmp_path)
    pasted = tmp_path / "coloured.txt"
    pasted.write_bytes(b"colour codes: \x1b[31mred\x1b[0m and done\nsecond \x1b[1mline\x1b[0m"
                       b" end")
    try:
        wait_for(name, "Message the model")
        tmux("load-buffer", "-b", name, str(pasted))
        tmux("paste-buffer", "-p", "-d", "-b", name, "-t", name)  # bracketed, as a terminal
        shown = wait_for(name, "line end")
        assert "colour codes: red and done" in shown and "second line end" in shown, shown
        assert "^[" not in shown and "\u241b" not in shown and "You said" not in shown, shown
    finally:
        tmux("kill-session", "-t", name)
