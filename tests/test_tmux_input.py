"""Issue 14, section 2: keys typed at the start are never lost. chatui is started in a real
terminal (tmux) with the scripted backend, again and again, and a message is typed and sent
at once (as a fast typist or a paste would: before the screen is drawn, while it is drawn, just
after); after quitting, the message must be in the autosaved transcript. On main every run
that typed within about a second of the start lost the message.
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


def run_once(tmp: Path, delay_s: float, text: str, program: list[str] | None = None) -> bool:
    name = f"chatui-input-{uuid.uuid4().hex[:8]}"
    env = {"PYTHONPATH": str(ROOT), "CHATUI_CONFIG_DIR": str(tmp / "config"),
           "CHATUI_DATA_DIR": str(tmp / "data"), "TERM": "xterm-256color"}
    command = " ".join(["env", *(f"{k}={v}" for k, v in env.items()), sys.executable,
                        *(program or ["-m", "chatui"]), "--backend", "scripted"])
    tmux("new-session", "-d", "-s", name, "-x", "100", "-y", "30", command)
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
