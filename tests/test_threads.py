"""The decode step's thread count, chosen from the steps' own times (``inference.threads``).

A machine whose cores other programs keep busy made two threads 7.7x slower than one (the
module's docstring); a quiet one makes two the faster. The tuner is checked on simulated step
times for both, on a load that comes and goes, and in the engine: the decode loop asks it
before every step, a reply decodes the same tokens and log-probabilities whatever count it
picks, and ``CHATUI_THREADS`` turns it off.
"""

from __future__ import annotations

import pytest
import torch

from inference.threads import ThreadTuner, fixed_threads


class Machine:
    """Step times by thread count; ``applied`` records each count set."""

    def __init__(self, times: dict[int, float]) -> None:
        self.times = times
        self.applied: list[int] = []

    def set(self, n: int) -> None:
        self.applied.append(n)


def run(tuner: ThreadTuner, machine: Machine, steps: int, rows: int = 1) -> list[int]:
    """One reply of ``steps`` decode steps of ``rows`` rows (``machine.times`` holds one
    row's step times; more rows take longer); the count each step ran with."""
    used = []
    tuner.begin()
    for _ in range(steps):
        tuner.before_step()
        n = machine.applied[-1] if machine.applied else tuner.most
        used.append(n)
        tuner.after_step(machine.times[n] * (1 + 0.1 * (rows - 1) * n), rows)
    tuner.end()
    return used


def test_a_busy_machine_goes_down_to_one_thread():
    machine = Machine({2: 0.080, 1: 0.012})
    tuner = ThreadTuner(2, machine.set)
    used = run(tuner, machine, 40)
    assert tuner.current == 1
    assert used[:6] == [2] * 6 and set(used[6:11]) == {1}  # warm-up and probe with 2, then 1
    assert set(used[11:]) == {1}
    assert machine.applied[-1] == 1


def test_a_quiet_machine_keeps_every_thread():
    machine = Machine({2: 0.007, 1: 0.0105})
    tuner = ThreadTuner(2, machine.set)
    used = run(tuner, machine, 40)
    assert tuner.current == 2 and machine.applied[-1] == 2
    assert used.count(1) == tuner.probe + 1  # one comparison's worth of steps with 1
    assert set(used[11:]) == {2}


def test_noise_within_the_margin_does_not_switch():
    machine = Machine({2: 0.010, 1: 0.0095})
    tuner = ThreadTuner(2, machine.set)
    run(tuner, machine, 40)
    assert tuner.current == 2


def test_the_count_goes_back_up_when_the_load_is_gone_and_compares_again_in_long_replies():
    machine = Machine({2: 0.080, 1: 0.012})
    tuner = ThreadTuner(2, machine.set, every=50)
    run(tuner, machine, 20)
    assert tuner.current == 1
    machine.times = {2: 0.007, 1: 0.0105}  # the other programs finished
    used = run(tuner, machine, 100)  # one thread's steps did not change: compared later
    assert tuner.current == 2 and used[-1] == 2 and 30 < used.index(2) < 70
    machine.times = {2: 0.080, 1: 0.012}  # busy again, in the middle of a long reply
    used = run(tuner, machine, 30)
    assert tuner.current == 1 and used[-1] == 1  # the steps' jump compared at once
    assert used.count(2) <= 2 * (tuner.probe + tuner.warmup)


def test_a_load_that_does_not_change_is_compared_ever_more_rarely():
    machine = Machine({2: 0.080, 1: 0.012})
    tuner = ThreadTuner(2, machine.set)
    used = []
    for _ in range(100):
        used += run(tuner, machine, 100)
    assert tuner.current == 1
    assert used.count(2) < 0.01 * len(used)  # the comparisons' slow steps


def test_more_rows_are_not_read_as_more_load():
    """Steps of 8 rows take longer than steps of one (here 2.4x with two threads): replies
    of one row, then of 8, 4 and one in turn compare nothing until the interval is up, while a
    load that comes during 8-row replies is still seen at once."""
    machine = Machine({2: 0.004, 1: 0.0052})
    tuner = ThreadTuner(2, machine.set)
    for _ in range(2):  # a comparison in each (the second after `every` steps), 2 kept
        assert run(tuner, machine, 75).count(1) == tuner.probe + 1
    assert tuner.current == 2 and tuner.interval == 2 * tuner.every
    for rows in (8, 1, 8, 4, 8, 1):  # 60 steps: the interval is not up
        assert run(tuner, machine, 10, rows) == [2] * 10
    machine.times = {2: 0.080, 1: 0.012}  # busy now
    used = run(tuner, machine, 60, rows=8)
    assert tuner.current == 1 and used[-1] == 1


def test_rows_that_end_in_a_comparison_start_it_again():
    """Steps of fewer rows (some rows ended) are not timed against steps of more."""
    machine = Machine({2: 0.007, 1: 0.0105})
    tuner = ThreadTuner(2, machine.set)
    tuner.begin()
    for rows in (8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4):
        tuner.before_step()
        n = machine.applied[-1] if machine.applied else 2
        tuner.after_step(machine.times[n] * rows, rows)
    assert set(tuner._times) == {1, 2} and len(tuner._times[2]) + len(tuner._times[1]) >= 5
    assert tuner._rows == 4  # every timed step is one of 4 rows
    tuner.end()
    assert tuner.current == 2


def test_many_cores_halve_step_by_step():
    machine = Machine({8: 0.050, 4: 0.020, 2: 0.012, 1: 0.016})
    tuner = ThreadTuner(8, machine.set)
    for _ in range(4):
        run(tuner, machine, 30)
    assert tuner.current == 2  # 8 -> 4 -> 2, then 1 and 4 are compared and lose


def test_a_reply_cut_short_in_a_comparison_leaves_the_chosen_count():
    machine = Machine({2: 0.007, 1: 0.0105})
    tuner = ThreadTuner(2, machine.set)
    run(tuner, machine, 7)  # ends while the one-thread steps are being timed
    assert tuner.current == 2 and machine.applied[-1] == 2


def test_one_thread_is_never_tuned():
    machine = Machine({1: 0.01})
    tuner = ThreadTuner(1, machine.set)
    run(tuner, machine, 30)
    assert machine.applied == []


def test_the_user_fixes_the_count():
    assert fixed_threads({}) is None
    assert fixed_threads({"CHATUI_THREADS": "3"}) == 3
    assert fixed_threads({"OMP_NUM_THREADS": "2"}) == 2
    assert fixed_threads({"CHATUI_THREADS": "auto", "OMP_NUM_THREADS": ""}) is None


@pytest.fixture
def torch_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def test_the_engine_tunes_every_decode_step_and_the_reply_does_not_change(
        tiny_ckpt, torch_threads, monkeypatch):
    """The decode loop asks the tuner before each step; a tuner that switches the count at
    every step gives the same tokens and log-probabilities as one thread throughout (int8,
    chatui's kernels: each output element is one thread's sum)."""
    import threading

    from inference.engine import LocalBackend
    from inference.settings import SamplingParams
    from inference.types import GenerationRequest, Message, TokenBatch

    monkeypatch.delenv("CHATUI_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    backend = LocalBackend.from_checkpoint(tiny_ckpt, quantize="int8")
    assert backend.threads is not None and backend.threads.most == 2

    def reply() -> list[tuple[int, float]]:
        backend.reset()
        request = GenerationRequest((Message("user", "hello there, tell me more"),),
                                    (SamplingParams(temperature=0, max_new_tokens=24),),
                                    top_logprobs=3, raw=True)
        return [(t.id, t.logprob) for e in backend.generate(request, threading.Event())
                if isinstance(e, TokenBatch) for t in e.tokens]

    backend.threads = None
    torch.set_num_threads(1)
    fixed = reply()
    counts: list[int] = []

    class Flipping(ThreadTuner):
        def before_step(self) -> None:
            n = 1 + len(counts) % 2
            counts.append(n)
            self.set_threads(n)

    backend.threads = Flipping(2, torch.set_num_threads)
    flipped = reply()
    assert len(fixed) >= 10 and len(counts) >= len(fixed) - 1 and set(counts) == {1, 2}
    assert [t for t, _ in flipped] == [t for t, _ in fixed]
    assert max(abs(a - b) for (_, a), (_, b) in zip(flipped, fixed)) < 1e-6
    assert torch.get_num_threads() == backend.threads.current  # the reply ended: the count chosen


def test_a_fixed_count_is_used_and_not_tuned(tiny_ckpt, torch_threads, monkeypatch):
    from inference.engine import LocalBackend

    torch.set_num_threads(2)
    monkeypatch.setenv("CHATUI_THREADS", "1")
    assert LocalBackend.from_checkpoint(tiny_ckpt).threads is None
    assert torch.get_num_threads() == 1
