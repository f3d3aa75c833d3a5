"""Where a run's wall time went, by cause: the goodput account of the ``finished`` event.

Pure: it reads the events of the run's last start (one process of the supervisor; a requeued
job appends a new start) and splits the time from ``start`` to the end into causes that sum to
it exactly. Each cause but the last is measured by the events; ``other`` is what is left
(steps slower than the median: stragglers, checkpoint stalls, noise) and so is never hidden.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

CAUSES: tuple[str, ...] = (
    "productive",
    "startup",
    "detection",
    "reform",
    "transfer",
    "first_step",
    "redone",
    "resize",
    "waiting",
    "checkpoint",
    "straggler",
    "other",
)
"""``productive``: steps done once, at the median time of a step's useful part (its slowest
rank's step time less checkpoint blocking and straggler wait). ``startup``: start to the
first step (processes, imports, process group, first step's warm-up). ``detection``: a fault
to the last survivor leaving its generation. ``reform``: from there to the new group formed,
less ``waiting``. ``transfer``: state from peers or tiers. ``first_step``: the first step
after a recovery beyond a median step. ``redone``: steps lost and done again. ``resize``:
requested resizes (re-form, transfer, first step; training goes on while waiting for the
step boundary). ``waiting``: no node to go on with, until one came (``waiting`` event to the
next generation). ``checkpoint``: commits blocked on the previous commit's snapshot, tier copy
or buddy round (each step's longest). ``straggler``: each step's slowest compute beyond the
median rank's. ``other``: the rest (noise, slow steps of every rank)."""


def last_run(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events from the newest ``start`` on."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    return list(events[starts[-1] :]) if starts else []


def account(
    events: Sequence[dict[str, Any]],
    end_t: float,
    steps: int,
    median_step_s: float | None,
    first_step_t: float | None,
    step_records: Iterable[dict[str, Any]] = (),
) -> dict[str, float]:
    """Seconds by cause (:data:`CAUSES`) from the run's start to ``end_t``; they sum to the wall time.
    ``step_records``: the ranks' per-step times (``step_times.jsonl``), for the stalls in steps."""
    run = last_run(events)
    if not run:
        return {}
    wall = end_t - run[0]["t"]
    stalls = step_stalls(r for r in step_records if r.get("t", end_t) >= run[0]["t"])  # this run's steps
    median = stalls.pop("useful_step_s", None) or median_step_s or 0.0
    seconds = dict.fromkeys(CAUSES, 0.0)
    seconds.update(stalls)
    seconds["startup"] = max(0.0, (first_step_t - run[0]["t"]) if first_step_t is not None else wall)
    waited = waiting_by_generation(run)
    seconds["waiting"] = sum(waited.values())
    recovered_generations = set()
    for e in _one_per_generation(r for r in run if r["event"] == "recovered"):
        recovered_generations.add(e["generation"])
        detection = e.get("release_s") or 0.0
        seconds["detection"] += detection
        seconds["reform"] += max(
            0.0, (e.get("reform_s") or 0.0) - detection - waited.get(e["generation"], 0.0)
        )
        seconds["transfer"] += e.get("transfer_s") or 0.0
        seconds["first_step"] += max(0.0, (e.get("first_step_s") or 0.0) - median)
        seconds["redone"] += (e.get("steps_lost") or 0) * median
    for e in run:
        if e["event"] == "resize" and e.get("generation") not in recovered_generations:
            seconds["resize"] += sum(max(0.0, e.get(k) or 0.0) for k in ("reform_s", "transfer_s"))
            seconds["resize"] += max(0.0, (e.get("first_step_s") or 0.0) - median)
    # a run that resumed from a checkpoint (a requeued job, a restart) made only the steps after it
    resumed = next((e["step"] + 1 for e in run if e["event"] == "restored" and e.get("generation") == 1), 0)
    seconds["productive"] = max(0, steps - resumed - 1) * median
    seconds["other"] = wall - sum(v for k, v in seconds.items() if k != "other")
    return seconds


def step_stalls(records: Iterable[dict[str, Any]]) -> dict[str, float]:
    """Checkpoint blocking and straggler wait summed over steps, and the median useful step time
    (each step as its slowest rank saw it). A step done twice (after a recovery) counts twice."""
    by_step: dict[tuple[int, int], dict[int, dict[str, Any]]] = {}
    for r in records:
        by_step.setdefault((r["generation"], r["step"]), {})[r["rank"]] = r
    checkpoint = straggler = 0.0
    useful = []
    for ranks in by_step.values():
        blocked = max(r.get("blocked_s", 0.0) for r in ranks.values())
        computes = [r["compute_s"] for r in ranks.values()]
        wait = max(computes) - statistics.median(computes)
        checkpoint, straggler = checkpoint + blocked, straggler + wait
        useful.append(max(r["step_s"] for r in ranks.values()) - blocked - wait)
    if not useful:
        return {}
    return {"checkpoint": checkpoint, "straggler": straggler, "useful_step_s": statistics.median(useful)}


def waiting_by_generation(run: Sequence[dict[str, Any]]) -> dict[int, float]:
    """Seconds from each ``waiting`` event to the generation formed after it, by that generation."""
    out: dict[int, float] = {}
    for i, e in enumerate(run):
        if e["event"] == "waiting":
            after = next((g for g in run[i:] if g["event"] == "generation"), None)
            if after is not None:
                out[after["generation"]] = out.get(after["generation"], 0.0) + after["t"] - e["t"]
    return out


def _one_per_generation(recovered) -> list[dict[str, Any]]:
    """Faults recovered by the same generation overlap in time: keep the earliest (longest) one."""
    by_generation: dict[int, dict[str, Any]] = {}
    for e in recovered:
        kept = by_generation.get(e["generation"])
        if kept is None or e["seconds"] > kept["seconds"]:
            by_generation[e["generation"]] = e
    return list(by_generation.values())
