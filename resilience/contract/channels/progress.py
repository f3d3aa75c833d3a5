"""How far the run got and how each generation started: rank 0 (and each rank's step timer)
writes, the supervisor reads for its events, goodput and straggler reports.
"""

from __future__ import annotations

from resilience.contract import keys
from resilience.contract.messages import BatchInfo, Progress, RecentSteps, RecoveryInfo, RunStats
from resilience.contract.store_core import Channel


class ProgressChannel(Channel):
    """Facts about training that outlive the rank that wrote them (the store is the supervisor's)."""

    def set_step(self, step: int, generation: int = 0) -> bool:
        """Record ``step`` as committed by ``generation``'s rank 0; False (nothing written) when
        a newer generation already recorded one: a rank cut off and back, whose write sat in a
        socket through the partition, reads the newer value first on the same connection."""
        old = self._core.get(keys.PROGRESS, Progress)
        if old is not None and old.generation > generation:
            return False
        self._core.put(keys.PROGRESS, Progress(step, generation))
        return True

    def step(self) -> int | None:
        """The newest committed step; None before the first."""
        progress = self._core.get(keys.PROGRESS, Progress)
        return None if progress is None else progress.step

    def mark_first_step(self, generation: int, t: float) -> None:
        self._core.put_float(keys.first_step(generation), t)

    def first_step_t(self, generation: int) -> float | None:
        return self._core.get_float(keys.first_step(generation))

    def publish_recovery(self, generation: int, info: RecoveryInfo) -> None:
        self._core.put(keys.recovery(generation), info)

    def recovery(self, generation: int) -> RecoveryInfo | None:
        return self._core.get(keys.recovery(generation), RecoveryInfo)

    def publish_batch(self, generation: int, batch: BatchInfo) -> None:
        self._core.put(keys.batch(generation), batch)

    def batch(self, generation: int) -> BatchInfo | None:
        return self._core.get(keys.batch(generation), BatchInfo)

    def publish_stats(self, generation: int, stats: RunStats) -> None:
        """Rank 0's, as generation G ends. Keyed by G: a replaced rank's write still in flight
        lands under its old generation, which the supervisor does not read."""
        self._core.put(keys.stats(generation), stats)

    def stats(self, generation: int) -> RunStats | None:
        return self._core.get(keys.stats(generation), RunStats)

    def publish_steps(self, generation: int, slot: str, steps: RecentSteps) -> None:
        self._core.put(keys.compute(generation, slot), steps)

    def recent_steps(self, generation: int, slot: str) -> RecentSteps | None:
        return self._core.get(keys.compute(generation, slot), RecentSteps)
