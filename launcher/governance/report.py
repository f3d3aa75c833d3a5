"""``sres governance report``: who used what, as a self-contained HTML page (plots inline), a
terminal table, or JSON for scripts; read from ``sacct``, ``sshare`` and the accounts sres made.

A team's quota and weight are read back from Slurm (the accounts ``sres governance apply``
made), so the report needs no policy file and shows what Slurm enforces, not what a file says.
"""

from __future__ import annotations

import dataclasses
import html
import json
import time
from pathlib import Path
from typing import Any

from launcher.governance.apply import need_accounting, read_managed
from launcher.governance.policy import BORROW, BORROW_SUFFIX
from launcher.governance.slurm_objects import Objects
from launcher.governance.usage import TeamLimits, Usage, usage
from launcher.observability.report import html_table, img_tag, text_table
from launcher.slurm.accounting import Accounting
from launcher.slurm.client import SlurmClient

PLOTS = {
    "utilization": "nodes in use over time, by team (hatched: borrowed)",
    "teams": "each team's quota against the nodes it used, borrowed and lent",
    "waits": "average wait per priority class",
}


def gather(client: SlurmClient, accounting: Accounting, hours: float, now: float | None = None) -> Usage:
    until = time.time() if now is None else now
    since = until - hours * 3600
    config = client.config()
    need_accounting(config)
    cluster = config.get("ClusterName", "")
    managed, _ = read_managed(accounting, cluster)
    classes = sorted(n for n in managed.qos if n != BORROW)
    return usage(
        accounting.jobs(since, until),
        teams_of(managed),
        accounting.shares(),
        len(client.nodes()),
        since,
        until,
        classes,
    )


def teams_of(managed: Objects) -> dict[str, TeamLimits]:
    """Each team's quota and weight, as the accounts sres made hold them (its borrowing account
    is no team of its own)."""
    return {
        name: TeamLimits(_nodes(a.grp_tres), a.fairshare)
        for name, a in managed.accounts.items()
        if not name.endswith(BORROW_SUFFIX)
    }


def _nodes(grp_tres: str) -> int:
    for part in grp_tres.split(","):
        key, _, value = part.partition("=")
        if key == "node" and value.isdigit():
            return int(value)
    return 0


def rows(u: Usage) -> list[dict[str, Any]]:
    return [
        {
            "team": t.team,
            "quota": t.quota_nodes,
            "weight": t.weight,
            "used": round(t.used_nodes, 2),
            "borrowed": round(t.borrowed_nodes, 2),
            "lent": round(t.lent_nodes, 2),
            "share": round(t.norm_shares, 3),
            "usage": round(t.effective_usage, 3),
            "running": t.running,
            "pending": t.pending,
            "preempted": t.preempted,
            "wait s": None if t.mean_wait_s is None else round(t.mean_wait_s, 1),
            "run s": None if t.mean_run_s is None else round(t.mean_run_s, 1),
        }
        for t in u.teams
    ]


def table(u: Usage) -> str:
    """The terminal table: one line per team, then the cluster's utilization."""
    lines = rows(u)
    if not lines:
        return "no team: apply a policy first (sres governance apply POLICY)"
    hours = (u.until - u.since) / 3600
    summary = f"cluster: {u.cluster_nodes} nodes, {u.utilization:.1%} in use over the last {hours:g} h"
    return f"{text_table(list(lines[0]), lines, right=True)}\n{summary}"


def as_json(u: Usage) -> str:
    data = dataclasses.asdict(u)
    for key in ("times", "own", "borrowed"):
        data.pop(key)  # the series behind the plots: in the page, not in a script's line
    return json.dumps(data, sort_keys=True)


def render(u: Usage, out: Path) -> Path:
    from launcher.governance import report_plots  # matplotlib: only when a page is drawn, not at every sres

    out.parent.mkdir(parents=True, exist_ok=True)
    images = {name: out.with_name(f"{out.stem}-{name}.png") for name in PLOTS}
    report_plots.utilization(images["utilization"], u)
    report_plots.teams(images["teams"], u)
    report_plots.waits(images["waits"], u)
    out.write_text(page(u, images))
    return out


def page(u: Usage, images: dict[str, Path]) -> str:
    team_rows = rows(u)
    teams = html_table(team_rows) if team_rows else "<p>No team: apply a policy first.</p>"
    classes = [{"class": c.name, "jobs": c.jobs, "wait s": c.mean_wait_s} for c in u.classes]
    borrowers = [{"team": t, "borrowed node-hours": h} for t, h in u.top_borrowers]
    start, end = (time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) for t in (u.since, u.until))
    window = f"{start} to {end}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>sres governance report</title>
<style>body{{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}}
table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
th{{background:#eee}}img{{max-width:100%}}</style></head><body>
<h1>Cluster governance</h1>
<p>{html.escape(window)}: {u.cluster_nodes} nodes, <b>{u.utilization:.1%}</b> in use.</p>
<h2>Utilization</h2>{img_tag(images["utilization"], PLOTS["utilization"])}
<h2>Teams</h2>{img_tag(images["teams"], PLOTS["teams"])}
<p>Nodes are averages over the window; "lent": others' borrowed nodes, shared among the teams by
the quota each left unused at that moment. Share and usage: <code>sshare</code>'s normalized shares
and effective usage.</p>{teams}
<h2>Priority classes</h2>{img_tag(images["waits"], PLOTS["waits"])}{html_table(classes) if classes else ""}
<h2>Top borrowers</h2>{html_table(borrowers) if borrowers else "<p>Nobody borrowed.</p>"}
</body></html>
"""
