"""Stragglers: ranks whose compute time per step stays above the others' (pure).

A rank's compute time at a step runs from the start of the step to its first gradient
collective (reported by :mod:`resilience.agent.step_timer`). Its score is the median of its
last :data:`SMOOTHING` compute times over the median of every rank's: on a shared or busy host
one step of any rank is often twice as long as its neighbours, and a raw per-step ratio lets
such a spike start a false streak or break a real one. A rank scoring above ``factor`` for
``steps`` steps in a row is a straggler; it is reported once per streak (a lasting slow-down is
seen ``SMOOTHING // 2`` steps later than a raw ratio would see it). Steps are judged once every
member has reported them, in order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

ACTIONS = ("none", "replace")
SMOOTHING = 5
"""Steps in each rank's running median: one or two odd steps in five change nothing."""


@dataclass(frozen=True)
class StragglerConfig:
    factor: float = 1.5
    steps: int = 20
    action: str = "none"
    """``replace``: a straggler's node is treated as faulty (drained under Slurm) and replaced by a spare."""

    def __post_init__(self) -> None:
        if self.factor <= 1:
            raise ValueError(f"--straggler-factor {self.factor:g}: must exceed 1")
        if self.steps < 1:
            raise ValueError("--straggler-steps must be at least 1")
        if self.action not in ACTIONS:
            raise ValueError(f"--straggler-action {self.action!r}: one of {', '.join(ACTIONS)}")


@dataclass(frozen=True)
class Straggler:
    rank: int
    score: float
    """Median score over the streak, to 3 decimals: the one figure the event, the message and
    the drain reason all show (one rounding each could print 2.98 in one and 2.99 in another)."""
    step: int
    """The step at which the streak reached ``steps``."""


class StragglerDetector:
    """Fed per-rank reports of one generation; returns stragglers as their streaks complete."""

    def __init__(self, config: StragglerConfig, window: int = 1) -> None:
        """``window``: steps per record (past 512 ranks a record stands for a window of steps:
        :func:`~resilience.contract.messages.record_window`); a streak of ``config.steps`` steps
        is then ``ceil(steps / window)`` records long."""
        self.config = config
        self._streak_records = -(-config.steps // window)
        self.scores: dict[int, float] = {}
        """Each rank's newest score: what metrics show."""
        self._pending: dict[int, dict[int, float]] = {}
        self._streaks: dict[int, list[float]] = {}
        self._recent: dict[int, deque[float]] = {}
        self._judged = -1

    def observe(self, members: set[int], reports: Mapping[int, Mapping[int, float]]) -> list[Straggler]:
        """``reports``: rank -> {step: compute s}; steps already judged are ignored."""
        for rank, steps in reports.items():
            for step, seconds in steps.items():
                if step > self._judged:
                    self._pending.setdefault(step, {})[rank] = seconds
        found = []
        for step in sorted(self._pending):
            times = self._pending[step]
            if not members <= times.keys():
                break
            del self._pending[step]
            self._judged = step
            found += self._judge(step, {r: times[r] for r in members})
        return found

    def _judge(self, step: int, times: Mapping[int, float]) -> list[Straggler]:
        smoothed = {}
        for rank, seconds in times.items():
            recent = self._recent.get(rank)
            if recent is None:
                recent = self._recent[rank] = deque(maxlen=SMOOTHING)
            recent.append(seconds)
            smoothed[rank] = _median(recent)
        median = _median(smoothed.values())
        if median <= 0:
            return []
        found = []
        factor, steps = self.config.factor, self._streak_records
        for rank, seconds in smoothed.items():
            score = seconds / median
            self.scores[rank] = score
            streak = self._streaks.get(rank)
            if streak is None:
                streak = self._streaks[rank] = []
            if score > factor:
                streak.append(score)
                if len(streak) == steps:
                    found.append(Straggler(rank, round(_median(streak), 3), step))
            else:
                streak.clear()
        return found


def _median(values: Iterable[float]) -> float:
    """``statistics.median``'s value, at a third of its cost: it runs once per rank and step (8,192
    times a second at 4,096 ranks of half-second steps)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
