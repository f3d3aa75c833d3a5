"""The background services the supervisor's loop walks after each decision, as one protocol.

Recovery times, batch producers, fork servers, the ranks' events and live metrics each need a
moment of every tick, but none of them decides anything: the loop calls ``tick(now)`` on each,
in order, instead of knowing what each one reads. A new service is a class with that one
method and a line in :meth:`~launcher.supervisor.loop.Supervisor.tickers`; what it needs of the
run it is given when built (a callable), so the protocol stays one method.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from launcher.observability.metrics import MetricsOutput
from launcher.placement.forks import ForkingProcesses

METRICS_PERIOD_S = 1.0
"""How often live metrics read the step counter (and rewrite the textfile)."""


class Ticker(Protocol):
    """A background service of the supervisor: given a moment of the loop, at ``now`` (its clock)."""

    def tick(self, now: float) -> None: ...


class ForkServers:
    """Keeps a fork server on each machine the run uses (started again when one dies, stopped
    when its machine leaves)."""

    def __init__(self, processes: ForkingProcesses, nodes: Callable[[], Iterable[int]]) -> None:
        self.processes, self.nodes = processes, nodes

    def tick(self, now: float) -> None:
        self.processes.tick(self.nodes())


class LiveMetrics:
    """Publishes the step counter and straggler scores every ``METRICS_PERIOD_S``."""

    def __init__(
        self,
        metrics: MetricsOutput,
        progress: Callable[[], int | None],
        scores: Callable[[], dict[int, float]],
    ) -> None:
        self.metrics, self.progress, self.scores = metrics, progress, scores
        self._next = 0.0

    def tick(self, now: float) -> None:
        if now >= self._next:
            self._next = now + METRICS_PERIOD_S
            self.metrics.update(self.progress(), self.scores())
