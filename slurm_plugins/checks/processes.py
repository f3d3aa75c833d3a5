"""Processes of Slurm jobs on this node: finding them, the leftover check, the epilog's kill.

Whose a process is must not rest on what its user can write. Its environment is the user's:
``env SLURM_JOB_ID=31337 sleep 60`` claims any job, and a leftover hides by unsetting it. What
a user cannot write, in order of trust:

1. the job's cgroup (``proctrack/cgroup``: ``.../job_<id>/...``, root's to create and fill);
2. the process tree: a process started by a live step descends from that step's
   ``slurmstepd`` (a root process; a user can neither forge one nor re-parent onto one);
3. the process's uid, set by the kernel.

So a process in a live step (2) is never a leftover, whatever it claims; a cgroup (1) names its
job outright; and an environment's claim counts only where Slurm confirms the claimed job is
the process's own uid's (3). With ``proctrack/linuxproc`` a process that both left its step's
tree and unset its environment cannot be told from any other process of its user: use
``proctrack/cgroup`` where that matters (this module then finds it by its cgroup).

Where several slurmd share a host (the test cluster) ``SLURMD_NODENAME`` and
``SLURM_CLUSTER_NAME`` narrow a claim to this node's jobs; they only ever exclude.
"""

from __future__ import annotations

import functools
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from slurm_plugins.checks.base import CheckContext, CheckResult, Fault, fail, ok

_PROC = Path("/proc")
_CGROUP_JOB = re.compile(
    r"^/(?:slurm[^/]*/uid_\d+|system\.slice/(?:[^/]+/)*slurmstepd\.scope)/job_(\d+)(?:/|$)"
)
"""Slurm's own hierarchies only (v1 ``/slurm[_node]/uid_U/job_J``, v2 ``.../slurmstepd.scope/job_J``):
a user may create cgroups in a subtree delegated to them, and one named ``job_31337`` got the
node drained."""
_STEPD = re.compile(rb"^slurmstepd: \[(\d+)[._\]]")


@dataclass(frozen=True)
class ProcessInfo:
    """What /proc says of one process, read once."""

    pid: int
    ppid: int
    uid: int
    comm: str
    cgroup_job: str | None = None
    """The job its cgroup names (unforgeable)."""
    stepd_job: str | None = None
    """Set when this process is a root ``slurmstepd`` of that job."""
    env: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    started_at: float = 0.0
    """When the kernel started it (Unix seconds): no user can set it."""


@dataclass(frozen=True)
class JobProcess:
    pid: int
    job_id: str
    comm: str


@dataclass(frozen=True)
class JobRecord:
    """Slurm's word on a job: whose it is, whether it is over, and when it ended."""

    user_id: int
    finished: bool
    ended_at: float | None = None
    """Unix seconds; None where Slurm did not say."""


START_SLACK_S = 2.0
"""Clocks read apart (the kernel's boot time, Slurm's end time in whole seconds)."""


def parse_environ(raw: bytes) -> dict[str, str]:
    env = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def cgroup_job(text: str) -> str | None:
    """The job id in a ``/proc/<pid>/cgroup`` (v1 ``/slurm/uid_U/job_J/...``, v2
    ``/system.slice/slurmstepd.scope/job_J/...``), or None (pure)."""
    for line in text.splitlines():
        found = _CGROUP_JOB.search(line.rpartition(":")[2])
        if found:
            return found.group(1)
    return None


def stepd_job(cmdline: bytes, uid: int) -> str | None:
    """The job a root ``slurmstepd: [J.S]`` serves, or None (pure). Only root's count: any
    user may name a process so."""
    found = _STEPD.match(cmdline) if uid == 0 else None
    return found.group(1).decode() if found else None


def claimed_job(env: dict[str, str], node: str | None, cluster: str | None) -> str | None:
    """The job a process's environment claims here, or None (pure). A claim, never proof."""
    job = env.get("SLURM_JOB_ID")
    if not job or "SLURM_SCRIPT_CONTEXT" in env:
        return None
    if node and env.get("SLURMD_NODENAME", node) != node:
        return None
    if cluster and env.get("SLURM_CLUSTER_NAME", cluster) != cluster:
        return None
    return job


def live_step_job(pid: int, table: dict[int, ProcessInfo]) -> str | None:
    """The job whose live ``slurmstepd`` this process descends from, or None (pure)."""
    seen = set()
    info = table.get(pid)
    while info is not None and info.pid not in seen and info.pid > 1:
        seen.add(info.pid)
        if info.stepd_job is not None and info.pid != pid:
            return info.stepd_job
        info = table.get(info.ppid)
    return None


def job_of(
    info: ProcessInfo,
    table: dict[int, ProcessInfo],
    node: str | None,
    cluster: str | None,
    record: Callable[[str], JobRecord | None],
) -> tuple[str | None, bool]:
    """(the job a process belongs to, whether that job is over), from what its user cannot
    forge (pure given ``record``, Slurm's answer for a job id or None where Slurm forgot it)."""
    live = live_step_job(info.pid, table)
    if live is not None:
        return live, False
    if info.stepd_job is not None or (info.uid == 0 and "SLURM_SCRIPT_CONTEXT" in info.env):
        return None, False  # Slurm's own processes: a step daemon, a prolog or epilog
    if info.cgroup_job is not None:
        known = record(info.cgroup_job)
        return info.cgroup_job, known is None or known.finished
    claim = claimed_job(info.env, node, cluster)
    known = record(claim) if claim is not None else None
    if claim is None or known is None or known.user_id != info.uid:
        return None, False  # an unconfirmed claim: nobody's job
    if known.ended_at is not None and info.started_at > known.ended_at + START_SLACK_S:
        return None, False  # started after its job ended: a claim (users drained nodes so)
    return claim, known.finished


def process_table(exclude: set[int] | None = None) -> dict[int, ProcessInfo]:
    """Every process now, but ``exclude`` (default: this process and its ancestors, which run
    inside a job's step when a user runs ``sres hooks check`` there)."""
    exclude = _ancestors(os.getpid()) if exclude is None else exclude
    table = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and int(entry.name) not in exclude:
            info = _read(entry)
            if info is not None:
                table[info.pid] = info
    return table


def job_processes(
    node: str | None, cluster: str | None, record: Callable[[str], JobRecord | None]
) -> list[tuple[JobProcess, bool]]:
    """Every process of a Slurm job on this node, with whether its job is over."""
    table = process_table()
    found = []
    for info in table.values():
        job, over = job_of(info, table, node, cluster, record)
        if job is not None:
            found.append((JobProcess(info.pid, job, info.comm), over))
    return found


def check_processes(ctx: CheckContext) -> list[CheckResult]:
    procs = job_processes(ctx.node, ctx.cluster, _slurm_records(ctx))
    if not procs:
        return [ok("processes", "no job processes")]
    left = [p for p, over in procs if over and p.job_id != ctx.job_id]
    if not left:
        return [ok("processes", f"{len(procs)} process(es) of running jobs")]
    shown = ", ".join(f"{p.pid} ({p.comm}, job {p.job_id})" for p in left[:5])
    # A reboot clears them; a person should still look at what escaped the job's cleanup.
    return [fail("processes", f"{len(left)} left over from finished jobs: {shown}", Fault.TRANSIENT)]


def kill_job_processes(
    job_id: str, job_uid: int | None, node: str | None, cluster: str | None, grace_s: float = 1.0
) -> list[int]:
    """SIGTERM then SIGKILL every process of ``job_id`` here (the epilog's sweep). The epilog
    knows the job's user from slurmd (``SLURM_JOB_UID``): a claim is confirmed by that alone,
    without asking slurmctld; without it only cgroups and live steps count."""

    def record(job: str) -> JobRecord | None:
        return JobRecord(job_uid, True) if job == job_id and job_uid is not None else None

    pids = [p.pid for p, _ in job_processes(node, cluster, record) if p.job_id == job_id]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        alive = [pid for pid in pids if _signal(pid, sig)]
        deadline = time.monotonic() + grace_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.05)
            alive = [pid for pid in alive if _alive(pid)]
        if not alive:
            break
    return pids


def _slurm_records(ctx: CheckContext) -> Callable[[str], JobRecord | None]:
    """Slurm's record of each job asked about, once per job, from its typed fields."""
    from launcher.errors import SlurmError
    from launcher.slurm.client import SlurmClient, driver_named
    from launcher.slurm.types import FINISHED_JOB_STATES

    client = SlurmClient.create(driver_named(ctx.env), timeout_s=ctx.config.budget.slurm_s)
    cache: dict[str, JobRecord | None] = {}

    def record(job: str) -> JobRecord | None:
        if job not in cache:
            try:
                owner = client.job_owner(job)
                finished = owner.state in FINISHED_JOB_STATES
                cache[job] = JobRecord(owner.user_id, finished, owner.end_time if finished else None)
            except SlurmError:
                cache[job] = None  # Slurm no longer knows the job (or never did)
        return cache[job]

    return record


def _read(entry: Path) -> ProcessInfo | None:
    try:
        stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        uid = int((entry / "status").read_text().split("\nUid:", 1)[1].split()[0])
        cmdline = (entry / "cmdline").read_bytes()[:64]
        try:
            env = parse_environ((entry / "environ").read_bytes())
        except OSError:
            env = {}  # a process of another user, seen by an unprivileged check
        return ProcessInfo(
            pid=int(entry.name),
            ppid=int(stat[1]),
            uid=uid,
            comm=(entry / "comm").read_text().strip(),
            cgroup_job=cgroup_job((entry / "cgroup").read_text()),
            stepd_job=stepd_job(cmdline, uid),
            env=env,
            started_at=_boot_time() + int(stat[19]) / os.sysconf("SC_CLK_TCK"),
        )
    except (OSError, IndexError, ValueError):
        return None  # it exited while we read it


@functools.cache
def _boot_time() -> float:
    for line in (_PROC / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


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
