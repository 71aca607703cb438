"""The async worker: events cross from the engine thread in groups, errors come back as
events, cancellation, and the worker stays usable."""

from __future__ import annotations

import asyncio
import threading
import time

from inference.scripted import ScriptedBackend
from inference.settings import SamplingParams
from inference.types import (Failed, GenerationRequest, Message, Progress, RowDone, Started,
                             Token, TokenBatch)
from inference.worker import InferenceWorker, merge_batches

REQ = GenerationRequest((Message("user", "hello"),), (SamplingParams(temperature=0),))


class Exploding(ScriptedBackend):
    def generate(self, request, cancel):
        if request.messages[-1].content == "boom":
            yield Started(1, 1, 0)
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        yield from super().generate(request, cancel)


class Refusing(ScriptedBackend):
    """A backend without batching (as the OpenAI one is) that fails one request."""

    def generate(self, request, cancel):
        if request.messages[-1].content == "no":
            yield Started(1, 1, 0)
            yield Failed("The server refused this one.", ("par",))
            return
        yield from super().generate(request, cancel)


async def test_a_batch_one_by_one_answers_the_rows_after_a_failed_one():
    """``generate_batch`` over a backend without batching: a request that fails ends as its
    row's ``RowDone`` with the sentence and the partial text, and the next ones are still
    asked (the first failure ended the batch, and `chatui batch` wrote nothing)."""
    w = InferenceWorker(lambda progress: Refusing())
    await w.load().collect()
    reqs = [GenerationRequest((Message("user", m),), (SamplingParams(temperature=0),))
            for m in ("hello", "no", "hi")]
    events = await w.generate_batch(reqs).collect()
    done = {e.row: e for e in events if isinstance(e, RowDone)}
    assert not any(isinstance(e, Failed) for e in events)
    assert (done[1].finish_reason, done[1].error, done[1].text) == (
        "error", "The server refused this one.", "par")
    assert done[0].finish_reason != "error" and done[2].finish_reason != "error"
    assert done[0].text and done[2].text
    await w.aclose()


async def test_load_reports_progress_then_info():
    def factory(progress):
        for i in range(3):
            progress(Progress("Loading", i, 3))
        return ScriptedBackend()

    w = InferenceWorker(factory)
    events = await w.load().collect()
    assert [e.done for e in events if isinstance(e, Progress)] == [0, 1, 2]
    assert w.info is not None and w.info.backend == "scripted"
    await w.aclose()


async def test_load_failure_is_one_sentence():
    class Bad(Exception):
        user_message = "No such file or directory: /x."

    def factory(progress):
        raise Bad()

    w = InferenceWorker(factory)
    events = await w.load().collect()
    assert events == [Failed("No such file or directory: /x.")]
    await w.aclose()


async def test_a_user_error_at_load_logs_no_traceback_and_a_bug_does(caplog):
    """A wrong --quantize is the user's: one sentence, no ``ERROR ... Traceback`` on stderr
    before it (issue 14); a real bug keeps its logged traceback."""
    import logging

    from inference.runner import RunnerError

    def wrong_choice(progress):
        raise RunnerError("--quantize int8 needs the fast runner, which cannot run this model "
                          "(gpt2); use --quantize none.")

    def bug(progress):
        return {}["missing"]

    with caplog.at_level(logging.INFO, logger="inference.worker"):
        w = InferenceWorker(wrong_choice)
        assert await w.load().collect() == [Failed(
            "--quantize int8 needs the fast runner, which cannot run this model (gpt2); use "
            "--quantize none.")]
        await w.aclose()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Traceback" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="inference.worker"):
        w = InferenceWorker(bug)
        [failed] = await w.load().collect()
        await w.aclose()
    assert isinstance(failed, Failed) and "KeyError" in failed.message
    assert any(r.levelno == logging.ERROR and "Traceback" in r.getMessage()
               for r in caplog.records)


def _leak_stop_iteration(backend):
    return next(iter(()))


async def test_a_call_that_leaks_stop_iteration_fails_instead_of_hanging():
    """asyncio refuses StopIteration as a future's exception; the call must still end."""
    from inference.worker import WorkerError

    w = InferenceWorker(lambda p: ScriptedBackend())
    await w.load().collect()
    try:
        await asyncio.wait_for(w.call(_leak_stop_iteration), 10)
    except WorkerError as exc:
        assert "StopIteration" in str(exc)
    else:
        raise AssertionError("no error")
    assert await asyncio.wait_for(w.count_tokens((Message("user", "hi"),)), 10) > 0
    await w.aclose()


async def test_an_isolated_call_that_leaks_stop_iteration_fails_instead_of_hanging():
    from inference.scripted import ScriptedFactory
    from inference.worker import WorkerError

    w = InferenceWorker(ScriptedFactory(), isolate=True)
    await w.load().collect()
    try:
        await asyncio.wait_for(w.call(_leak_stop_iteration), 60)
    except WorkerError as exc:
        assert "StopIteration" in str(exc)
    else:
        raise AssertionError("no error")
    await w.aclose()


def test_the_executor_refuses_an_unknown_job_kind():
    import pytest

    from inference.worker.executor import Executor, WorkerError

    with pytest.raises(WorkerError, match="unknown job kind 'train'"):
        Executor(lambda p: ScriptedBackend()).run("train", (), threading.Event(), print)


async def test_errors_come_back_as_events_and_the_worker_stays_usable():
    w = InferenceWorker(lambda p: Exploding())
    await w.load().collect()
    bad = GenerationRequest((Message("user", "boom"),))
    events = await w.generate(bad).collect()
    assert isinstance(events[-1], Failed) and "ran out of memory" in events[-1].message
    events = await w.generate(REQ).collect()
    assert isinstance(events[-1], RowDone) and events[-1].finish_reason == "stop"
    await w.aclose()


async def test_slow_consumer_never_stalls_the_engine():
    backend = ScriptedBackend(lambda r, i: "word " * 300)
    w = InferenceWorker(lambda p: backend)
    await w.load().collect()
    stream = w.generate(REQ)
    groups = 0
    tokens = 0
    t0 = time.perf_counter()
    async for group in stream:
        groups += 1
        tokens += sum(len(e.tokens) for e in group if isinstance(e, TokenBatch))
        await asyncio.sleep(0.05)  # a consumer far slower than the engine
    assert tokens >= 300
    assert groups < 30  # tokens arrived merged, not one wake-up per token
    assert time.perf_counter() - t0 < 5
    await w.aclose()


async def test_cancel_keeps_the_partial_reply():
    w = InferenceWorker(lambda p: ScriptedBackend(lambda r, i: "tok " * 500, delay_s=0.005))
    await w.load().collect()
    stream = w.generate(REQ)
    text = ""
    done = None
    async for group in stream:
        for e in group:
            if isinstance(e, TokenBatch):
                text += "".join(t.text for t in e.tokens)
                if len(text) > 20:
                    stream.cancel()
            elif isinstance(e, RowDone):
                done = e
    assert done is not None and done.finish_reason == "cancelled"
    assert done.text == text and 20 < len(text) < 2000
    await w.aclose()


async def test_calls_run_on_the_worker_thread():
    w = InferenceWorker(lambda p: ScriptedBackend())
    await w.load().collect()
    name = await w.call(lambda b: threading.current_thread().name)
    assert name == "chatui-inference" != threading.current_thread().name
    assert await w.count_tokens((Message("user", "a b c"),)) > 0
    await w.aclose()


def test_merge_batches_keeps_row_order():
    from inference.types import Token

    t = lambda i: Token(i, i, str(i), -1.0, 0.0)  # noqa: E731
    merged = merge_batches([TokenBatch(0, (t(0),)), TokenBatch(0, (t(1),)), TokenBatch(1, (t(0),)),
                            TokenBatch(0, (t(2),))])
    assert [(m.row, len(m.tokens)) for m in merged] == [(0, 2), (1, 1), (0, 1)]


# ---- isolated mode: the engine in a child process ----

from inference.scripted import ScriptedFactory, echo_reply  # noqa: E402


async def test_isolated_worker_streams_cancels_and_calls(tmp_path):
    w = InferenceWorker(ScriptedFactory(delay_s=0.002), isolate=True,
                        log_file=tmp_path / "engine.log")
    assert w.isolated
    await w.load().collect()
    assert w.info is not None and w.info.backend == "scripted"
    events = await w.generate(REQ).collect()
    assert isinstance(events[0], Started) and isinstance(events[-1], RowDone)
    assert events[-1].text == echo_reply(REQ, 0)
    assert await w.count_tokens((Message("user", "a b c"),)) > 0
    await w.reset()
    pid = await w.call(_pid)
    import os
    assert pid != os.getpid()
    await w.aclose()


async def test_closing_an_isolated_worker_stops_a_running_reply():
    import time

    w = InferenceWorker(ScriptedFactory(reply=_long_reply, delay_s=0.01), isolate=True)
    await w.load().collect()
    stream = w.generate(REQ)
    async for group in stream:
        break  # it is streaming now (2000 tokens would take 20 s)
    t0 = time.perf_counter()
    await w.aclose()
    assert time.perf_counter() - t0 < 5


async def test_the_isolated_worker_freezes_the_loaded_heap():
    """The engine's process moves what the load left alive out of the collector's view
    (``heap.settle_heap``), so a reply's events do not make it walk the model's objects
    again and again; the UI's process (the thread host here) is left alone."""
    import gc

    w = InferenceWorker(ScriptedFactory(), isolate=True)
    await w.load().collect()
    assert await w.call(_frozen) > 1000
    await w.aclose()
    before = gc.get_freeze_count()
    t = InferenceWorker(ScriptedFactory(), isolate=False)
    await t.load().collect()
    assert gc.get_freeze_count() == before
    await t.aclose()


async def test_a_headless_command_settles_its_heap_after_the_load(monkeypatch):
    """A headless command's engine runs in its own process (the thread host, no UI): that
    process's heap is settled after the load as the isolated worker's is (a compiled model on
    a GPU left the collector enough to walk that a batched run of ``chatui bench --compare``
    took 0.4-1.7 s where the others took 0.25)."""
    import gc

    from chatui.cli import headless

    monkeypatch.setattr(headless, "check_local_spec", lambda opts: None)
    monkeypatch.setattr(headless, "make_factory", lambda opts: ScriptedFactory())
    gc.unfreeze()
    try:
        w = await headless.load(object(), quiet=True)
        assert gc.get_freeze_count() > 1000
        await w.aclose()
    finally:
        gc.unfreeze()


def _frozen(backend):
    import gc
    return gc.get_freeze_count()


def _pid(backend):
    import os
    return os.getpid()


async def test_isolated_worker_cancel_within_a_step():
    w = InferenceWorker(ScriptedFactory(reply=_long_reply, delay_s=0.01), isolate=True)
    await w.load().collect()
    stream = w.generate(REQ)
    n = 0
    done = None
    async for group in stream:
        for e in group:
            if isinstance(e, TokenBatch):
                n += len(e.tokens)
                if n >= 5:
                    stream.cancel()
            elif isinstance(e, RowDone):
                done = e
    assert done is not None and done.finish_reason == "cancelled"
    assert done.usage.completion_tokens < 100
    await w.aclose()


def _long_reply(request, row):
    return "tok " * 2000


async def test_isolated_worker_reports_a_crash_and_never_hangs():
    w = InferenceWorker(ScriptedFactory(exit_on="die"), isolate=True)
    await w.load().collect()
    events = await w.generate(GenerationRequest((Message("user", "die"),))).collect()
    assert isinstance(events[-1], Failed) and "stopped unexpectedly" in events[-1].message
    events = await w.generate(REQ).collect()  # later requests fail cleanly, never hang
    assert isinstance(events[-1], Failed)
    await w.aclose()


def test_isolated_worker_starts_when_a_ui_has_replaced_stderr():
    """Textual swaps sys.stderr for an object with no file descriptor; multiprocessing's
    helper process must still start (checked in a fresh interpreter, where it starts first)."""
    import subprocess
    import sys

    code = """
import asyncio, sys
from inference.scripted import ScriptedFactory
from inference.worker import InferenceWorker
from inference.types import GenerationRequest, Message, RowDone

class Captured:
    def write(self, text): return len(text)
    def flush(self): pass
    def fileno(self): return -1

async def main():
    sys.stderr = Captured()
    w = InferenceWorker(ScriptedFactory(), isolate=True)
    await w.load().collect()
    events = await w.generate(GenerationRequest((Message("user", "hi"),))).collect()
    await w.aclose()
    print("OK" if isinstance(events[-1], RowDone) else events)

asyncio.run(main())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "OK", r.stdout + r.stderr


def test_engine_process_sender_groups_a_fast_stream_and_sends_a_lone_event_at_once():
    """The child's sender wakes the UI process at most once per SEND_INTERVAL_S (50 ms, as the
    README says)."""
    import time as _time

    from inference.worker.process_host import SEND_INTERVAL_S, _Sender

    assert SEND_INTERVAL_S == 0.05

    class Conn:
        def __init__(self):
            self.sent = []

        def send(self, msg):
            self.sent.append((_time.monotonic(), msg))

    conn = Conn()
    sender = _Sender(conn)
    t0 = _time.monotonic()
    sender.put(1, "first")
    while not conn.sent and _time.monotonic() - t0 < 2:
        _time.sleep(0.001)
    assert conn.sent[0][1] == (1, "events", ["first"])
    assert conn.sent[0][0] - t0 < SEND_INTERVAL_S  # nothing pending before: sent at once
    for i in range(200):  # a 2,000 tok/s stream for 0.1 s
        sender.put(1, i)
        _time.sleep(0.0005)
    sender.put(1, None)
    deadline = _time.monotonic() + 2
    while _time.monotonic() < deadline and (not conn.sent or conn.sent[-1][1][2][-1] is not None):
        _time.sleep(0.005)
    items = [x for _, (_, _, group) in conn.sent[1:] for x in group]
    assert items == list(range(200)) + [None]  # nothing lost, order kept
    gaps = [b[0] - a[0] for a, b in zip(conn.sent, conn.sent[1:])]
    assert len(conn.sent) < 40 and min(gaps) >= SEND_INTERVAL_S * 0.9
    # a reply's first tokens go at once, however recent the last message
    sender.put(2, "started")
    t1 = _time.monotonic()
    sender.put(2, TokenBatch(0, (Token(7, None, "Hi", -0.1, 0.1),)))
    while _time.monotonic() - t1 < 2 and not any(
            any(isinstance(x, TokenBatch) for x in msg[2]) for _, msg in conn.sent if msg[0] == 2):
        _time.sleep(0.001)
    assert _time.monotonic() - t1 < SEND_INTERVAL_S * 0.6
