"""The governance report's pictures (matplotlib, Agg): the cluster's nodes over time by team,
each team's quota against what it used, borrowed and lent, and the wait of each priority class."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from launcher.governance.usage import Usage  # noqa: E402


def utilization(path: Path, u: Usage) -> None:
    """Stacked: each team's own nodes (solid) and borrowed nodes (hatched), under the cluster's size."""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    minutes = [(t - u.since) / 60 for t in u.times]
    layers, labels, hatches = [], [], []
    for team in sorted(u.own):
        layers += [u.own[team], u.borrowed[team]]
        labels += [f"{team}", f"{team} (borrowed)"]
        hatches += ["", "//"]
    if layers:
        stacks = ax.stackplot(minutes, *layers, labels=labels, alpha=0.85)
        for stack, hatch in zip(stacks, hatches):
            stack.set_hatch(hatch)
    ax.axhline(u.cluster_nodes, color="black", linestyle="--", linewidth=1, label="cluster")
    ax.set_xlabel("minutes since the window's start")
    ax.set_ylabel("nodes")
    ax.set_ylim(0, u.cluster_nodes * 1.15 + 0.5)
    ax.legend(loc="upper left", fontsize=7, ncol=4)
    _save(fig, path)


def teams(path: Path, u: Usage) -> None:
    """Per team: quota, average nodes used of its own, borrowed and lent."""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    names = [t.team for t in u.teams]
    width = 0.2
    series = [
        ("quota", [t.quota_nodes for t in u.teams], "lightgray"),
        ("used", [t.used_nodes for t in u.teams], "tab:blue"),
        ("borrowed", [t.borrowed_nodes for t in u.teams], "tab:orange"),
        ("lent", [t.lent_nodes for t in u.teams], "tab:green"),
    ]
    for i, (label, values, colour) in enumerate(series):
        ax.bar([x + (i - 1.5) * width for x in range(len(names))], values, width, label=label, color=colour)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("nodes (average)")
    ax.legend(fontsize=8)
    _save(fig, path)


def waits(path: Path, u: Usage) -> None:
    """Average wait from submission to start, per priority class."""
    fig, ax = plt.subplots(figsize=(9, 2.8))
    names = [c.name for c in u.classes]
    ax.bar(names, [c.mean_wait_s or 0.0 for c in u.classes], color="tab:purple")
    ax.set_ylabel("average wait (s)")
    ax.set_xlabel("priority class (QOS)")
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
