"""The protection budget: how often the RAM and neighbour tiers copy a commit, chosen from what
their copies cost, so that protection takes at most a set share of training time.

Every copy is background work (a snapshot, a checksum, a /dev/shm write, a send to the
neighbour) that competes with training for cores, memory bandwidth and the network. Copying
every commit whatever it costs made a 2-core step 2-3x longer (docs/benchmarks.md); CheckFreq
(FAST '21) picks the cadence online from measured costs, and so does this.

The cost counted is the CPU time of the copying threads, the neighbour server's receipt of
copies included (in a ring each node receives about as many copies as it sends), as if every
second of it were taken from training. Where cores are free it is not, and the cadence is then
more cautious than it need be: say a larger budget there, or 0 to copy every commit whatever it
costs.

Cadences are powers of two, and the protected steps are multiples of the cadence by step
number, so that every rank copies the same steps. Ranks agree on it at every ``WINDOW``-th step:
the largest proposal wins, so that no rank's budget is exceeded. The decisions here are pure;
:class:`CopyCost` is what the copying threads measure into.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

WINDOW = 16
"""Commits between two decisions, and the commits a generation makes before its first: the
first steps (warm-up, page faults, the first copies' buffers) say nothing of the steady cost."""
MAX_EVERY = 64
"""The longest cadence the budget chooses, whatever the copies cost: beyond it a fault redoes
more than a budget saves."""
SETTLE = 0.75
"""A shorter cadence is taken only where it would stay under this share of the budget, so that
a cost measured just under the line does not switch the cadence at every window."""


@dataclass(frozen=True)
class Cadence:
    """What the ranks agreed at one decision."""

    every: int
    """Protected steps are the multiples of this."""
    steps_at_risk: int
    """The most steps a fault redoes when these tiers serve its recovery."""
    overhead: float
    """The share of step time protection takes at this cadence, estimated."""


def choose_every(
    cost_s: float, step_s: float, budget: float, current: int = 1, max_every: int = MAX_EVERY
) -> int:
    """The smallest power-of-two cadence whose overhead (``cost_s`` per protected step over
    ``every`` steps of ``step_s``) is within ``budget``, at most ``max_every``. Pure.

    A budget of 0 protects every commit. A cadence shorter than ``current`` is taken only where
    it stays under ``SETTLE`` of the budget (else the next longer one, never longer than
    ``current``)."""
    if budget <= 0 or cost_s <= 0 or step_s <= 0:
        return 1
    every = 1
    while every < max_every and cost_s / (every * step_s) > budget:
        every *= 2
    if every < current and cost_s / (every * step_s) > SETTLE * budget:
        every = min(current, every * 2)
    return every


def lag_steps(copy_s: float, step_s: float) -> int:
    """Steps that pass while one commit's copies complete (a fault in them finds the one before)."""
    if copy_s <= 0 or step_s <= 0:
        return 0
    return math.ceil(copy_s / step_s)


def steps_at_risk(every: int, lag: int) -> int:
    """The most steps a fault redoes from these tiers: the steps since the last protected one
    (``every - 1``) and those its copy takes to complete (``lag``)."""
    return every - 1 + lag


def decides_at(step: int, commits: int, window: int = WINDOW) -> bool:
    """Whether ranks agree on the cadence at this commit: by step number (every rank commits
    the same steps), once the generation has made ``window`` commits to measure."""
    return commits >= window and step % window == 0


@dataclass(frozen=True)
class Measured:
    """Per protected commit, averaged over the commits since the last look."""

    cpu_s: float
    """The copying threads' CPU time."""
    wall_s: float
    """The copies' own time, one after another (the capture, then each tier's write)."""
    commits: int


class CopyCost:
    """What the copies of commits cost, as the threads doing them measure it."""

    def __init__(
        self,
        cpu: Callable[[], float] = time.thread_time,
        wall: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._cpu, self._wall = cpu, wall
        self._lock = threading.Lock()
        self._cpu_s = self._wall_s = 0.0
        self._commits = 0

    @contextmanager
    def measure(self, wall: bool = True) -> Iterator[None]:
        """Counts the enclosed work of the calling thread (capture, or a lane's write).
        ``wall=False``: its CPU only (a neighbour's receipt, which its sender's push waits for
        and so already counts in the copies' time)."""
        cpu, started = self._cpu(), self._wall()
        try:
            yield
        finally:
            cpu_s, wall_s = self._cpu() - cpu, self._wall() - started
            with self._lock:
                self._cpu_s += cpu_s
                self._wall_s += wall_s if wall else 0.0

    def protected(self) -> None:
        """One more commit captured for the tiers."""
        with self._lock:
            self._commits += 1

    def take(self) -> Measured | None:
        """The cost per protected commit since the last take; None when none was protected."""
        with self._lock:
            if not self._commits:
                return None
            got = Measured(self._cpu_s / self._commits, self._wall_s / self._commits, self._commits)
            self._cpu_s = self._wall_s = 0.0
            self._commits = 0
            return got
