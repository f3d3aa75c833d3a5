"""The strategies of the goodput model (:mod:`launcher.observability.goodput_model`): our recovery
ladder at its measured costs, and the baseline that restarts the job from a checkpoint.

A strategy says what one failure costs (:class:`~launcher.observability.goodput_model.Cost`)
from the failure's draws, and, for the closed form, E[exp(-rate C)] and E[L] of a kind. Every
cost is non-decreasing in every input that is a time, and which rung takes a failure depends
only on its draws and on probabilities: the rung taken when a spare is missing never costs less
than a spare's (that keeps goodput from rising when the refill time rises).

Our costs are measured at a few ranks; a recovery's control path (the fault decided, a new plan,
every survivor released into the new generation) grows with the job's ranks. With a fitted
curve of that path (:mod:`launcher.observability.goodput_scale`), the rungs that release the
survivors into a new generation in-process (a process fault, a hang, a spare's takeover, and the
rungs that include a spare's takeover) pay what the path costs at the job's ranks beyond what it
cost at the ranks the recoveries were measured at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from launcher.observability.goodput_model import (
    Cost,
    Draws,
    FaultMix,
    SimulatedJob,
    check_number,
    exponential_wait,
)
from launcher.observability.goodput_scale import LineFit


@dataclass(frozen=True)
class Ladder:
    """Our costs, seconds: measured from a run's events (``sres simulate LOG_DIR``) or given."""

    inprocess_s: float = 0.24
    spare_s: float = 0.65
    detect_s: float = 1.0
    """From a process's or node's death to the supervisor seeing it (liveness)."""
    hang_timeout_s: float = 30.0
    spares: int | None = None
    """Warm spare nodes; None: one per 256 nodes (ByteRobust's P99 sizing: 4 for 1,024)."""
    refill_s: float = 600.0
    """Mean time for the scheduler to give a node that refills the spare pool."""
    node_wait_s: float = 300.0
    """Mean time for the scheduler to give a node when the pool is empty (exponential)."""
    node_start_s: float = 3.0
    elastic: bool = True
    shrink_s: float = 0.68
    regrow_s: float = 0.47
    persistent_s: float = 60.0
    """Restoring from the persistent tier (the state's both in-memory holders lost)."""
    persist_interval_s: float = 1800.0
    same_domain: float = 1.0
    """Share of multi-node failures that take both holders of some rank's state."""
    requeue_s: float = 900.0
    """The job's batch host lost: requeue, scheduling and start-up (then the persistent tier)."""
    lost_steps: float = 0.0
    steady_overhead: float = 0.0
    measured_ranks: int = 4
    """The world size the costs above were measured at (this machine's benchmarks: 4 ranks)."""
    control_path: LineFit | None = None
    """The control path's seconds against ranks; None: it costs at every scale what it cost at
    ``measured_ranks``."""
    name: str = "in-process (sres)"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float):
                high = 1.0 if f.name in ("same_domain",) else math.inf
                check_number(f.name, value, 0.0, high)
        if not self.steady_overhead < 1:
            raise ValueError(f"steady overhead {self.steady_overhead}: a fraction in [0, 1)")
        if self.spares is not None and self.spares < 0:
            raise ValueError(f"{self.spares} spares: at least 0")
        if self.measured_ranks < 1:
            raise ValueError(f"costs measured at {self.measured_ranks} ranks: at least 1")

    def control_extra_s(self, job: SimulatedJob) -> float:
        """What the control path costs at the job's ranks (one per GPU) beyond what it cost in
        the measured recoveries, which already hold that much."""
        return 0.0 if self.control_path is None else self.control_path.extra_s(job.gpus, self.measured_ranks)

    def _at_scale(self, job: SimulatedJob) -> tuple[float, float]:
        """The in-process recovery's and a spare's takeover seconds at the job's ranks."""
        extra = self.control_extra_s(job)
        return self.inprocess_s + extra, self.spare_s + extra

    def pool(self, job: SimulatedJob) -> int:
        return self.spares if self.spares is not None else max(1, math.ceil(job.nodes / 256))

    def spare_free(self, k: int, job: SimulatedJob, mix: FaultMix) -> float:
        """Chance that ``k`` spares are free when a failure comes: spares being refilled are a
        Poisson number of mean (node-taking failures per s) x ``refill_s`` (an M/G/inf queue)."""
        taken = job.unexpected_per_s * (mix.node + mix.correlated * mix.correlated_nodes) + job.planned_per_s
        busy_mean, room = taken * self.refill_s, self.pool(job) - k
        if room < 0:
            return 0.0
        if room > busy_mean + 40 * math.sqrt(busy_mean) + 40:  # the tail past it is below 1e-300
            return 1.0
        term = total = math.exp(-busy_mean)
        for i in range(1, room + 1):
            term *= busy_mean / i
            total += term
        return min(1.0, total)

    def speed(self, job: SimulatedJob) -> float:
        return 1 - self.steady_overhead

    def _steps_lost(self, job: SimulatedJob, u: float) -> float:
        return (self.lost_steps + u) * job.step_s

    def _replace(self, k: int, d: Draws, job: SimulatedJob, mix: FaultMix, spare: float) -> tuple[str, float]:
        """The rung and seconds that put ``k`` lost nodes' ranks back to work (``spare``: a
        spare's takeover at the job's ranks)."""
        if d.spare < self.spare_free(k, job, mix):
            return "spare", spare
        wait = exponential_wait(self.node_wait_s, d.wait) + self.node_start_s
        if self.elastic and job.nodes > k:  # go on without them, at (N - k) / N, then grow back
            return "shrink", max(spare, self.shrink_s) + self.regrow_s + wait * k / job.nodes
        return "new node", wait + spare

    def cost(self, kind: str, d: Draws, job: SimulatedJob, mix: FaultMix) -> Cost:
        inprocess, spare = self._at_scale(job)
        if kind in ("process", "hang"):
            detect = self.detect_s if kind == "process" else self.hang_timeout_s
            return Cost("in-process", detect, inprocess, self._steps_lost(job, d.lost))
        k = 1 if kind == "planned" else mix.nodes_of(kind)
        detect = 0.0 if kind == "planned" else self.detect_s
        rung, seconds = self._replace(k, d, job, mix, spare)
        if kind == "planned":  # a drain: the node's ranks move at a step boundary
            return Cost(rung, 0.0, seconds, 0.0)
        since_save = self.persist_interval_s * d.lost  # what the persistent tier lacks
        if d.host < k / job.nodes:
            return Cost("requeue", detect, self.requeue_s + self.persistent_s, since_save)
        if kind == "correlated" and d.domain < self.same_domain:
            return Cost("persistent", detect, seconds + self.persistent_s, since_save)
        return Cost(rung, detect, seconds, self._steps_lost(job, d.lost))

    def expected_cost(self, kind: str, job: SimulatedJob, mix: FaultMix) -> tuple[float, float]:
        rate = job.rate_per_s
        inprocess, spare = self._at_scale(job)
        if kind in ("process", "hang"):
            detect = self.detect_s if kind == "process" else self.hang_timeout_s
            return math.exp(-rate * (detect + inprocess)), self._steps_lost(job, 0.5)
        k = 1 if kind == "planned" else mix.nodes_of(kind)
        detect = 0.0 if kind == "planned" else self.detect_s
        p_spare = self.spare_free(k, job, mix)
        start = self.node_start_s
        if self.elastic and job.nodes > k:
            a, b = max(spare, self.shrink_s) + self.regrow_s + start * k / job.nodes, k / job.nodes
        else:
            a, b = start + spare, 1.0
        other = math.exp(-rate * a) / (1 + rate * b * self.node_wait_s)
        replaced = p_spare * math.exp(-rate * spare) + (1 - p_spare) * other
        if kind == "planned":
            return replaced, 0.0
        p_host = min(1.0, k / job.nodes)
        p_domain = (1 - p_host) * (self.same_domain if kind == "correlated" else 0.0)
        p_memory = 1 - p_host - p_domain
        requeue = math.exp(-rate * (detect + self.requeue_s + self.persistent_s))
        domain = math.exp(-rate * (detect + self.persistent_s)) * replaced
        ok = math.exp(-rate * detect) * replaced
        lost_memory, lost_disk = self._steps_lost(job, 0.5), self.persist_interval_s / 2
        return (
            p_host * requeue + p_domain * domain + p_memory * ok,
            (p_host + p_domain) * lost_disk + p_memory * lost_memory,
        )


@dataclass(frozen=True)
class Restart:
    """The baseline: every failure restarts the job from its last checkpoint."""

    restart_s: float = 441.0
    detect_s: float = 60.0
    hang_timeout_s: float = 600.0
    ckpt_write_s: float = 5.0
    interval_s: float | None = None
    """Work between checkpoints; None: Daly's optimum for the job's MTBF."""
    name: str = "restart from checkpoint"

    def __post_init__(self) -> None:
        for name in ("restart_s", "detect_s", "hang_timeout_s"):
            check_number(name, getattr(self, name))
        if not (math.isfinite(self.ckpt_write_s) and self.ckpt_write_s > 0):
            raise ValueError(f"checkpoint write {self.ckpt_write_s!r} s: it takes time (> 0)")
        if self.interval_s is not None and not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise ValueError(f"checkpoint interval {self.interval_s!r} s: > 0")

    def interval(self, job: SimulatedJob) -> float:
        return daly_interval(self.ckpt_write_s, job.mtbf_s) if self.interval_s is None else self.interval_s

    def speed(self, job: SimulatedJob) -> float:
        interval = self.interval(job)
        return 1.0 if math.isinf(interval) else interval / (interval + self.ckpt_write_s)

    def _detect(self, kind: str) -> float:
        return {"planned": 0.0, "hang": self.hang_timeout_s}.get(kind, self.detect_s)

    def cost(self, kind: str, d: Draws, job: SimulatedJob, mix: FaultMix) -> Cost:
        lost = 0.0 if kind == "planned" else d.lost * self.interval(job)
        return Cost("restart", self._detect(kind), self.restart_s, lost)

    def expected_cost(self, kind: str, job: SimulatedJob, mix: FaultMix) -> tuple[float, float]:
        lost = 0.0 if kind == "planned" else self.interval(job) / 2
        return math.exp(-job.rate_per_s * (self._detect(kind) + self.restart_s)), lost


def daly_interval(ckpt_write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the work between checkpoints (Daly 2006, FGCS 22(3))."""
    if math.isinf(mtbf_s):
        return math.inf
    if ckpt_write_s >= 2 * mtbf_s:
        return mtbf_s
    x = ckpt_write_s / (2 * mtbf_s)
    return math.sqrt(2 * ckpt_write_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - ckpt_write_s
