"""Goodput of a long training run at scale: the recovery ladder as a model (pure; the RNG is passed in).

Failures are a Poisson process in wall time: unexpected ones at ``nodes x rate`` per node, planned
ones (maintenance) at a rate per day, during training and recoveries alike. Each failure is of a
kind (:class:`FaultMix`: a process, a hang, a node, several nodes at once) and a strategy says what
it costs (:class:`Cost`): the rung that took it, the time to see it, the time to recover, and the
work done since the last save that is lost. Training between failures runs at the strategy's
steady speed (``1 - overhead``). A failure during a recovery starts a new one; the interrupted
recovery's time is lost.

Our ladder (:class:`Ladder`), each rung at its measured or given cost: a process fault or a hang
is recovered in-process (a hang seen only after the hang timeout); a lost node is taken over by a
warm spare while the pool has one (a pool of ``spares`` refilled from the scheduler in
``refill_s``: the chance a spare is free is the steady state of that queue), else by a node from
the scheduler (its wait, exponential, and start-up) while the world runs one node short
(``elastic``) or waits; several nodes lost at once may take both holders of a state (the
persistent tier then); the node that runs the job's batch step takes the job with it (a requeue).
The baseline (:class:`Restart`) restarts the whole job from its last checkpoint on every failure
and writes a blocking checkpoint every Daly-optimal interval.

Every random number of a failure is drawn in the same order whatever the costs (common random
numbers): a run with one cost raised sees the same failures, each no cheaper, so goodput never
rises when a cost rises (a property the unit tests hold). :func:`expected` is the closed form
``E[exp(-rate C)] (speed - rate E[L])`` of the same model (renewal reward, each failure's cost C
and lost work L); the Monte-Carlo mean of long runs is held to it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Protocol

HOUR = 3600.0
DAY = 24 * HOUR

LLAMA3_FAILURES_PER_NODE_HOUR = 419 / (54 * 24 * 16384 / 8)
"""419 unexpected interruptions in a 54-day snapshot on 16,384 H100 GPUs in 8-GPU servers
(Llama 3 paper, Grattafiori et al. 2024, section 3.3.4): 1.58e-4 per node-hour."""

KINDS = ("process", "hang", "node", "correlated", "planned")
RUNGS = ("in-process", "spare", "new node", "shrink", "persistent", "requeue", "restart")
PARTS = ("detection", "recovery", "redo")


def check_number(name: str, value: float, low: float = 0.0, high: float = math.inf) -> None:
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name} {value!r}: must be a number in [{low:g}, {high:g}]")


@dataclass(frozen=True)
class SimulatedJob:
    gpus: int
    gpus_per_node: int = 8
    failures_per_node_hour: float = LLAMA3_FAILURES_PER_NODE_HOUR
    planned_per_day: float = 0.0
    """Planned interruptions of the whole job (maintenance, upgrades): no work lost."""
    work_hours: float = 30 * 24.0
    """Fault-free, overhead-free training time the run needs."""
    step_s: float = 5.0

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_node < 1 or self.gpus % self.gpus_per_node:
            raise ValueError(f"{self.gpus} GPUs in nodes of {self.gpus_per_node}: a whole number of nodes")
        check_number("the failure rate", self.failures_per_node_hour)
        check_number("planned interruptions per day", self.planned_per_day)
        if not (math.isfinite(self.work_hours) and self.work_hours > 0):
            raise ValueError(f"work of {self.work_hours!r} hours: the run must have work to do")
        if not (math.isfinite(self.step_s) and self.step_s > 0):
            raise ValueError(f"step of {self.step_s!r} s: a step takes time")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def unexpected_per_s(self) -> float:
        return self.nodes * self.failures_per_node_hour / HOUR

    @property
    def planned_per_s(self) -> float:
        return self.planned_per_day / DAY

    @property
    def rate_per_s(self) -> float:
        """Interruptions of every kind per second of wall time."""
        return self.unexpected_per_s + self.planned_per_s

    @property
    def mtbf_s(self) -> float:
        """Between unexpected failures."""
        return math.inf if self.unexpected_per_s == 0 else 1 / self.unexpected_per_s


@dataclass(frozen=True)
class FaultMix:
    """What an unexpected failure is, as shares that sum to 1."""

    process: float = 56 / 419
    """The node stays healthy: a process crashed or raised (software bugs, dependencies)."""
    hang: float = 7 / 419
    """Seen only when a timeout fires (NCCL watchdog timeouts)."""
    node: float = 321 / 419
    """One node lost (a GPU, its memory, the host)."""
    correlated: float = 35 / 419
    """Several nodes at once (a switch or cable: Llama 3's rack has one top-of-rack switch)."""
    correlated_nodes: int = 2

    def __post_init__(self) -> None:
        shares = (self.process, self.hang, self.node, self.correlated)
        for name, share in zip(("process", "hang", "node", "correlated"), shares):
            check_number(f"the {name} share", share, 0.0, 1.0)
        if abs(sum(shares) - 1) > 1e-6:
            raise ValueError(f"the fault shares sum to {sum(shares):.4g}, not 1")
        if self.correlated_nodes < 2:
            raise ValueError("a correlated failure takes at least 2 nodes")

    def kind(self, u: float) -> str:
        for name in ("process", "hang", "node"):
            share = getattr(self, name)
            if u < share:
                return name
            u -= share
        return "correlated"

    def nodes_of(self, kind: str) -> int:
        return self.correlated_nodes if kind == "correlated" else 1


@dataclass(frozen=True)
class Draws:
    """A failure's random numbers, uniform in [0, 1): always all of them, in this order."""

    gap: float
    planned: float
    kind: float
    spare: float
    wait: float
    host: float
    domain: float
    lost: float

    @classmethod
    def take(cls, rng: random.Random) -> Draws:
        return cls(*(rng.random() for _ in fields(cls)))


@dataclass(frozen=True)
class Cost:
    rung: str
    detection: float
    recovery: float
    lost_work: float
    """Work since the last save, lost (seconds of fault-free work)."""

    @property
    def seconds(self) -> float:
        return self.detection + self.recovery


class Strategy(Protocol):
    name: str

    def speed(self, job: SimulatedJob) -> float: ...

    def cost(self, kind: str, d: Draws, job: SimulatedJob, mix: FaultMix) -> Cost: ...

    def expected_cost(self, kind: str, job: SimulatedJob, mix: FaultMix) -> tuple[float, float]:
        """E[exp(-rate C)] and E[L] of a failure of this kind (the closed form)."""
        ...


def exponential_wait(mean: float, u: float) -> float:
    """An exponential wait of this mean, from a uniform draw (larger for a larger mean)."""
    return -mean * math.log1p(-u)


def _kind(d: Draws, job: SimulatedJob, mix: FaultMix) -> str:
    planned = job.planned_per_s / job.rate_per_s
    return "planned" if d.planned < planned else mix.kind(d.kind)


@dataclass
class Trial:
    """One simulated run: its wall time, failures by kind, and lost seconds by (rung, part)."""

    work_s: float
    wall_s: float = 0.0
    failures: Counter[str] = field(default_factory=Counter)
    lost: Counter[tuple[str, str]] = field(default_factory=Counter)
    steady_s: float = 0.0

    @property
    def goodput(self) -> float:
        return self.work_s / self.wall_s

    def charge(self, cost: Cost, seconds: float) -> None:
        """Up to ``seconds`` of a recovery: detection first, then the recovery itself."""
        detection = min(seconds, cost.detection)
        self.lost[cost.rung, "detection"] += detection
        self.lost[cost.rung, "recovery"] += seconds - detection
        self.wall_s += seconds


def run_trial(strategy: Strategy, job: SimulatedJob, mix: FaultMix, rng: random.Random) -> Trial:
    """One run to the end of its work."""
    trial = Trial(job.work_hours * HOUR)
    left, speed, rate = trial.work_s, strategy.speed(job), job.rate_per_s
    pending: Cost | None = None
    while True:
        d = Draws.take(rng)
        gap = math.inf if rate == 0 else exponential_wait(1 / rate, d.gap)
        before = pending.seconds if pending is not None else 0.0
        if pending is not None:
            trial.charge(pending, min(gap, before))
        if gap > before and (gap - before) * speed >= left:  # the work ends before the next failure
            trial.steady_s += left / speed - left
            trial.wall_s += left / speed
            return trial
        kind = _kind(d, job, mix)
        trial.failures[kind] += 1
        cost = strategy.cost(kind, d, job, mix)
        if gap > before:
            up = gap - before
            progress = up * speed
            lost = min(progress, cost.lost_work)
            left -= progress - lost
            trial.lost[cost.rung, "redo"] += lost
            trial.steady_s += up - progress
            trial.wall_s += up
        pending = cost


def expected(strategy: Strategy, job: SimulatedJob, mix: FaultMix) -> float:
    """Long-run goodput: E[exp(-rate C)] (speed - rate E[L]) over the kinds' shares."""
    rate = job.rate_per_s
    if rate == 0:
        return strategy.speed(job)
    shares = {"planned": job.planned_per_s / rate}
    for kind in ("process", "hang", "node", "correlated"):
        shares[kind] = getattr(mix, kind) * job.unexpected_per_s / rate
    survive = lost = 0.0
    for kind, share in shares.items():
        if share:
            s, loss = strategy.expected_cost(kind, job, mix)
            survive, lost = survive + share * s, lost + share * loss
    return max(0.0, survive * (strategy.speed(job) - rate * lost))


@dataclass(frozen=True)
class Result:
    strategy: str
    trials: tuple[Trial, ...]
    expected: float

    @property
    def goodputs(self) -> list[float]:
        return [t.goodput for t in self.trials]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.goodputs)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.goodputs)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def failures(self, kinds: Iterable[str] = KINDS) -> float:
        """Mean failures per run of these kinds."""
        return statistics.fmean(sum(t.failures[k] for k in kinds) for t in self.trials)

    def lost_share(self) -> dict[str, float]:
        """Mean share of the wall time lost, by rung (detection, recovery and redone work) and
        ``steady`` (the protection's or checkpoints' overhead)."""
        out: Counter[str] = Counter()
        for t in self.trials:
            for (rung, _part), seconds in t.lost.items():
                out[rung] += seconds / t.wall_s / len(self.trials)
            out["steady"] += t.steady_s / t.wall_s / len(self.trials)
        return dict(out)

    def lost_by_part(self) -> dict[str, float]:
        out: Counter[str] = Counter()
        for t in self.trials:
            for (_rung, part), seconds in t.lost.items():
                out[part] += seconds / t.wall_s / len(self.trials)
        return dict(out)


def simulate(strategy: Strategy, job: SimulatedJob, mix: FaultMix, trials: int, rng: random.Random) -> Result:
    return Result(
        strategy.name,
        tuple(run_trial(strategy, job, mix, rng) for _ in range(trials)),
        expected(strategy, job, mix),
    )
