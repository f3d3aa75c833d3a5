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


class Accounting:
    """``sacctmgr``: read every record of a kind, or run one change."""

    def __init__(self, command: CommandLine | None = None) -> None:
        self.command = command or CommandLine()

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


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # "parent" (fair share from the parent), "" (not set)
        return 0
