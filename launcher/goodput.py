"""Where a run's wall time went, by cause: the goodput account of the ``finished`` event.

Pure: it reads the events of the run's last start (one process of the supervisor; a requeued
job appends a new start) and splits the time from ``start`` to the end into causes that sum to
it exactly. Each cause but the last is measured by the events; ``other`` is what is left
(steps slower than the median: stragglers, checkpoint stalls, noise) and so is never hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

CAUSES: tuple[str, ...] = ("productive", "startup", "detection", "reform", "transfer", "first_step", "redone",
                           "resize", "other")
"""``productive``: steps done once, at the median step time. ``startup``: start to the first
step (processes, imports, process group, first step's warm-up). ``detection``: a fault to the
last survivor leaving its generation. ``reform``: from there to the new group formed.
``transfer``: state from peers or tiers. ``first_step``: the first step after a recovery
beyond a median step. ``redone``: steps lost and done again. ``resize``: requested resizes
(re-form, transfer, first step; training goes on while waiting for the step boundary).
``other``: the rest."""


def last_run(events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events from the newest ``start`` on."""
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    return list(events[starts[-1]:]) if starts else []


def account(events: Sequence[dict[str, Any]], end_t: float, steps: int, median_step_s: float | None,
            first_step_t: float | None) -> dict[str, float]:
    """Seconds by cause (:data:`CAUSES`) from the run's start to ``end_t``; they sum to the wall time."""
    run = last_run(events)
    if not run:
        return {}
    wall = end_t - run[0]["t"]
    median = median_step_s or 0.0
    seconds = dict.fromkeys(CAUSES, 0.0)
    seconds["startup"] = max(0.0, (first_step_t - run[0]["t"]) if first_step_t is not None else wall)
    recovered_generations = set()
    for e in _one_per_generation(r for r in run if r["event"] == "recovered"):
        recovered_generations.add(e["generation"])
        detection = e.get("release_s") or 0.0
        seconds["detection"] += detection
        seconds["reform"] += max(0.0, (e.get("reform_s") or 0.0) - detection)
        seconds["transfer"] += e.get("transfer_s") or 0.0
        seconds["first_step"] += max(0.0, (e.get("first_step_s") or 0.0) - median)
        seconds["redone"] += (e.get("steps_lost") or 0) * median
    for e in run:
        if e["event"] == "resize" and e.get("generation") not in recovered_generations:
            seconds["resize"] += sum(max(0.0, e.get(k) or 0.0) for k in ("reform_s", "transfer_s"))
            seconds["resize"] += max(0.0, (e.get("first_step_s") or 0.0) - median)
    seconds["productive"] = max(0, steps - 1) * median
    seconds["other"] = wall - sum(v for k, v in seconds.items() if k != "other")
    return seconds


def _one_per_generation(recovered) -> list[dict[str, Any]]:
    """Faults recovered by the same generation overlap in time: keep the earliest (longest) one."""
    by_generation: dict[int, dict[str, Any]] = {}
    for e in recovered:
        kept = by_generation.get(e["generation"])
        if kept is None or e["seconds"] > kept["seconds"]:
            by_generation[e["generation"]] = e
    return list(by_generation.values())
