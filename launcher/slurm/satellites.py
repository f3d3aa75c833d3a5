"""Satellite jobs: one-node jobs of the training job's own user that lend it a node.

Job expansion is off by default since Slurm 19.05 and gone from its tests in 25.11; a job
of one's own, though, every Slurm accepts, and ``srun --jobid=<satellite> --overlap`` starts
rank steps in it from the training job's batch host. A satellite sits in a partition of the
user's choice (``--lend-partition``): in a low-priority, preemptible one the scheduler lends
idle nodes to training and takes them back by preemption, its own priorities deciding.

Under a governance policy (``sres governance``) satellites go to the team's borrowing account
(``--lend-account TEAM_borrow``): Slurm lends idle nodes by fair share and takes them back by QOS
preemption when their owner submits.

A satellite never outlives its job: its batch step (:mod:`launcher.slurm.satellite_watch`) ends
it within seconds once the training job is no longer running, however that job ended, and
the supervisor cancels its satellites when the run stops. Satellites are found by name
(``sres-satellite-<job>``), and one that does not start in time is cancelled.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import ConfigError, SlurmError
from launcher.slurm.client import SlurmClient
from launcher.slurm.types import Job
from resilience.contract.run_dir import RunDir
from resilience.own_python import own_module

log = logging.getLogger(__name__)

GROW_BY = ("satellite", "expansion")
"""How a Slurm run gains nodes (``--grow-by``)."""
START_TIMEOUT_S = 20.0
"""How long a satellite may stay pending before it is cancelled: a node that is not idle now
is not lent now (the run asks again later)."""
WATCH_PERIOD_S = 2.0
TAKEN_BACK_HOLD_S = 30.0
"""A node Slurm just took back is idle for a moment before the job that preempted it starts:
it is not lent again until that job has held it, or for this long."""


def satellite_name(main_job: str) -> str:
    """Satellites are found by name: the run's cleanup cancels any it did not see start."""
    return f"sres-satellite-{main_job}"


@dataclass(frozen=True)
class Satellite:
    job_id: str
    node: str
    seconds: float
    """From submission to running: Slurm's scheduling time, not ours."""


class Satellites:
    """The satellites of one training job: submit, wait until running, release."""

    def __init__(
        self,
        client: SlurmClient,
        main_job: str,
        partition: str | None,
        log_dir: Path,
        account: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client, self.main_job, self.log_dir = client, main_job, Path(log_dir)
        self.start_timeout_s, self.clock, self.sleep = start_timeout_s, clock, sleep
        main = client.job(main_job)
        self.partition = partition or main.partition or None
        own = main.extra.get("Account", "")
        # A team's borrowing account (sres governance), else "same account" as the job.
        self.account = account or ("" if own == "(null)" else own)
        self.held: dict[str, Satellite] = {}
        """node name -> its satellite, while we hold it."""
        self._taken_back: dict[str, float] = {}
        """node name -> when Slurm took it back from us (preemption)."""

    def check_partition(self) -> None:
        """A lend partition that does not exist is the user's mistake: one line, at the start."""
        if self.partition and self.partition not in self.client.partitions():
            known = ", ".join(sorted(self.client.partitions()))
            raise ConfigError(
                f"--lend-partition {self.partition}: no such partition (the cluster has {known})"
            )

    def idle(self) -> list[str]:
        """Nodes of the lend partition a satellite could get at once: idle now, and not just
        taken back by Slurm for another job (that job starts on them in a moment)."""
        idle = self.client.idle_nodes(self.partition)
        now = self.clock()
        for node, since in list(self._taken_back.items()):
            if node not in idle or now - since > TAKEN_BACK_HOLD_S:
                del self._taken_back[node]  # the other job has it (or never came): idle next time is free
        return [n for n in idle if n not in self._taken_back]

    def acquire(self, exclude: list[str]) -> Satellite | None:
        """One satellite, running; None when none starts in time (it is cancelled then, so
        nothing of ours waits in the queue)."""
        got = self.acquire_many(1, exclude, self.start_timeout_s)
        return got[0] if got else None

    def acquire_many(self, count: int, exclude: list[str], timeout_s: float) -> list[Satellite]:
        """Submit ``count`` satellites at once and wait until they run: the ones running after
        ``timeout_s``, the rest cancelled."""
        t0 = self.clock()
        exclude = sorted(set(exclude) | set(self._taken_back))
        submitted = [job for job in (self._submit(exclude) for _ in range(count)) if job is not None]
        running: dict[str, Satellite] = {}
        while submitted:
            for job_id in list(submitted):
                job = self._job(job_id)
                if job is not None and job.running and job.nodes:
                    running[job_id] = Satellite(job_id, job.nodes[0], self.clock() - t0)
                    submitted.remove(job_id)
                elif job is None or job.finished:
                    submitted.remove(job_id)
            if not submitted or self.clock() - t0 > timeout_s:
                break
            self.sleep(0.1)
        for job_id in submitted:
            self._cancel(job_id)
        for sat in running.values():
            self.held[sat.node] = sat
        return sorted(running.values(), key=lambda sat: sat.node)

    def _submit(self, exclude: list[str]) -> str | None:
        watcher = shlex.join(
            own_module("launcher.slurm.satellite_watch", self.main_job, "--period", str(WATCH_PERIOD_S))
        )
        args = [
            "--nodes=1",
            "--ntasks=1",
            "--exclusive",
            "--no-requeue",
            "--chdir=/",  # the watcher is sres's own module: see resilience.own_python
            f"--job-name={satellite_name(self.main_job)}",
            f"--output={RunDir(self.log_dir.resolve()).satellite_output('%j')}",
            f"--wrap=exec {watcher}",
        ]
        args += [f"--partition={self.partition}"] if self.partition else []
        args += [f"--account={self.account}"] if self.account else []
        args += [f"--exclude={','.join(exclude)}"] if exclude else []
        try:
            return self.client.submit(args)
        except SlurmError as err:
            log.warning("could not submit a satellite of job %s: %s", self.main_job, err)
            return None

    def release(self, node: str, taken_back: bool = False) -> str | None:
        """Give the node back (cancel its satellite); returns the satellite's job id.
        ``taken_back``: Slurm preempted it for another job, which is about to start there."""
        if taken_back:
            self._taken_back[node] = self.clock()
        sat = self.held.pop(node, None)
        if sat is not None:
            self._cancel(sat.job_id)
        return sat.job_id if sat else None

    def release_all(self) -> None:
        for node in list(self.held):
            self.release(node)
        for job in self.listed():  # ones submitted but not yet seen running, from any earlier life
            self._cancel(job.job_id)

    def listed(self) -> list[Job]:
        return self.client.jobs_named(satellite_name(self.main_job))

    def reclaimed(self, node: str) -> bool:
        """Whether Slurm is taking the satellite back (preempted, cancelled, ended)."""
        sat = self.held.get(node)
        if sat is None:
            return False
        job = self._job(sat.job_id)
        return job is None or not job.running or _preempted(job)

    def _job(self, job_id: str) -> Job | None:
        try:
            return self.client.job(job_id)
        except SlurmError:
            return None

    def _cancel(self, job_id: str) -> None:
        try:
            self.client.cancel(job_id)
        except SlurmError as err:
            log.info("scancel of satellite %s: %s", job_id, err)


def _preempted(job: Job) -> bool:
    return job.extra.get("PreemptTime", "None") not in ("None", "(null)", "")
