"""Issue 14, section 1: no exception in a worker or a callback is swallowed. For each kind the
app uses (the model-loading worker, the worker that opens ``--load PATH``, the streaming
worker, a screen's result callback, the context meter's count) a test raises inside it and
checks that the log has the traceback and the user got one sentence, and that the app goes on.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from chatui import chat_commands
from chatui.screens.chat import ChatScreen
from chatui.widgets.reply import ReplyView

from test_app import SIZE, config_dir, loaded, make_app, send  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def messages(app) -> list[str]:
    return [n.message for n in app._notifications]


async def wait_for(pilot, predicate, what: str) -> None:
    for _ in range(500):
        if predicate():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"never happened: {what}")


class Boom(RuntimeError):
    pass


def reported(app, caplog, needle: str) -> bool:
    shown = any("Boom" in m and needle in m for m in messages(app))
    logged = any(r.exc_info and isinstance(r.exc_info[1], Boom) for r in caplog.records)
    return shown and logged


async def test_an_error_in_the_loading_worker_is_logged_and_shown(monkeypatch, caplog):
    caplog.set_level(logging.ERROR)

    def ready(self, info):
        raise Boom("drawing the model failed")

    monkeypatch.setattr(ChatScreen, "model_ready", ready)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: reported(app, caplog, "Loading the model"), "reported")
        assert app.is_running


async def test_an_error_opening_the_load_path_is_logged_and_shown(tmp_path, monkeypatch,
                                                                  caplog):
    caplog.set_level(logging.ERROR)

    async def load(ctx, arg):
        raise Boom("cannot draw it")

    monkeypatch.setattr(chat_commands, "cmd_load", load)
    app = make_app(load_path=tmp_path / "x.json")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: reported(app, caplog, "x.json"), "reported")


async def test_an_error_in_the_streaming_worker_is_logged_and_shown(monkeypatch, caplog):
    caplog.set_level(logging.ERROR)

    async def end(self):
        raise Boom("the view broke")

    monkeypatch.setattr(ReplyView, "end", end)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await wait_for(pilot, lambda: reported(app, caplog, "reply"), "reported")
        assert not app.chat.generating
        await send(pilot, app, "/settings")  # the chat goes on


async def test_an_error_in_a_screen_callback_is_logged_and_shown(monkeypatch, caplog):
    caplog.set_level(logging.ERROR)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)

        def arm(specs, name=""):
            raise Boom("arming broke")

        monkeypatch.setattr(app.chat.compare, "arm", arm)
        app.chat.compare.open_screen()
        await pilot.pause(0.1)
        app.screen.dismiss((("temperature=0", "temperature=1"), ""))
        await wait_for(pilot, lambda: reported(app, caplog, "compare"), "reported")
        assert app.is_running


async def test_a_failed_token_count_is_logged_and_shown(caplog):
    caplog.set_level(logging.ERROR)
    app = make_app()
    async with app.run_test(size=SIZE) as pilot:
        await loaded(pilot, app)

        async def count(messages):
            raise Boom("tokenizer broke")

        app.worker.count_tokens = count  # type: ignore[method-assign]
        await send(pilot, app, "hello")
        await wait_for(pilot, lambda: reported(app, caplog, "Counting"), "reported")


def test_every_worker_goes_through_the_reporting_module():
    """A new ``run_worker`` or ``@work`` elsewhere would hide its exceptions again."""
    offenders = []
    for path in (ROOT / "chatui").rglob("*.py"):
        if path.name == "reporting.py":
            continue
        text = path.read_text(encoding="utf-8")
        for pattern in (r"\.run_worker\(", r"@work\b", r"exit_on_error"):
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(ROOT)}: {pattern}")
    assert not offenders


def test_every_screen_callback_is_reported():
    """A screen's result callback runs on the app's loop: its exception would end the app."""
    import ast

    offenders = []
    for path in (ROOT / "chatui").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "push_screen"):
                continue
            callbacks = node.args[1:] + [k.value for k in node.keywords if k.arg == "callback"]
            for cb in callbacks:
                if not (isinstance(cb, ast.Call) and getattr(cb.func, "id", "")
                        == "reported_callback"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders
