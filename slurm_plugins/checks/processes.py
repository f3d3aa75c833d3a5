"""Processes of Slurm jobs on this node: finding them, the leftover check, the epilog's kill.

A job's processes carry ``SLURM_JOB_ID`` in their environment. Where several slurmd share a
host (the test cluster, or several clusters), ``SLURMD_NODENAME`` and ``SLURM_CLUSTER_NAME``
tell whose a process is, so we never touch another node's or another cluster's job. Hook
processes (prolog/epilog, ``SLURM_SCRIPT_CONTEXT`` set) and our own ancestors are not jobs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from slurm_plugins.checks.base import CheckContext, CheckResult, Fault, fail, ok

_PROC = Path("/proc")


@dataclass(frozen=True)
class JobProcess:
    pid: int
    job_id: str
    comm: str


def parse_environ(raw: bytes) -> dict[str, str]:
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def belongs(env: dict[str, str], node: str | None, cluster: str | None) -> str | None:
    """The job id a process with this environment runs for here, or None (pure)."""
    job = env.get("SLURM_JOB_ID")
    if not job or "SLURM_SCRIPT_CONTEXT" in env:
        return None
    if node and env.get("SLURMD_NODENAME", node) != node:
        return None
    if cluster and env.get("SLURM_CLUSTER_NAME", cluster) != cluster:
        return None
    return job


def job_processes(node: str | None, cluster: str | None) -> list[JobProcess]:
    """Every process of a Slurm job on this node, except this process and its ancestors."""
    exclude = _ancestors(os.getpid())
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in exclude:
            continue
        try:
            env = parse_environ((entry / "environ").read_bytes())
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        job = belongs(env, node, cluster)
        if job is not None:
            found.append(JobProcess(int(entry.name), job, comm))
    return found


def leftovers(processes: Iterable[JobProcess], active_jobs: set[str]) -> list[JobProcess]:
    """Processes whose job is not active any more (pure)."""
    return [p for p in processes if p.job_id not in active_jobs]


def check_processes(ctx: CheckContext) -> list[CheckResult]:
    from launcher.errors import SlurmError
    from launcher.slurm.client import SlurmClient

    procs = job_processes(ctx.node, ctx.cluster)
    if not procs:
        return [ok("processes", "no job processes")]
    active = {ctx.job_id} if ctx.job_id else set()
    client = SlurmClient.create(
        ctx.env.get("SRES_SLURM_BACKEND", "auto"), timeout_s=ctx.config.budget.slurm_s
    )
    for job_id in {p.job_id for p in procs} - active:
        try:
            if not client.job(job_id).finished:
                active.add(job_id)
        except SlurmError:
            pass  # Slurm no longer knows the job: it is over.
    left = leftovers(procs, active)
    if not left:
        return [ok("processes", f"{len(procs)} process(es) of running jobs")]
    shown = ", ".join(f"{p.pid} ({p.comm}, job {p.job_id})" for p in left[:5])
    # A reboot clears them; a person should still look at what escaped the job's cleanup.
    return [fail("processes", f"{len(left)} left over from finished jobs: {shown}", Fault.TRANSIENT)]


def kill_job_processes(job_id: str, node: str | None, cluster: str | None, grace_s: float = 1.0) -> list[int]:
    """SIGTERM then SIGKILL every process of ``job_id`` here (the epilog's sweep)."""
    pids = [p.pid for p in job_processes(node, cluster) if p.job_id == job_id]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if _signal(pid, sig)]
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _alive(pid)]
        if not alive:
            break
    return pids


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _ancestors(pid: int) -> set[int]:
    chain = {pid}
    while pid > 1:
        try:
            pid = int((_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        chain.add(pid)
    return chain
