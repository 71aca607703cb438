"""How many threads a CPU decode step uses, chosen by timing the steps themselves.

Every CPU kernel (chatui's int8/int4/attention kernels and torch's own ops) splits a decode
step over torch's threads, and each step meets at a barrier a few times per layer. When other
programs keep the cores busy (a build, a browser, another model), one of those threads is
often descheduled and every barrier waits a scheduler tick for it: measured on this 2-core
machine at load 4-5 (three other jobs), ``chatui bench --new-tokens 48`` on the default model
decoded **9.1 tok/s with 2 threads against 69.9 tok/s with 1** (7.7x slower for the extra
thread), while on the quiet machine 2 threads are the faster (~140 against ~95 tok/s). No fixed
count is right for both, so the decode loop asks :class:`ThreadTuner` before each step and
reports how long it took: at the start of every reply, and again every :attr:`every` steps, it
times a few steps with the current count and a few with half of it (or double, after halving
lost), and keeps the faster (by at least :attr:`margin`).

The result does not depend on the count: chatui's kernels give each output element to one
thread (the same sums in the same order whatever the split), and greedy replies with 1 and 2
threads give the same log-probabilities to the last digit (``chatui generate --temperature 0
--json`` with ``OMP_NUM_THREADS=1`` and ``=2``). ``CHATUI_THREADS=N`` (or ``OMP_NUM_THREADS``)
fixes the count and turns the tuning off; a CUDA device is never tuned.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

ENV = "CHATUI_THREADS"


def fixed_threads(environ: dict[str, str] | None = None) -> int | None:
    """The count the user fixed (``CHATUI_THREADS``, else ``OMP_NUM_THREADS``), or None."""
    env = os.environ if environ is None else environ
    for name in (ENV, "OMP_NUM_THREADS"):
        value = env.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


@dataclass
class ThreadTuner:
    """Chooses the thread count of each decode step from the steps' own times.

    ``most``: the count to start from and never exceed (torch's at start-up); ``set_threads``
    applies a count (``torch.set_num_threads``). Call :meth:`begin` when a reply starts, then
    :meth:`before_step` before each step and :meth:`after_step` with its seconds, and
    :meth:`end` when the reply ends.

    When to compare: at the first reply; then after :attr:`interval` decode steps, which
    starts at :attr:`every` and doubles (up to :attr:`longest`) each time the other count
    loses, so a machine whose load does not change pays for a comparison ever more rarely
    (each costs at most :attr:`probe` + 1 steps with the slower count, two when it is
    clearly slower); and sooner when the steps' time moves by :attr:`jump` from what the
    last comparison measured (another program started or ended). A step's time depends on
    its rows (a comparison's 8 rows take 1.6x one row's time on this 2-core machine), so
    steps are compared only with steps of as many rows: the load watch keeps a reference
    time for each row count, and a comparison whose rows change starts again. (Watching one
    reference for all, a comparison of 8 rows after a reply of one read as a load that
    came: 4 and 8 rows paid a comparison's 5 one-thread steps at most replies, each 1.5-2x a
    two-thread step, about 3 % of their time in ``chatui bench --compare``.)
    """

    most: int
    set_threads: Callable[[int], None]
    probe: int = 4
    """Steps timed with each of the two counts compared (after :attr:`warmup`)."""
    warmup: int = 2
    """Steps of a comparison not timed: the first steps of a reply pay for caches."""
    every: int = 64
    """Decode steps between two comparisons after one that changed the count."""
    longest: int = 4096
    """The most steps between two comparisons."""
    margin: float = 0.9
    """The other count is kept when its median step takes less than this share of the
    current one's (so noise does not flip the count back and forth)."""
    jump: float = 1.5
    """Steps this many times slower (with more than one thread) than the last comparison
    measured compare again :attr:`every` steps after it; this many times faster (with fewer
    than the most), :attr:`every` steps from now at the latest. (A busy machine's step times
    vary by 2-3x from one moment to the next, so neither waits less.)"""
    give_up: float = 3.0
    """A step with the other count this many times the current count's median ends the
    comparison at once (the first one too, though it may also pay for waking threads):
    measured on this 2-core machine at load 5, two threads' steps took from 23 ms to 2.7 s
    each against one thread's 8-31 ms."""
    current: int = field(init=False)
    interval: int = field(init=False, default=0)
    _phase: str = field(init=False, default="idle")
    _left: int = field(init=False, default=0)
    _other: int = field(init=False, default=0)
    _times: dict[int, list[float]] = field(init=False, default_factory=dict)
    _since: int = field(init=False, default=0)
    _down: bool = field(init=False, default=True)
    _references: dict[int, float] = field(init=False, default_factory=dict)
    """A step's time by its rows, with the current count (what the load watch compares to)."""
    _recent: list[float] = field(init=False, default_factory=list)
    _recent_rows: int = field(init=False, default=0)
    _rows: int = field(init=False, default=0)
    """The rows of the steps the comparison under way times."""

    def __post_init__(self) -> None:
        self.most = max(1, self.most)
        self.current = self.most

    @property
    def enabled(self) -> bool:
        return self.most > 1

    def _candidate(self) -> int:
        """The count compared with :attr:`current`: half of it while halving won (or nothing
        was tried yet), double it after halving lost; the other way at either end."""
        down = self._down
        if self.current <= 1:
            down = False
        elif self.current >= self.most:
            down = True
        return max(1, self.current // 2) if down else min(self.most, self.current * 2)

    def begin(self) -> None:
        """A reply starts: compare when it is time (see the class docstring)."""
        self._recent.clear()
        if self.enabled and self._phase == "idle" and self._since >= self.interval:
            self._start_comparison()

    def end(self) -> None:
        """A reply ended (perhaps in the middle of a comparison): back to the chosen count,
        which the next prompt's prefill uses; a comparison cut short starts again later."""
        if self.enabled:
            if self._phase != "idle":
                self._phase = "idle"
                self._since = self.interval  # compare at the next reply
            self.set_threads(self.current)

    def _start_comparison(self, rows: int = 0) -> None:
        self._other = self._candidate()
        self._times = {self.current: [], self._other: []}
        self._phase, self._left, self._rows = "warm", self.warmup, rows

    def before_step(self) -> None:
        """Set the count for the step about to run."""
        if not self.enabled:
            return
        if self._phase == "idle" and self._since >= self.interval:
            self._start_comparison()
        self.set_threads(self._other if self._phase == "other" else self.current)

    def after_step(self, seconds: float, rows: int = 1) -> None:
        """The step just run, of ``rows`` rows, took ``seconds`` (wall clock: what the user
        waits)."""
        if not self.enabled:
            return
        if self._phase == "idle":
            self._since += 1
            self._watch(seconds, rows)
            return
        if rows != self._rows:
            if self._rows:  # rows ended mid-comparison: time like steps again
                self._start_comparison(rows)
                return
            self._rows = rows
        if self._phase == "warm":
            self._left -= 1
            if self._left <= 0:
                self._phase, self._left = "current", self.probe
            return
        threads = self._other if self._phase == "other" else self.current
        self._times[threads].append(seconds)
        self._left -= 1
        if (self._phase == "other"
                and seconds > self.give_up * statistics.median(self._times[self.current])):
            self._decide()  # a clear loser: no more of its (perhaps very slow) steps
            return
        if self._left > 0:
            return
        if self._phase == "current":
            # the other count's first step pays for waking (or parking) threads: timed, not
            # counted in its median
            self._phase, self._left = "other", self.probe + 1
            return
        self._decide()

    def _watch(self, seconds: float, rows: int) -> None:
        """Compare again at once when the steps' time moved (the machine's load changed)."""
        recent = self._recent
        if rows != self._recent_rows:
            recent.clear()
            self._recent_rows = rows
        recent.append(seconds)
        if len(recent) < 2 * self.probe:
            return
        now = statistics.median(recent)
        recent.clear()
        reference = self._references.get(rows)
        if reference is None:  # the first steps of this many rows since the count was set
            self._references[rows] = now
            return
        slower = now > self.jump * reference and self.current > 1
        faster = now * self.jump < reference and self.current < self.most
        if slower:  # fewer threads may help: soon (each step with too many costs most)
            self.interval = min(self.interval, self.every)
            self._down = True
        elif faster:  # more threads may help: sooner (one thread costs a factor under 2)
            self.interval = max(self.every, min(self.interval, self._since + self.every))
            self._down = False

    def _decide(self) -> None:
        mine = statistics.median(self._times[self.current])
        other = self._times[self._other]
        theirs = statistics.median(other[1:] or other)  # (the first step woke its threads)
        if theirs < self.margin * mine:
            self._down = self._other < self.current  # go on the way that won
            self.current = self._other
            self._references = {self._rows: theirs}  # (other rows' were of the old count)
            self.interval = self.every
        else:
            self._down = self._other > self.current  # try the other way next time
            self._references[self._rows] = mine
            self.interval = min(self.longest, max(self.every, 2 * self.interval))
        self.set_threads(self.current)
        self._phase = "idle"
        self._since = 0
        self._recent.clear()
