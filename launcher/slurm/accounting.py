"""Slurm's accounting database through ``sacctmgr``: QOS, accounts and their associations, read as
typed records and changed by whole commands.

Facts of 22.05 that shape it (checked against slurmdbd on MariaDB, tests/support/accounting.py):
``sacctmgr`` without ``-i`` asks "Would you like to commit changes?" and waits 30 s, so every
change passes ``-i``; adding what exists prints "Nothing new added" and exits 1, so callers read
first and add only what is missing; ``-nP`` prints ``|``-separated rows without a header; list
fields come back sorted (``QOS=borrow,training``) and durations as ``HH:MM:SS``. Commands run
through :class:`~launcher.slurm.command_driver.CommandLine`, the project's one runner of Slurm
commands.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.slurm.command_driver import CommandLine
from launcher.slurm.types import duration_s


@dataclass(frozen=True)
class QosRecord:
    name: str
    description: str
    priority: int
    preempt: tuple[str, ...] = ()
    preempt_mode: str = "cluster"
    """``cluster`` (slurm.conf's PreemptMode), ``requeue``, ``cancel``, ``suspend``, ``off``."""
    grace_time_s: int = 0
    grp_tres: str = ""
    """``node=2,gres/gpu=8`` as Slurm prints it, sorted; "" for none."""


@dataclass(frozen=True)
class AssocRecord:
    """An account's association on a cluster (``user`` "") or a user's in an account."""

    account: str
    user: str
    parent: str
    fairshare: int
    grp_tres: str
    qos: tuple[str, ...]
    default_qos: str


@dataclass(frozen=True)
class AccountedJob:
    """One run of a job as the accounting database holds it (``sacct -X -D``: a requeued job is
    one record per run, the earlier ones ``REQUEUED`` or ``PREEMPTED``). Times in Unix seconds;
    None where it has not happened."""

    job_id: str
    name: str
    user: str
    account: str
    qos: str
    state: str
    submit: float | None
    start: float | None
    end: float | None
    nodes: int
    reason: str = ""


@dataclass(frozen=True)
class Share:
    """An account's fair share (``sshare``): its normalized shares and its effective usage."""

    account: str
    norm_shares: float
    raw_usage: int
    effective_usage: float


class Accounting:
    """``sacctmgr``, ``sacct`` and ``sshare``: read every record of a kind, or run one change."""

    def __init__(self, command: CommandLine | None = None) -> None:
        self.command = command or CommandLine()
        env = dict(self.command.env if self.command.env is not None else os.environ)
        self._sacct = dataclasses.replace(self.command, env={**env, "SLURM_TIME_FORMAT": "%s"})
        """Times as Unix seconds, not in the local time zone's words."""

    def jobs(self, since: float, until: float | None = None) -> list[AccountedJob]:
        """Every user's jobs that were eligible, ran or ended in [since, until] (until: now)."""
        window = ["-S", _when(since), "-E", _when(until) if until is not None else "now"]
        columns = "jobid,jobname,user,account,qos,state,submit,start,end,nnodes,reason"
        out = self._sacct(["sacct", "-a", "-X", "-D", "-nP", *window, "-o", columns])
        rows = [line.split("|") for line in out.splitlines() if line.strip()]
        return [
            AccountedJob(
                job_id=r[0],
                name=r[1],
                user=r[2],
                account=r[3],
                qos=r[4],
                state=r[5].split()[0] if r[5] else "",  # "CANCELLED by 0" -> CANCELLED
                submit=_time(r[6]),
                start=_time(r[7]),
                end=_time(r[8]),
                nodes=_int(r[9]),
                reason=r[10],
            )
            for r in rows
            if len(r) >= 11
        ]

    def shares(self) -> dict[str, Share]:
        """Each account's share (the account's own row, not its users')."""
        out = self.command(["sshare", "-nP", "-a", "-o", "account,user,normshares,rawusage,effectvusage"])
        shares = {}
        for line in out.splitlines():
            r = line.split("|")
            if len(r) >= 5 and not r[1]:
                name = r[0].strip()
                shares[name] = Share(name, _float(r[2]), _int(r[3]), _float(r[4]))
        return shares

    def qos(self) -> list[QosRecord]:
        rows = self._rows(
            "show", "qos", "format=name,description,priority,preempt,preemptmode,gracetime,grptres"
        )
        return [
            QosRecord(
                name=r[0],
                description=r[1],
                priority=_int(r[2]),
                preempt=_names(r[3]),
                preempt_mode=r[4].lower(),
                grace_time_s=int(duration_s(r[5]) or 0),
                grp_tres=sorted_tres(r[6]),
            )
            for r in rows
        ]

    def account_descriptions(self) -> dict[str, str]:
        """Every account's description: the place this project marks what it manages."""
        return {r[0]: r[1] for r in self._rows("show", "account", "format=account,description")}

    def associations(self, cluster: str) -> list[AssocRecord]:
        rows = self._rows(
            "show",
            "assoc",
            "where",
            f"cluster={cluster}",
            "format=account,user,parentname,fairshare,grptres,qos,defaultqos",
        )
        return [
            AssocRecord(
                account=r[0],
                user=r[1],
                parent=r[2],
                fairshare=_int(r[3]),
                grp_tres=sorted_tres(r[4]),
                qos=_names(r[5]),
                default_qos=r[6],
            )
            for r in rows
        ]

    def clusters(self) -> list[str]:
        return [r[0] for r in self._rows("show", "cluster", "format=cluster")]

    def change(self, args: Sequence[str]) -> str:
        """Run ``sacctmgr -i ARGS``: a refusal raises ``SlurmCommandError``."""
        return self.command(["sacctmgr", "-i", *args])

    def _rows(self, *args: str) -> list[list[str]]:
        out = self.command(["sacctmgr", "-nP", *args])
        return [line.split("|") for line in out.splitlines() if line.strip()]


def sorted_tres(text: str) -> str:
    """A TRES list in one spelling whatever the order it was written in."""
    return ",".join(sorted(p for p in text.split(",") if p))


def _names(text: str) -> tuple[str, ...]:
    return tuple(sorted(n for n in text.split(",") if n))


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def _time(text: str) -> float | None:
    return float(text) if text.isdigit() else None  # "Unknown", "None": not yet


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # "parent" (fair share from the parent), "" (not set)
        return 0
