"""What the cluster did with a governance policy, from the accounting records (pure): per team
its quota, the nodes it used of its own, borrowed and lent, its tasks and their waits.

Every number comes from ``sacct`` records clipped to the window, so a reader can check it there:
a job's node-seconds are its nodes times the part of its run inside the window. A team's own
work is its account's; its borrowed work is its ``<team>_borrow`` account's. Slurm does not say
whose idle node a borrower got, so "lent" is an attribution: at each moment the borrowed nodes
are shared among the teams in proportion to the quota each left unused then.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.governance.policy import BORROW_SUFFIX
from launcher.slurm.accounting import AccountedJob, Share

PREEMPTED_STATES = frozenset({"PREEMPTED", "REQUEUED"})
"""A run of a job that ended because Slurm took its nodes (requeued runs end ``REQUEUED``)."""
SAMPLES = 240


@dataclass(frozen=True)
class TeamUsage:
    team: str
    quota_nodes: int
    weight: int
    used_nodes: float
    """Nodes its own work held, on average over the window."""
    borrowed_nodes: float
    lent_nodes: float
    norm_shares: float
    effective_usage: float
    running: int
    pending: int
    preempted: int
    """Runs of its jobs that Slurm ended to give their nodes to other work, in the window."""
    mean_wait_s: float | None
    mean_run_s: float | None
    node_hours_own: float
    node_hours_borrowed: float


@dataclass(frozen=True)
class ClassUsage:
    name: str
    jobs: int
    mean_wait_s: float | None


@dataclass(frozen=True)
class Usage:
    since: float
    until: float
    cluster_nodes: int
    utilization: float
    """Busy node-seconds over available node-seconds."""
    teams: tuple[TeamUsage, ...]
    classes: tuple[ClassUsage, ...]
    times: tuple[float, ...]
    own: Mapping[str, tuple[float, ...]]
    """team -> nodes its own work held at each of ``times``."""
    borrowed: Mapping[str, tuple[float, ...]]
    top_borrowers: tuple[tuple[str, float], ...]
    """(team, borrowed node-hours), most first."""


@dataclass(frozen=True)
class TeamLimits:
    quota_nodes: int
    weight: int


def team_of(account: str, teams: Mapping[str, TeamLimits]) -> tuple[str, bool]:
    """(team, borrowed) for an account; ("", False) when it is no team's."""
    if account in teams:
        return account, False
    base = account[: -len(BORROW_SUFFIX)] if account.endswith(BORROW_SUFFIX) else ""
    return (base, True) if base in teams else ("", False)


def usage(
    jobs: Sequence[AccountedJob],
    teams: Mapping[str, TeamLimits],
    shares: Mapping[str, Share],
    cluster_nodes: int,
    since: float,
    until: float,
    classes: Sequence[str] = (),
) -> Usage:
    span = max(until - since, 1e-9)
    times = tuple(since + span * (i + 0.5) / SAMPLES for i in range(SAMPLES))
    own = {t: _held(jobs, teams, t, False, times, until) for t in teams}
    borrowed = {t: _held(jobs, teams, t, True, times, until) for t in teams}
    lent = _lent(teams, own, borrowed)
    rows = tuple(
        _team_row(
            name, limits, jobs, teams, shares.get(name), own[name], borrowed[name], lent[name], since, until
        )
        for name, limits in sorted(teams.items())
    )
    busy = _node_seconds_of(jobs, since, until)
    names = list(classes) or sorted({j.qos for j in jobs if team_of(j.account, teams)[0]})
    return Usage(
        since=since,
        until=until,
        cluster_nodes=cluster_nodes,
        utilization=busy / (cluster_nodes * span) if cluster_nodes else 0.0,
        teams=rows,
        classes=tuple(_class_row(c, jobs, since, until) for c in names),
        times=times,
        own=own,
        borrowed=borrowed,
        top_borrowers=tuple(
            sorted(
                ((r.team, r.node_hours_borrowed) for r in rows if r.node_hours_borrowed > 0),
                key=lambda x: -x[1],
            )
        ),
    )


def _team_row(
    name: str,
    limits: TeamLimits,
    jobs: Sequence[AccountedJob],
    teams: Mapping[str, TeamLimits],
    share: Share | None,
    own: tuple[float, ...],
    borrowed: tuple[float, ...],
    lent: tuple[float, ...],
    since: float,
    until: float,
) -> TeamUsage:
    mine = [j for j in jobs if team_of(j.account, teams)[0] == name]
    borrowed_work = [j for j in mine if team_of(j.account, teams)[1]]
    own_work = [j for j in mine if not team_of(j.account, teams)[1]]
    runs = [
        j.end - j.start for j in mine if j.end is not None and j.start is not None and since <= j.end <= until
    ]
    return TeamUsage(
        team=name,
        quota_nodes=limits.quota_nodes,
        weight=limits.weight,
        used_nodes=statistics.fmean(own),
        borrowed_nodes=statistics.fmean(borrowed),
        lent_nodes=statistics.fmean(lent),
        norm_shares=share.norm_shares if share else 0.0,
        effective_usage=share.effective_usage if share else 0.0,
        running=sum(j.state == "RUNNING" for j in mine),
        pending=sum(j.state == "PENDING" for j in mine),
        preempted=sum(j.state in PREEMPTED_STATES for j in mine),
        mean_wait_s=_mean_wait(mine, since),
        mean_run_s=statistics.fmean(runs) if runs else None,
        node_hours_own=_node_seconds_of(own_work, since, until) / 3600,
        node_hours_borrowed=_node_seconds_of(borrowed_work, since, until) / 3600,
    )


def _class_row(name: str, jobs: Sequence[AccountedJob], since: float, until: float) -> ClassUsage:
    mine = [j for j in jobs if j.qos == name]
    return ClassUsage(name, len(mine), _mean_wait(mine, since))


def _mean_wait(jobs: Sequence[AccountedJob], since: float) -> float | None:
    """Submission to start, over the runs that started in the window."""
    waits = [
        j.start - j.submit for j in jobs if j.start is not None and j.submit is not None and j.start >= since
    ]
    return statistics.fmean(waits) if waits else None


def _node_seconds_of(jobs: Sequence[AccountedJob], since: float, until: float) -> float:
    return sum(_node_seconds(j, since, until) for j in jobs)


def _node_seconds(job: AccountedJob, since: float, until: float) -> float:
    if job.start is None:
        return 0.0
    end = min(job.end if job.end is not None else until, until)
    return job.nodes * max(0.0, end - max(job.start, since))


def _held(
    jobs: Sequence[AccountedJob],
    teams: Mapping[str, TeamLimits],
    team: str,
    borrowed: bool,
    times: tuple[float, ...],
    until: float,
) -> tuple[float, ...]:
    spans = [
        (j.start, j.end if j.end is not None else until, j.nodes)
        for j in jobs
        if j.start is not None and team_of(j.account, teams) == (team, borrowed)
    ]
    return tuple(float(sum(n for s, e, n in spans if s <= t < e)) for t in times)


def _lent(
    teams: Mapping[str, TeamLimits],
    own: Mapping[str, tuple[float, ...]],
    borrowed: Mapping[str, tuple[float, ...]],
) -> dict[str, tuple[float, ...]]:
    out: dict[str, list[float]] = {t: [] for t in teams}
    for i in range(SAMPLES):
        unused = {t: max(0.0, teams[t].quota_nodes - own[t][i]) for t in teams}
        total_unused = sum(unused.values())
        taken = sum(b[i] for b in borrowed.values())
        for t in teams:
            by_others = taken - borrowed[t][i]  # a team lends nothing to itself
            share = by_others * unused[t] / total_unused if total_unused else 0.0
            out[t].append(min(unused[t], share))
    return {t: tuple(v) for t, v in out.items()}
