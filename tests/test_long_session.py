"""A long session stays light (issue 21): a finished reply keeps few objects alive, and nothing
that dies stays frozen where the garbage collector never looks again.

The session is the one ``benchmarks/bench_long.py`` runs: scripted replies of ~330 tokens of
Markdown in the app under the pilot. Objects alive are those the collector tracks after a full
collection plus those frozen (``gc.freeze``): a policy that freezes garbage only hides it.
"""

from __future__ import annotations

import gc
import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_long.py"

KEPT_PER_REPLY = 3_000
"""Objects a finished reply may keep alive (issue 21; today about 21,000-23,000)."""


def _bench():
    sys.path.insert(0, str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("bench_long", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_long"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATUI_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("CHATUI_DATA_DIR", str(tmp_path / "data"))


async def test_a_finished_reply_keeps_few_objects_alive():
    """Checked after 20 replies (over replies 10-20) and after 40 (over 20-40); failing at 20
    stops the run early (today's code takes ~4 times as long for 40 replies as for 20: every
    reply restyles every widget of the conversation)."""
    bench = _bench()
    seen: dict[int, object] = {}
    dead_frozen: list[int] = []

    def check(sample) -> None:
        seen[sample.replies] = sample
        for a, b in ((10, 20), (20, 40)):
            if sample.replies == b:
                start = seen[a]
                per_reply = (sample.alive - start.alive) / (b - a)  # type: ignore[attr-defined]
                assert per_reply <= KEPT_PER_REPLY, (
                    f"each reply from the {a}th to the {b}th kept {per_reply:,.0f} objects "
                    f"alive ({start.alive:,} after {a} replies, {sample.alive:,} after {b})")  # type: ignore[attr-defined]

    def frozen_garbage(app: object) -> None:
        gc.collect()
        gc.unfreeze()  # what was frozen and has died since is found now
        dead_frozen.append(gc.collect())

    await bench.run_session(40, every=10, measure_last=False, clear=False, scroll=False,
                            terminal=False, on_sample=check, inspect=frozen_garbage)
    assert set(seen) >= {20, 40}
    assert dead_frozen[0] < 100, f"{dead_frozen[0]:,} frozen objects had died"


async def test_full_collections_wait_from_the_moment_a_reply_is_asked_for():
    """The submit's own allocations once set off the full collection that was due (200-600
    ms after 200 replies) just as the reply began: the policy holds from ``start_reply``,
    before the reply's worker runs, until the reply has ended."""
    from chatui import gcpolicy
    from test_app import make_app, send, settle

    app = make_app(lambda request, row: "a short answer", delay_s=0.01)
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, app, "first")
        chat = app.chat
        assert not gcpolicy.streaming()
        threshold = gc.get_threshold()
        entry = chat.conversation.add_user("second")
        chat._mount_user(entry)
        chat.answer("second")  # no await: the reply's worker has not run yet
        assert gcpolicy.streaming() and gc.get_threshold()[2] == gcpolicy.DEFERRED
        await settle(pilot, app)
        assert not gcpolicy.streaming() and gc.get_threshold() == threshold
