"""chatui.textual_compat: the patches to Textual's internals change how much work a frame costs,
never what the screen shows; they are applied only on the Textual releases they were tested on
and switch off with ``CHATUI_TEXTUAL_PATCHES=off``; the UI imports and runs without them.

The screen comparisons run the same pilot scenario in fresh interpreters (the patch decision is
taken once per process, when the widget classes are built): patches forced on, switched off,
and on a Textual that says it is another release.

Run as a script (``python tests/test_textual_compat.py screens|crash``) it plays one scenario
and prints what it saw as JSON; the tests below do that in subprocesses.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import textual

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
UNTESTED = "8.99.0"
"""A release the patches were not tested on (the scenarios pretend it is installed)."""

TEXT = "\n\n".join([
    "# A heading",
    " ".join(f"p0w{i}" for i in range(90)),
    "- one item\n- a second item, " + " ".join(f"li{i}" for i in range(30)) + "\n- three",
    "```python\n" + "\n".join(f"x{i} = {i} * 2  # line {i}" for i in range(12)) + "\n```",
    "| name | 值 |\n|---|---|\n| café | 日本語 |\n| b | 😀 |",
    *(" ".join(f"p{p}w{i}" for i in range(40 + 17 * p)) for p in range(1, 6)),
])
"""A reply of many Markdown blocks, long enough to scroll."""


# ---- the scenarios (run in a subprocess) ----

def _state() -> dict[str, bool]:
    """Which patches this process applied."""
    from textual._compositor import Compositor
    from textual.app import App
    from textual.strip import Strip
    from textual.widget import Widget

    from chatui import textual_compat
    from chatui.app import ChatApp
    from chatui.widgets.settled import ConversationLog
    from chatui.widgets.token_view import TokenView

    return {
        "enabled": textual_compat.ENABLED,
        "compositor": bool(getattr(Compositor, "_chatui_partial_updates", False)),
        "strips": bool(getattr(Strip, "_chatui_no_self_cache", False)),
        "settled": ConversationLog._size_updated is not Widget._size_updated,
        "steps": TokenView._size_updated is not Widget._size_updated,
        "fatal_error": ChatApp._fatal_error is not App._fatal_error,
    }


def _rows(rows: list[list[tuple[str, object]]]) -> dict[str, list[str]]:
    """A screen's rows: their text, and each cell's character and style."""
    return {"text": ["".join(ch for ch, _ in row) for row in rows],
            "cells": [repr([(ch, str(style)) for ch, style in row]) for row in rows]}


async def _screens(token_view: bool) -> list:
    """What the terminal shows (built from the updates the app wrote to it, partial ones
    included) and the exported screenshot, at each step of a chat."""
    import re

    from inference.settings import SamplingParams
    from test_app import SIZE, make_app, send
    from chatui.textual_compat.testing import VirtualTerminal

    app = make_app(lambda request, row: TEXT, delay_s=0.001, token_view=token_view,
                   settings=SamplingParams(max_new_tokens=5000))
    terminal = VirtualTerminal(app, SIZE)
    shots: list = []

    async def shoot(pilot) -> None:
        await pilot.pause(0.2)
        svg = re.sub(r"terminal-\d+", "terminal", app.export_screenshot(title="compat"))
        shots.append({"terminal": _rows(terminal.rows), "svg": svg})

    async with app.run_test(size=SIZE) as pilot:
        app.chat.prompt.cursor_blink = False
        await send(pilot, app, "go")
        await shoot(pilot)
        app.chat.log_view.scroll_to(y=7, animate=False)  # partial updates elsewhere
        await shoot(pilot)
        await send(pilot, app, "again")  # a second reply below the first
        await shoot(pilot)
    return shots


def _run_screens() -> dict:
    import asyncio

    state = _state()
    return {"state": state, "markdown": asyncio.run(_screens(False)),
            "tokens": asyncio.run(_screens(True))}


def _run_crash(log_file: Path) -> dict:
    """An exception nobody catches, in a running app: what the user sees on the terminal."""
    import logging

    from test_app import make_app

    logging.basicConfig(filename=log_file)  # as the CLI does: logs never go to the terminal

    app = make_app()

    def boom() -> None:
        raise RuntimeError("scripted failure")

    async def auto_pilot(pilot) -> None:
        pilot.app.call_later(boom)

    app.run(headless=True, size=(80, 24), auto_pilot=auto_pilot)
    return {"state": _state(), "return_code": app.return_code}


def _scenario(name: str, *, patches: str | None = None, version: str | None = None,
              tmp: Path) -> tuple[dict, str]:
    """Run scenario ``name`` in a fresh interpreter: (what it printed, its stderr)."""
    return _finish(*_start(name, patches=patches, version=version, tmp=tmp))


def _start(name: str, *, patches: str | None = None, version: str | None = None,
           tmp: Path) -> tuple[str, Path, subprocess.Popen[str]]:
    """Scenario ``name`` started in a fresh interpreter (:func:`_finish` waits for it)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("CHATUI_TEXTUAL_PATCHES", "CHATUI_UPDATE_SNAPSHOTS")}
    if patches is not None:
        env["CHATUI_TEXTUAL_PATCHES"] = patches
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")])
    env["CHATUI_CONFIG_DIR"] = str(tmp / "config")
    env["CHATUI_DATA_DIR"] = str(tmp / "data")
    out = tmp / f"{name}-{patches}-{version}.json"
    args = [sys.executable, __file__, name, str(out)] + ([version] if version else [])
    return name, out, subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)


def _finish(name: str, out: Path, proc: subprocess.Popen[str]) -> tuple[dict, str]:
    stdout, stderr = proc.communicate(timeout=300)
    assert out.exists(), f"scenario {name} failed:\n{stdout}\n{stderr}"
    return json.loads(out.read_text("utf-8")), stderr


# ---- the tests ----

ON = {"enabled": True, "compositor": True, "strips": True, "settled": True, "steps": True,
      "fatal_error": True}
OFF = {name: False for name in ON}


@pytest.fixture(scope="module")
def screens(tmp_path_factory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("compat")
    # "force" rather than the default: on a release not tested yet, this compares the patches
    # against Textual's own path, which is what to check before adding it to TESTED_VERSIONS
    # the three interpreters side by side (28 s one after another: the suite's slowest setup)
    started = {"on": _start("screens", patches="force", tmp=tmp),
               "off": _start("screens", patches="off", tmp=tmp),
               "untested": _start("screens", version=UNTESTED, tmp=tmp)}
    return {key: _finish(*run)[0] for key, run in started.items()}


def test_the_switch_and_the_version_gate_decide_what_is_patched(screens):
    assert screens["on"]["state"] == ON
    assert screens["off"]["state"] == OFF
    assert screens["untested"]["state"] == OFF


@pytest.mark.parametrize("view", ["markdown", "tokens"])
@pytest.mark.parametrize("other", ["off", "untested"])
def test_screens_are_the_same_without_the_patches(screens, view, other):
    """A reply streamed through the patched compositor and size hooks leaves the terminal and
    the screenshot exactly as Textual's own path does, at every step (streamed, scrolled, a
    second reply)."""
    patched, plain = screens["on"][view], screens[other][view]
    assert len(patched) == len(plain) == 3
    for step, (a, b) in enumerate(zip(patched, plain)):
        assert a["terminal"] == b["terminal"], f"the terminal differs at step {step}"
        assert a["svg"] == b["svg"], f"the screenshot differs at step {step}"
    assert any("p5w" in row for row in patched[0]["terminal"]["text"])  # the reply's end is shown


@pytest.mark.parametrize(("patches", "version", "sentence"), [
    ("force", None, True), ("off", None, False), (None, UNTESTED, False)])
def test_an_internal_error_ends_the_app_with_one_sentence_where_patched(
        tmp_path, patches, version, sentence):
    seen, stderr = _scenario("crash", patches=patches, version=version, tmp=tmp_path)
    assert seen["return_code"] == 1
    assert ("chatui stopped after an internal error: scripted failure" in stderr) is sentence
    assert ("Traceback" in stderr) is not sentence  # Textual's own report otherwise
    if sentence:  # the details went to the log
        log = next(tmp_path.glob("crash-*.log")).read_text("utf-8")
        assert "internal error" in log and "RuntimeError: scripted failure" in log


@pytest.mark.parametrize(("version", "setting", "enabled"), [
    ("8.2.8", None, True), ("8.2.8", "", True), ("8.2.8", "off", False),
    ("8.2.8", "OFF ", False), ("8.2.8", "0", False), ("8.2.9", None, False),
    ("9.0.0", None, False), ("", None, False), ("9.0.0", "force", True),
    ("8.2.8", "on", True)])
def test_patches_enabled(version, setting, enabled):
    from chatui.textual_compat.gate import patches_enabled

    assert patches_enabled(version, setting) is enabled


def test_the_gate_reads_the_installed_version_and_the_environment(monkeypatch):
    from chatui.textual_compat import gate

    monkeypatch.setattr(textual, "__version__", UNTESTED, raising=False)
    assert gate.textual_version() == UNTESTED
    assert not gate.decide({})
    assert gate.decide({gate.ENV_VAR: "force"})
    monkeypatch.setattr(textual, "__version__", "8.2.8", raising=False)
    assert gate.decide({})
    assert not gate.decide({gate.ENV_VAR: "off"})


def test_tested_versions_match_the_pin_and_the_installed_textual():
    """pyproject.toml's pin and TESTED_VERSIONS move together, and the suite runs on a tested
    release (else the patched path above would be forced, not the one users get)."""
    import re
    import tomllib

    from packaging.specifiers import SpecifierSet

    from chatui.textual_compat.gate import TESTED_VERSIONS, textual_version

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    (pin,) = [d for d in deps["dependencies"] if re.match(r"textual\b", d)]
    spec = SpecifierSet(pin.removeprefix("textual"))
    assert all(version in spec for version in TESTED_VERSIONS)
    assert textual_version() in spec
    assert textual_version() in TESTED_VERSIONS


def _reproduction(note: str) -> str:
    """The first Python block of an upstream note in docs/upstream/."""
    text = (ROOT / "docs" / "upstream" / note).read_text("utf-8")
    return text.split("```python\n", 1)[1].split("```", 1)[0]


def _counts(output: str) -> list[int]:
    return [int(line.rsplit(":", 1)[1]) for line in output.strip().splitlines()]


def test_the_strip_bug_written_up_for_upstream_reproduces_and_the_patch_fixes_it():
    """The note's reproduction, pure Textual in a fresh interpreter, still shows the cycles on
    the installed Textual (else the patch can go); with chatui's patch it shows none."""
    code = _reproduction("strip-self-cycles.md")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(prelude: str) -> list[int]:
        done = subprocess.run([sys.executable, "-c", prelude + code], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=120, check=True)
        return _counts(done.stdout)

    divide, crop_extend, control = run("")
    assert divide > 0 and crop_extend > 0 and control == 0
    patched = "from chatui.textual_compat import strips\nassert strips.apply()\n"
    assert run(patched) == [0, 0, 0]



def test_a_removed_widgets_style_cache_and_its_lines_are_freed():
    """Textual's ``StylesCache.get_inner_outer`` cached on ``self`` kept the last 1,024 style
    caches (and every line they drew) alive after their widgets went; patched, a style cache
    goes with its widget, and the method answers as before."""
    import weakref

    from textual._styles_cache import StylesCache
    from textual.color import Color

    from chatui.textual_compat import styles_cache

    assert styles_cache.apply()
    cache = StylesCache()
    gone = weakref.ref(cache)
    base, background = Color(10, 20, 30), Color(40, 50, 60, 0.5)
    inner, outer = cache.get_inner_outer(base, background)
    assert inner.background == base + background and outer.background == base
    del cache
    gc.collect()
    assert gone() is None, "the style cache outlived its last user"


if __name__ == "__main__":
    scenario, out = sys.argv[1], Path(sys.argv[2])
    if len(sys.argv) > 3:  # pretend another Textual release is installed
        textual.__version__ = sys.argv[3]  # type: ignore[attr-defined]
    result = _run_screens() if scenario == "screens" else _run_crash(out.with_suffix(".log"))
    out.write_text(json.dumps(result), "utf-8")


@pytest.mark.parametrize("typed, keys", [
    ("\x1b/", ["escape", "slash"]),  # (Textual: "slash", the Esc lost)
    ("\x1b/compare\x1b", ["escape", "slash", "c", "o", "m", "p", "a", "r", "e", "escape"]),
    ("\x1b/\x1bx", ["escape", "slash", "escape", "x"]),  # ("^" and "/" before)
    ("\x1bq", ["escape", "q"]),  # (alt+q)
    ("\x1b ", ["escape", "space"]),
    ("\x1b\r", ["alt+enter"]),  # the prompt's newline (it was Enter: the message went out)
    ("\x1b[", ["escape", "left_square_bracket"]),  # a sequence start that led nowhere
    ("\x1b", ["escape"]),
    ("\x1b\x1b", ["escape", "escape"]),
    ("\x1b[A\x1bOB\x1b[1;3D", ["up", "down", "alt+left"]),  # the terminal's own sequences
    ("\x1bb\x1bf\x1b\x7f", ["ctrl+left", "ctrl+right", "ctrl+w"]),  # (ESC b / f / DEL kept)
    ("\x1b[200~a/b\x1b[201~", ["paste:a/b"]),
])
def test_a_key_typed_right_after_esc_is_both_keys(typed, keys):
    """Esc and a key within the parser's 0.1 s wait (a fast typist; tmux's send-keys): Textual
    read ESC "/" as "/" alone, and typed the Esc as "^" when a third key followed as fast."""
    from textual import events
    from textual._xterm_parser import XTermParser

    from chatui.textual_compat import keys as compat_keys

    class Parser(XTermParser):  # (the patch itself, whether the gate applied it or not)
        _sequence_to_key_events = compat_keys.split_escape_keys(compat_keys.unpatched())

    parser = Parser()
    got = list(parser.feed(typed)) + list(parser.feed(""))
    names = [f"paste:{e.text}" if isinstance(e, events.Paste) else e.key for e in got]
    assert names == keys


PASTES = [
    ("\x1b[200~colour codes: \x1b[31mred\x1b[0m and done /clear\x1b[201~x",
     ["paste:colour codes: red and done /clear", "x"]),
    ("\x1b[200~line\r\nnext\x1b[1mbold\x1b[m\x1b[201~\r", ["paste:line\r\nnextbold", "enter"]),
    ("\x1b[200~a\x1bb\x1b[201~", ["paste:a\u241bb"]),  # no CSI: the ESC shown, never typed
    ("\x1b[200~a\x1b\x1b[201~", ["paste:a\u241b"]),
    ("\x1b[200~a\x1b[20\x1b[201~", ["paste:a\u241b[20"]),  # (a closing sequence begun)
    ("\x1b[A\x1b[200~x\x1b[201~\x1b[B\x1b/", ["up", "paste:x", "down", "escape", "slash"]),
]


@pytest.mark.parametrize("typed, events_", PASTES)
def test_a_paste_holding_esc_is_one_paste_however_it_is_read(typed, events_):
    """Textual ended a bracketed paste's text at its first ESC and read the rest as keys,
    after the pasted part: pasted coloured text (``ls --color``, a log) came out shuffled,
    and a line break after an ESC would have been Enter. Read in one piece or cut in three
    anywhere (a large paste arrives in several reads), it is one paste, colours out."""
    from textual import events
    from textual._xterm_parser import XTermParser

    from chatui.textual_compat import keys as compat_keys

    class Parser(XTermParser):  # (the patches themselves, whether the gate applied them or not)
        _sequence_to_key_events = compat_keys.split_escape_keys(compat_keys.unpatched())
        feed = compat_keys.paste_whole(compat_keys.unpatched_feed())

    def read(chunks: list[str]) -> list[str]:
        parser = Parser()
        got = [e for c in chunks if c for e in parser.feed(c)] + list(parser.feed(""))
        return [f"paste:{e.text}" if isinstance(e, events.Paste) else e.key for e in got]

    for i in range(len(typed) + 1):
        for j in range(i, len(typed) + 1):
            assert read([typed[:i], typed[i:j], typed[j:]]) == events_, (i, j)
