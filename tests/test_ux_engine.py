"""Issue 14, section 1: an engine process that died is restarted (once, said once, with the
loading panel) and the conversation goes on. On main every later message failed with the same
sentence."""

from __future__ import annotations

from chatui.app import ChatApp
from chatui.config import AppConfig
from chatui.widgets.status import LoadingPanel
from inference.scripted import ScriptedFactory
from test_app import SIZE, config_dir, loaded, send, settle  # noqa: F401


async def wait_for(pilot, predicate, what, tries=3000):
    for _ in range(tries):
        if predicate():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"never happened: {what}")


async def test_a_dead_engine_is_restarted_and_the_chat_goes_on():
    app = ChatApp(ScriptedFactory(exit_on="die", isolate=True),
                  config=AppConfig(stable_timings=True))
    first = app.worker
    async with app.run_test(size=SIZE) as pilot:
        await send(pilot, app, "hello")
        await send(pilot, app, "die")
        await wait_for(pilot, lambda: app.worker is not first, "a new worker")
        assert app.chat.query(LoadingPanel) or app.chat.info is not None
        await wait_for(pilot, lambda: app.chat.info is not None, "the engine is back")
        assert not app.chat.query(LoadingPanel)
        assert app.chat.prompt.text == "die"  # the message that failed is given back
        await send(pilot, app, "/clear")  # resets the new engine's cache
        await send(pilot, app, "still here")
        last = app.chat.conversation.entries[-1].reply
        assert last is not None and last.finish_reason == "stop" and "still here" in last.text
        restarts = [n for n in app._notifications if n.title == "Engine restarted"]
        assert len(restarts) == 1
        assert not [n for n in app._notifications if n.severity == "error"]  # said once
    app.worker.close()
