"""Each rank's compute time per step, for straggler detection and the run report.

In synchronous data parallelism every rank's step takes as long as the slowest one's, so a
step's wall time cannot point at a straggler; the time a rank takes *before* its first
gradient collective can. The collectives of ``resilience.ddp``, exact mode and plain DDP under
``resilience.run`` (the deterministic hook) call :func:`collective_started`; a rank whose
gradients are reduced by code of its own reports its time to the commit instead (then every
rank looks alike). Ranks send their new steps in small batches up their liveness connection (to
the store where there is none); the supervisor reads them about once a second.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

from resilience.contract.link import RankLink
from resilience.contract.messages import RecentSteps, StepRecord
from resilience.contract.run_store import RunStore

REPORT_EVERY = 5
"""Steps per report of a rank at least: one small write per 5 steps costs nothing measurable.
In a large run a report also waits for the rank's beat period (``every_s``): at 4,096 ranks of
half-second steps, one report per 5 steps was 1,600 lines a second for the supervisor to read."""
KEEP = 64
"""Steps a report carries: the supervisor, reading once a second, sees every step of ranks
doing up to ~60 steps per second."""

_active: "StepTimer | None" = None


def collective_started() -> None:
    """Called by gradient collectives: the first call of a step ends the rank's compute."""
    timer = _active
    if timer is not None and timer.collective_t is None:
        timer.collective_t = timer.clock()


class StepTimer:
    def __init__(
        self,
        store: RunStore,
        slot: str,
        generation: int,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
        link: RankLink | None = None,
        every_s: float = 0.0,
        window: int = 1,
    ) -> None:
        self.store, self.slot, self.generation, self.clock, self.wall = store, slot, generation, clock, wall
        self.link = link
        """Where there is one, only the steps since the last report go up it (no store request)."""
        self.every_s = every_s
        """Seconds between two reports at least (the rank's beat period)."""
        self.window = window
        """Steps per record sent (:func:`~resilience.contract.messages.record_window`): a window
        goes up once its last step (a multiple of it) is committed, or at the generation's end."""
        self._reported_t = clock()
        self.start_t: float | None = None
        self.collective_t: float | None = None
        self.recent: list[StepRecord] = []
        self.blocked_s = 0.0
        self._boundary_s = 0.0
        self._since_report = 0
        self._last_end: float | None = None

    def activate(self) -> None:
        global _active
        _active = self

    def deactivate(self) -> None:
        global _active
        if _active is self:
            _active = None

    def step_started(self) -> None:
        self.start_t, self.collective_t = self.clock(), None
        self.blocked_s, self._boundary_s = self._boundary_s, 0.0

    def blocked(self, seconds: float) -> None:
        """Time this step's commit waited for the previous commit's snapshot or tier copy."""
        self.blocked_s += seconds

    def blocked_at_boundary(self, seconds: float) -> None:
        """Time the step boundary waited for the previous commit's buddy round, before the next
        step starts: counted with that step's (its wall time from the last commit holds it)."""
        self._boundary_s += seconds

    def step_committed(self, step: int) -> float | None:
        """Record the step; returns its time from the previous commit (or its start)."""
        if self.start_t is None:
            return None
        now = self.clock()
        compute = (self.collective_t if self.collective_t is not None else now) - self.start_t
        wall = now - (self._last_end if self._last_end is not None else self.start_t)
        self._last_end, self.start_t = now, None
        record = StepRecord(step, round(compute, 6), round(wall, 6), self.wall(), round(self.blocked_s, 6))
        self.recent = self.recent[-(KEEP - 1) :] + [record]  # rounded here, on the rank's own cores
        self._since_report += 1
        if self._since_report >= REPORT_EVERY and now - self._reported_t >= self.every_s:
            self.publish(whole_windows_only=True)
        return wall

    def publish(self, whole_windows_only: bool = False) -> None:
        """Best effort: timing is never worth failing a step or a teardown for. In a large run
        (``window`` > 1) a periodic report sends only whole windows; the generation's end sends
        what is left."""
        if not (self.recent and self._since_report):
            return
        unsent = self.recent[-self._since_report :]
        new, left = windows(unsent, self.window, whole_windows_only)
        if not new:
            return
        try:
            if self.link is not None:
                self.link.steps(self.generation, RecentSteps(tuple(new)))
            else:
                kept = self.recent[: len(self.recent) - len(unsent)]
                sent = windows(kept, self.window, False)[0] + new  # a window of 1: self.recent
                self.store.progress.publish_steps(self.generation, self.slot, RecentSteps(tuple(sent)))
        except (RuntimeError, OSError):  # the store (or the supervisor) is going away with the run
            return
        self._since_report, self._reported_t = left, self.clock()

    def median_compute(self, last: int = 10) -> float | None:
        values = sorted(r.compute_s for r in self.recent[-last:])
        return values[len(values) // 2] if values else None


def windows(records: list[StepRecord], window: int, whole_only: bool) -> tuple[list[StepRecord], int]:
    """``records`` as sent: each window of ``window`` steps (ending at a multiple of it) summed
    into one record, and how many records are left unsent (a window not yet whole, when
    ``whole_only``). A window of 1 is the records themselves."""
    if window <= 1:
        return records, 0
    out: list[StepRecord] = []
    left = 0
    for _, group in itertools.groupby(records, key=lambda r: (r.step - 1) // window):
        rows = list(group)
        last = rows[-1]
        if whole_only and last.step % window:
            left = len(rows)
            break
        out.append(
            StepRecord(
                last.step,
                round(sum(r.compute_s for r in rows), 6),
                round(sum(r.step_s for r in rows), 6),
                last.t,
                round(sum(r.blocked_s for r in rows), 6),
                sum(r.steps for r in rows),
            )
        )
    return out, left
