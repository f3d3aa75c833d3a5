"""``sres jobs``: the cluster's tasks with their team, priority class, state, and whether they run
on borrowed capacity (a contract: code outside the project calls it).

The team and the borrowing come from the accounts ``sres governance apply`` made (``T`` and
``T_borrow``); without an accounting database, or for an account sres did not make, the account's
name stands for the team.
"""

from __future__ import annotations

import argparse
import json

from launcher.errors import SlurmError
from launcher.governance.apply import read_managed
from launcher.governance.policy import BORROW
from launcher.governance.report import teams_of
from launcher.governance.usage import TeamLimits, team_of
from launcher.observability.report import text_table
from launcher.slurm.accounting import Accounting
from launcher.slurm.client import SlurmClient
from launcher.slurm.command_driver import CommandLine
from launcher.slurm.types import Job

COLUMNS = ("job", "name", "user", "team", "class", "state", "nodes", "borrowed", "reason")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("jobs", help="the cluster's tasks: team, priority class, state, borrowed or not")
    p.add_argument("--json", action="store_true", help="one JSON object per task, one per line")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for each Slurm command (default 30)")
    p.set_defaults(func=_cmd_jobs)


def rows(jobs: list[Job], teams: dict[str, TeamLimits]) -> list[dict[str, object]]:
    out = []
    for job in sorted(jobs, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0):
        if job.finished:
            continue
        account, qos = (_known(job.extra.get(key, "")) for key in ("Account", "QOS"))
        team, borrowed = team_of(account, teams)
        out.append(
            {
                "job": job.job_id,
                "name": job.name,
                "user": job.extra.get("UserId", "").split("(")[0],
                "team": team or account,
                "class": qos,
                "state": job.state,
                "nodes": job.num_nodes or len(job.nodes),
                "borrowed": borrowed or qos == BORROW,
                "reason": "" if job.reason in ("None", "") else job.reason,
            }
        )
    return out


def _known(value: str) -> str:
    return "" if value == "(null)" else value  # no accounting database: Slurm has no account or QOS


def _cmd_jobs(args: argparse.Namespace) -> int:
    client = SlurmClient.create("cli", timeout_s=args.timeout)
    try:
        cluster = client.config().get("ClusterName", "")
        managed, _ = read_managed(Accounting(CommandLine(timeout_s=args.timeout)), cluster)
        teams = teams_of(managed)
    except SlurmError:  # no accounting database: accounts stand for teams
        teams = {}
    listed = rows(client.driver.jobs(), teams)
    if args.json:
        for row in listed:
            print(json.dumps(row))
        return 0
    print(text_table(COLUMNS, listed))
    return 0
