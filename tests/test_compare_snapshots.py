"""Snapshot tests of compare mode (scripted engine): three columns side by side after a
comparison, and the compare screen. ``CHATUI_UPDATE_SNAPSHOTS=1`` rewrites them."""

from __future__ import annotations

import pytest

from test_snapshots import snapshot


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))


async def _submit(pilot, text: str) -> None:
    app = pilot.app
    app.chat.prompt.text = text
    await pilot.press("enter")
    for _ in range(300):
        if not app.chat.generating:
            break
        await pilot.pause(0.01)
    await app.workers.wait_for_complete()


async def test_compare_columns():
    async def run_before(pilot):
        # arm three columns, then send the prompt they all answer
        await _submit(pilot, "/compare temperature=0 | temperature=0.7 top_p=0.9 | "
                             "temperature=1.2 seed=7")
        await _submit(pilot, "Compare us")
        await pilot.press("f6")  # continue with column 2 (the next one)
    await snapshot("compare_columns", run_before)


async def test_compare_screen():
    async def run_before(pilot):
        await _submit(pilot, "/compare")  # no argument: the compare screen
        pilot.app.screen.query_one("#preset-name").value = "fast-vs-creative"
    await snapshot("compare_screen", run_before)
