"""What Slurm tells us about nodes and jobs, as typed values shared by every backend.

``Node`` and ``Job`` are frozen dataclasses; Slurm's many spellings of a node's state
(``IDLE+DRAIN``, ``idle*``, ``drained``) are reduced to one base state and a set of flags.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REASON_PREFIX = "sres:"
"""Every drain we make carries this prefix; we only ever resume drains that carry it."""

FINISHED_JOB_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)


@dataclass(frozen=True)
class Node:
    """One node as Slurm sees it now.

    ``state`` is the base state in upper case (``IDLE``, ``ALLOCATED``, ``MIXED``, ``DOWN``,
    ...); ``flags`` holds the modifiers Slurm prints after a ``+`` (``DRAIN``,
    ``NOT_RESPONDING``, ``COMPLETING``, ``FAIL``, ...). Keeping them apart avoids the many
    spellings Slurm's tools use for the same condition (``drained``, ``drng``, ``idle*``).
    """

    name: str
    state: str
    flags: frozenset[str] = frozenset()
    reason: str = ""
    partitions: tuple[str, ...] = ()
    address: str = ""
    hostname: str = ""
    cpus: int = 0
    port: int = 0
    """slurmd's port: where the supervisor probes whether the node's slurmd still answers."""

    @property
    def drained(self) -> bool:
        """Drained or draining: Slurm will start no new job here."""
        return "DRAIN" in self.flags

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags and self.state != "DOWN"

    @property
    def drained_by_us(self) -> bool:
        return self.drained and self.reason.startswith(REASON_PREFIX)

    @property
    def usable(self) -> bool:
        """Up, responding and accepting work (whether or not it is busy now)."""
        bad = {"DRAIN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "MAINTENANCE", "REBOOT_REQUESTED"}
        return self.state not in {"DOWN", "UNKNOWN", "FUTURE"} and not (self.flags & bad)

    @property
    def idle(self) -> bool:
        return self.state == "IDLE" and self.usable and "COMPLETING" not in self.flags

    @property
    def long_state(self) -> str:
        """Slurm's ``State=`` spelling, e.g. ``IDLE+DRAIN``."""
        return "+".join([self.state, *sorted(self.flags)])


@dataclass(frozen=True)
class Job:
    """One job as Slurm sees it now; ``nodes`` is the current, expanded node list."""

    job_id: str
    state: str
    name: str = ""
    nodes: tuple[str, ...] = ()
    num_nodes: int = 0
    restart_count: int = 0
    reason: str = ""
    partition: str = ""
    batch_host: str = ""
    array_job_id: str | None = None
    array_task_id: str | None = None
    exit_code: str = ""
    time_limit_s: float | None = None
    """None: no limit (``UNLIMITED``) or not known."""
    run_time_s: float | None = None
    extra: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_JOB_STATES

    @property
    def time_left_s(self) -> float | None:
        if self.time_limit_s is None or self.run_time_s is None:
            return None
        return self.time_limit_s - self.run_time_s


@dataclass(frozen=True)
class JobOwner:
    """Whose a job is and what its Comment says, from Slurm's typed records only: text parsing
    lets one user-controlled field (a Comment, a job name) impersonate another (``UserId=``).
    What ``sres ... --job J`` trusts."""

    job_id: str
    user_id: int
    state: str
    batch_host: str
    comment: str
    end_time: float | None = None
    """When it ended (Unix seconds), or is expected to; None where Slurm did not say."""

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"


def duration_s(text: str) -> float | None:
    """Seconds of a Slurm duration (``minutes``, ``minutes:seconds``, ``hours:minutes:seconds``,
    ``days-hours[:minutes[:seconds]]``, as sbatch --time and scontrol spell them); None for
    ``UNLIMITED``, ``INVALID``, ``NONE`` or anything else that is not a duration."""
    text = text.strip()
    days, _, clock = text.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or (days and not days.isdigit()) or len(parts) > 3:
        return None
    values = [int(p) for p in parts]
    if days:  # days-hours, days-hours:minutes, days-hours:minutes:seconds
        hours, minutes, seconds = (values + [0, 0])[:3]
    elif len(values) == 3:  # hours:minutes:seconds
        hours, minutes, seconds = values
    else:  # minutes, minutes:seconds
        hours, (minutes, seconds) = 0, (values + [0])[:2]
    return float(((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds)


def split_state(long_state: str) -> tuple[str, frozenset[str]]:
    """``"IDLE+DRAIN"`` -> ``("IDLE", {"DRAIN"})``; a trailing ``*`` means not responding."""
    parts = [p for p in long_state.strip().upper().split("+") if p]
    if not parts:
        return "UNKNOWN", frozenset()
    base, flags = parts[0], set(parts[1:])
    for i, part in enumerate([base, *flags]):
        if part.endswith("*"):
            flags.add("NOT_RESPONDING")
            if i == 0:
                base = base.rstrip("*")
            else:
                flags.discard(part)
                flags.add(part.rstrip("*"))
    if base == "DRAINED" or base == "DRAINING":
        base, flags = ("IDLE" if base == "DRAINED" else "ALLOCATED"), flags | {"DRAIN"}
    return base, frozenset(flags)
