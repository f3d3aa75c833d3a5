"""Pacing of background copies: a buddy round spread over part of the next step, not sent in
one burst at its start.

A round starts at a step boundary, which is exactly when the next step's first collectives
(FSDP's all-gathers) and its data loading need the host. Sent at full speed, its copies compete
with them for cores and memory bandwidth, and every rank waits for the slowest. Sent in chunks
at an even rate over a share of the step (``--copy-pace``, 0.5 by default), the same bytes leave
mostly while the host idles (on an accelerator, during the step's compute). The round must still
end before the step does: it is joined at the next boundary, so the share is below one and a
round behind its schedule never waits.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

MIN_STEPS = 3
"""Step times seen before pacing starts: the first steps are warm-up (compilation, page faults),
and a pace drawn from them would be far too slow or too fast."""
MAX_PAUSE_S = 0.5
"""Longest single pause: a round never sleeps long between two chunks, whatever the schedule."""


def round_budget(step_times: Sequence[float], share: float, last: int = 10) -> float:
    """Seconds a round may take: ``share`` of the median of the last steps (0: no pacing)."""
    if share <= 0 or len(step_times) < MIN_STEPS:
        return 0.0
    return share * statistics.median(step_times[-last:])


def pause_s(elapsed: float, done: int, total: int, budget_s: float) -> float:
    """How long to wait before the next chunk so that ``done`` of ``total`` bytes left no sooner
    than an even rate over ``budget_s`` says: nothing when behind that schedule, or when nothing
    is left to send."""
    if budget_s <= 0 or done >= total:
        return 0.0
    return min(MAX_PAUSE_S, max(0.0, budget_s * done / total - elapsed))


@dataclass
class Pace:
    """The executor of :func:`pause_s` for one round: call :meth:`sent` after each chunk."""

    budget_s: float
    total: int
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    done: int = 0
    paused_s: float = 0.0
    _start: float = field(init=False)

    def __post_init__(self) -> None:
        self._start = self.clock()

    def sent(self, nbytes: int) -> None:
        self.done += nbytes
        wait = pause_s(self.clock() - self._start, self.done, self.total, self.budget_s)
        if wait > 0:
            self.paused_s += wait
            self.sleep(wait)
