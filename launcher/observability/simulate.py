"""Goodput of a training job at scale, as a model: in-process recovery vs restart from a checkpoint.

Pure functions (the RNG is passed in). The model, stated once here and in ``sres simulate --help``:

- Node failures are a Poisson process: every node fails at a constant rate, so the job sees
  failures at ``nodes x rate`` (exponential gaps), during training, recovery and restarts alike.
- **In-process recovery** (ours): each failure costs ``recovery_s`` of wall time without progress
  (detection + re-forming the group + state from peers + the first step), and the steps since
  the last commit are redone (``lost_s``). A failure during a recovery starts it again. A spare
  node is always there (the scheduler refills the pool); both holders of a state lost at once
  (a fall back to the persistent tier) is not modelled. Training runs at ``1 - steady_overhead``
  of the fault-free speed (replication and commits).
- **Restart from a checkpoint** (the baseline): a blocking checkpoint of ``ckpt_write_s`` every
  ``interval_s`` of work, at Daly's optimum for the job's MTBF unless given; a failure loses the
  work since the last completed checkpoint and costs ``restart_s`` (requeue, scheduling, start,
  load), during which a failure starts the restart again.

For both, the long-run goodput has a closed form (:func:`expected_inprocess`,
:func:`expected_restart`, Daly 2006); :func:`monte_carlo` simulates runs of a finite length,
whose mean the unit tests hold to the closed form.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

HOUR = 3600.0

LLAMA3_FAILURES_PER_NODE_HOUR = 419 / (54 * 24 * 16384 / 8)
"""Default node failure rate: 419 unexpected interruptions in 54 days of pre-training on 16,384
H100 GPUs in 8-GPU nodes (Llama 3 paper, Dubey et al. 2024, section 3.3.4): 1.58e-4 per node-hour,
one failure every ~3.1 h at 16,384 GPUs."""


@dataclass(frozen=True)
class Costs:
    """Seconds each event costs; the in-process ones are measured (events.jsonl), the rest given."""

    recovery_s: float
    lost_s: float = 0.0
    steady_overhead: float = 0.0
    ckpt_write_s: float = 60.0
    restart_s: float = 600.0

    def __post_init__(self) -> None:
        if min(self.recovery_s, self.lost_s, self.restart_s) < 0:
            raise ValueError("costs cannot be negative")
        if self.ckpt_write_s <= 0:  # the Daly interval divides by it
            raise ValueError(f"--ckpt-write-s {self.ckpt_write_s:g}: a checkpoint write takes time (> 0)")
        if not 0 <= self.steady_overhead < 1:
            raise ValueError(f"steady overhead {self.steady_overhead}: a fraction in [0, 1)")


@dataclass(frozen=True)
class Job:
    gpus: int
    gpus_per_node: int = 8
    failures_per_node_hour: float = LLAMA3_FAILURES_PER_NODE_HOUR
    work_hours: float = 30 * 24.0
    """Fault-free, overhead-free training time the run needs."""

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.gpus_per_node < 1 or self.gpus % self.gpus_per_node:
            raise ValueError(f"{self.gpus} GPUs in nodes of {self.gpus_per_node}: a whole number of nodes")
        if self.failures_per_node_hour < 0 or self.work_hours <= 0:
            raise ValueError("the failure rate cannot be negative and the run must have work to do")

    @property
    def nodes(self) -> int:
        return self.gpus // self.gpus_per_node

    @property
    def rate_per_s(self) -> float:
        """Failures per second of the whole job."""
        return self.nodes * self.failures_per_node_hour / HOUR

    @property
    def mtbf_s(self) -> float:
        return math.inf if self.rate_per_s == 0 else 1 / self.rate_per_s


def daly_interval(ckpt_write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the work between checkpoints (Daly 2006, FGCS 22(3))."""
    if math.isinf(mtbf_s):
        return math.inf
    if ckpt_write_s >= 2 * mtbf_s:
        return mtbf_s
    x = ckpt_write_s / (2 * mtbf_s)
    return math.sqrt(2 * ckpt_write_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - ckpt_write_s


def _retry_time(length_s: float, rate: float) -> float:
    """Expected wall time to get ``length_s`` without a failure, starting again after each one."""
    return length_s if rate == 0 else math.expm1(rate * length_s) / rate


def expected_inprocess(job: Job, costs: Costs) -> float:
    """Long-run goodput of in-process recovery: (1 - overhead) (1 - rate x lost) e^(-rate x recovery)."""
    rate = job.rate_per_s
    return (
        (1 - costs.steady_overhead) * max(0.0, 1 - rate * costs.lost_s) * math.exp(-rate * costs.recovery_s)
    )


def expected_restart(job: Job, costs: Costs, interval_s: float | None = None) -> float:
    """Long-run goodput of checkpoint/restart: each interval of work plus its write must run
    without a failure; each failure adds a restart (Daly's exponential model)."""
    rate = job.rate_per_s
    interval = daly_interval(costs.ckpt_write_s, job.mtbf_s) if interval_s is None else interval_s
    if math.isinf(interval):
        return 1.0
    segment = math.exp(rate * costs.restart_s) * _retry_time(interval + costs.ckpt_write_s, rate)
    return interval / segment


def _exp(rng: random.Random, rate: float) -> float:
    return math.inf if rate == 0 else rng.expovariate(rate)


def run_inprocess(job: Job, costs: Costs, rng: random.Random) -> tuple[float, int]:
    """One run's wall seconds and failures under in-process recovery."""
    speed = 1 - costs.steady_overhead
    work, wall, failures = job.work_hours * HOUR, 0.0, 0
    done = 0.0
    while True:
        up = _exp(rng, job.rate_per_s)
        if done + speed * up >= work:
            return wall + (work - done) / speed, failures
        wall += up
        done = max(0.0, done + speed * (up - costs.lost_s))
        failures += 1
        while (gap := _exp(rng, job.rate_per_s)) < costs.recovery_s:  # a failure during recovery
            wall += gap
            failures += 1
        wall += costs.recovery_s


def run_restart(
    job: Job, costs: Costs, rng: random.Random, interval_s: float | None = None
) -> tuple[float, int]:
    """One run's wall seconds and failures under checkpoint/restart (the last interval is partial)."""
    interval = daly_interval(costs.ckpt_write_s, job.mtbf_s) if interval_s is None else interval_s
    left, wall, failures = job.work_hours * HOUR, 0.0, 0
    while left > 0:
        segment = min(interval, left) + (costs.ckpt_write_s if left > interval else 0.0)
        while (gap := _exp(rng, job.rate_per_s)) < segment:
            wall += gap
            failures += 1
            while (again := _exp(rng, job.rate_per_s)) < costs.restart_s:
                wall += again
                failures += 1
            wall += costs.restart_s
        wall += segment
        left -= min(interval, left)
    return wall, failures


@dataclass(frozen=True)
class Result:
    strategy: str
    goodputs: tuple[float, ...]
    failures: tuple[int, ...]
    expected: float

    @property
    def mean(self) -> float:
        return statistics.fmean(self.goodputs)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.goodputs)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def monte_carlo(job: Job, costs: Costs, trials: int, rng: random.Random) -> list[Result]:
    """``trials`` runs of each strategy; goodput = fault-free work / wall time."""
    work = job.work_hours * HOUR
    results = []
    for name, run, expected in (
        ("in-process (sres)", run_inprocess, expected_inprocess(job, costs)),
        ("restart from checkpoint", run_restart, expected_restart(job, costs)),
    ):
        runs = [run(job, costs, rng) for _ in range(trials)]
        results.append(
            Result(name, tuple(work / wall for wall, _ in runs), tuple(n for _, n in runs), expected)
        )
    return results


@dataclass(frozen=True)
class Measured:
    """What a run's events say recovery costs: medians over its ``recovered`` events."""

    recoveries: int
    recovery_s: float
    steps_lost: float
    parts: dict[str, float]
    steady_overhead: float | None = None
    """Checkpoint blocking over useful step time, from the runs' goodput accounts (None: no account)."""


def measured_costs(events: Iterable[dict]) -> Measured:
    """Median recovery (fault -> first step after it: detection of injected faults, re-form,
    transfer, first step) and steps lost, from ``recovered`` events of one or more runs; the
    steady overhead of checkpoint blocking from their ``finished`` accounts."""
    events = list(events)
    recovered = [e for e in events if e.get("event") == "recovered" and e.get("seconds") is not None]
    if not recovered:
        raise ValueError("no 'recovered' event: give runs with faults (e.g. sres demo, or --inject)")
    parts = {
        key: statistics.median(e[key] for e in recovered if e.get(key) is not None)
        for key in ("reform_s", "transfer_s", "first_step_s")
        if any(e.get(key) is not None for e in recovered)
    }
    accounts = [
        e["goodput_by_cause"] for e in events if e.get("event") == "finished" and e.get("goodput_by_cause")
    ]
    blocked = sum(a.get("checkpoint", 0.0) for a in accounts)
    useful = sum(a.get("productive", 0.0) for a in accounts)
    overhead = blocked / (useful + blocked) if accounts and useful + blocked > 0 else None
    return Measured(
        len(recovered),
        statistics.median(e["seconds"] for e in recovered),
        statistics.median(e.get("steps_lost", 0) for e in recovered),
        parts,
        overhead,
    )
