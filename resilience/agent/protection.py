"""The protection budget's executor in each rank: at every decision step, this rank's proposal
from the copies' measured cost, the group's agreement, the saver's new cadence.

The decisions are :mod:`resilience.tiers.budget`'s. The agreement is one all-reduce of three
integers on the generation's gloo state group, every ``WINDOW`` steps, at a commit every rank
makes: the largest cadence wins (no rank's budget is exceeded), and the largest lag and cost,
so that the steps at risk and the overhead said are true for every rank.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from resilience.tiers import budget
from resilience.tiers.budget import Cadence, Measured
from resilience.tiers.saver import TierSaver

Emit = Callable[..., None]
"""``EventChannel.push``: an event for the run's events.jsonl."""


class Protection:
    """One rank's side of the budget, for the life of the process."""

    def __init__(self, saver: TierSaver, emit: Emit) -> None:
        self.saver = saver
        self.emit = emit
        self.share = saver.config.budget if saver.config.budgeted else 0.0
        self.measured: Measured | None = None
        """The last measure: a window without a protected commit (cadence above the window)
        keeps it."""
        self.agreed: Cadence | None = None

    def enter(self, group: dist.ProcessGroup) -> None:
        """Collective on the new generation's ``group``: every rank takes the largest cadence
        any rank holds. Survivors keep what they agreed (the copies cost what they cost before);
        a process new to the run (a replacement, a restart) holds 1 until then, and copying
        other steps than its peers would leave the RAM tier without a step common to all. Its
        first decision says the cadence again."""
        if not self.share:
            return
        agreed = torch.tensor([self.saver.every], dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        self.saver.every = int(agreed.item())
        self.agreed = None

    def due(self, step: int, commits: int) -> bool:
        """Whether this commit is a decision (the same answer on every rank): the caller then
        clears the state group and calls :meth:`at_commit`."""
        return bool(self.share) and budget.decides_at(step, commits)

    def at_commit(self, step: int, step_times: Sequence[float], group: dist.ProcessGroup, rank: int) -> None:
        """Collective on ``group``: every rank calls it at each commit :meth:`due` names."""
        self.measured = self.saver.cost.take() or self.measured
        step_s = statistics.median(step_times[-budget.WINDOW :]) if step_times else 0.0
        every, lag = self.saver.every, 0
        cost_s = self.measured.cpu_s if self.measured is not None else 0.0
        if self.measured is not None and step_s > 0:
            every = budget.choose_every(cost_s, step_s, self.share, self.saver.every)
            lag = budget.lag_steps(self.measured.wall_s, step_s)
        agreed = torch.tensor([every, lag, round(cost_s * 1e6)], dtype=torch.int64)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
        every, lag, cost_us = (int(v) for v in agreed.tolist())
        cost_s = cost_us / 1e6  # the slowest rank's
        overhead = cost_s / (every * step_s) if step_s else 0.0
        cadence = Cadence(every, budget.steps_at_risk(every, lag), overhead)
        self.saver.every = every
        changed = self.agreed is None or (self.agreed.every, self.agreed.steps_at_risk) != (
            every,
            cadence.steps_at_risk,
        )
        self.agreed = cadence
        if rank == 0 and changed:
            self.emit(
                "protection",
                step=step,
                every=every,
                steps_at_risk=cadence.steps_at_risk,
                overhead=round(cadence.overhead, 4),
                budget=self.share,
                cost_s=round(cost_s, 6),
                step_s=round(step_s, 6),
            )
