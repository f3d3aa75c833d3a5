"""The goodput model's inputs from runs that happened: each rung's cost as the median of the
``recovered`` events it took, read from ``events.jsonl`` (pure).

A recovery is filed under the rung that took it by what its generation's events say: a ``node``
fault whose ranks went to a node that was added before the fault (a warm spare, whatever its
source) is the spare rung; one whose ranks went to a node Slurm gave after the fault (a
satellite, an expansion) is the new-node rung (its seconds hold the node's acquisition and
start-up; a local run's simulated node back from repair measures nothing); a process fault (a
kill, an exit, an exception) is the in-process rung. A hang is left out: its seconds hold the
hang timeout of that run, which the model takes as an input. Resizes give the shrink (a smaller
world) and the regrowth (a larger one). A rung no event measured keeps its default, and the
table says so. The ranks the costs were measured at are the median world size of the
generations whose recoveries were measured: ``sres simulate`` adds what the control path costs
beyond that scale (:mod:`launcher.observability.goodput_scale`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from launcher.observability.goodput_strategies import Ladder
from launcher.observability.timeline import Timeline, timeline

FROM_THE_SCHEDULER = frozenset({"satellite", "expansion"})
"""``node-added.how`` of a node Slurm gave after the fault (an idle node of a local run is simulated)."""
DEFAULT_SOURCES = {
    "inprocess_s": "default: the 500-fault soak's median (docs/benchmarks.md)",
    "spare_s": "default: node kill -> resumed with a warm spare (docs/benchmarks.md, auto-resume)",
    "node_start_s": "default: a satellite's node kill -> resumed, forked (docs/benchmarks.md)",
    "shrink_s": "default: a lent node taken back -> the first step on fewer (docs/benchmarks.md)",
    "regrow_s": "default: the pause to grow back into a lent node (docs/benchmarks.md)",
    "lost_steps": "default",
    "steady_overhead": "default: no commit blocking measured",
    "measured_ranks": "default: this machine's benchmarks, 4 ranks",
}
NOT_RUNGS = ("lost_steps", "steady_overhead", "measured_ranks")
"""Inputs measured with a rung's recoveries, not recoveries themselves."""


def by_rung(events: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """Recovery seconds by the ladder's field they measure (one per generation: its slowest)."""
    samples: dict[str, list[float]] = {k: [] for k in DEFAULT_SOURCES}
    faults: list[str] = []
    hows: set[str] = set()
    counted: set[int] = set()
    slowest: dict[int, dict[str, Any]] = {}
    events = timeline(events)
    for e in events.of("recovered"):
        if e.get("seconds") is not None:
            g = e.get("generation", -1)
            if g not in slowest or e["seconds"] > slowest[g]["seconds"]:
                slowest[g] = e
    added_since_fault: set[int] = set()
    scheduled, world = False, None
    for e in events:
        kind = e.name
        if kind == "generation":
            world = e.get("world_size")
        elif kind == "fault":
            if not faults:
                added_since_fault, scheduled = set(), False
            faults.append(str(e.get("kind", "")))
        elif kind == "node-added" and faults:
            added_since_fault.add(e.get("node", -1))
            scheduled = scheduled or e.get("how") in FROM_THE_SCHEDULER
        elif kind == "replaced":
            new = e.get("node") in added_since_fault
            hows.add(("new node" if scheduled else "simulated node") if new else str(e.get("how", "")))
        elif kind == "recovered" and e.get("generation") not in counted:
            g = e.get("generation", -1)
            counted.add(g)
            field = _rung_of(faults, hows)
            if field is not None and g in slowest:
                samples[field].append(slowest[g]["seconds"])
                samples["lost_steps"].append(slowest[g].get("steps_lost") or 0)
                samples["measured_ranks"] += [world] if world else []
            faults, hows = [], set()
        elif kind == "resize" and e.get("why") != "fault" and e.get("seconds") is not None:
            smaller = e.get("to_world", 0) < e.get("from_world", 0)
            samples["shrink_s" if smaller else "regrow_s"].append(e["seconds"])
    return samples


def _rung_of(faults: list[str], hows: set[str]) -> str | None:
    if "hang" in faults or not faults:
        return None
    if "simulated node" in hows:
        return None  # a local run's node back from repair: no scheduler, no node's start-up
    if "node" in faults:
        return "node_start_s" if "new node" in hows else "spare_s"
    return "inprocess_s"


def steady_overhead(events: Iterable[dict[str, Any]]) -> float | None:
    """Commit blocking over useful step time, from the runs' ``finished`` accounts."""
    accounts = [e["goodput_by_cause"] for e in Timeline(events).of("finished") if e.get("goodput_by_cause")]
    blocked = sum(a.get("checkpoint", 0.0) for a in accounts)
    useful = sum(a.get("productive", 0.0) for a in accounts)
    return blocked / (useful + blocked) if accounts and useful + blocked > 0 else None


def measured_ladder(events: Sequence[dict[str, Any]], base: Ladder) -> tuple[Ladder, dict[str, str]]:
    """``base`` with every rung the events measured set to its median; and where each input
    came from. Raises ValueError when no event measured any rung."""
    samples = by_rung(events)
    if not any(samples[k] for k in DEFAULT_SOURCES if k not in NOT_RUNGS):
        raise ValueError("no recovery to measure: give runs with faults (e.g. sres demo, or --inject)")
    changes: dict[str, float] = {}
    sources = dict(DEFAULT_SOURCES)
    for name, values in samples.items():
        if values:
            median = statistics.median(values)
            changes[name] = round(median) if name == "measured_ranks" else float(median)
            sources[name] = f"median of {len(values)} measured"
    overhead = steady_overhead(events)
    if overhead is not None:
        changes["steady_overhead"] = overhead
        sources["steady_overhead"] = "measured: commit blocking over useful step time"
    return dataclasses.replace(base, **changes), sources
