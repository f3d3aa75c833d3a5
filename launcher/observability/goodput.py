"""Where a run's wall time went, by cause: the goodput account of the ``finished`` event.

Pure. It reads the events of the run's last start (one process of the supervisor; a requeued
job appends a new start) and the ranks' step records, and tiles the time from ``start`` to the
end: each second is counted once, under one cause, so every part is non-negative and the parts
sum to the wall time exactly. The tiles, in time order:

- the start to the end of the first step: ``startup``;
- each generation's steps after its first: each step's wall time (from the end of the step
  before it, as the slowest rank saw it) split into ``checkpoint`` (commit blocking),
  ``straggler`` (the wait for a rank flagged as a straggler), the useful part up to the median
  (``productive``) and the rest (``other``: a slow step of every rank, noise). A step done again
  in a later generation counts whole as ``redone``;
- the gap from a generation's last step to the end of the next one's first step: what the
  event that opened the next generation measured (``waiting``, ``detection``, ``reform``,
  ``transfer``, the first step beyond a median one, or ``resize``), each at most what is left of
  the gap; the first step's median part is ``productive``; what the events do not explain is the
  step interrupted by the fault (``redone``), or ``resize``/``other``;
- the last step to the end (shutdown, the last flush): ``other``.

The first steps of a generation pay for warm-up on every rank; they are never a straggler's.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from launcher.observability.timeline import Timeline, timeline

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
"""``productive``: steps done once, each at most the median useful step (its wall time less
commit blocking and straggler wait). ``startup``: start to the end of the first step (processes,
imports, process group, the first step's warm-up). ``detection``: a fault to the last survivor
leaving its generation. ``reform``: from there to the new group formed, less ``waiting``.
``transfer``: state from peers or tiers. ``first_step``: the first step after a recovery beyond a
median step. ``redone``: work lost and done again (steps after the last commit, the step a
fault interrupted). ``resize``: requested resizes (re-form, transfer, first step; training goes
on while waiting for the step boundary). ``waiting``: no node to go on with, until one came
(``waiting`` event to the next generation). ``checkpoint``: commits blocked on the previous
commit's snapshot, tier copy or buddy round. ``straggler``: the wait for a rank the supervisor
flagged as a straggler (its ``straggler`` event), from its streak's first step on. ``other``:
the rest (steps slower than the median on every rank, the end of the run)."""


@dataclass(frozen=True)
class Step:
    """One step of one generation as the run saw it: done when its slowest rank was."""

    generation: int
    step: int
    end: float
    blocked: float
    """The longest commit blocking of any rank in this step."""
    slowest: int
    """The rank whose compute took longest."""
    wait: float
    """The slowest rank's compute beyond the median rank's."""


def last_run(events: Sequence[dict[str, Any]]) -> Timeline:
    """The events from the newest ``start`` on."""
    run = timeline(events)
    starts = [i for i, e in enumerate(run) if e.is_("start")]
    return run[starts[-1] :] if starts else Timeline()


def account(
    events: Sequence[dict[str, Any]],
    end_t: float,
    steps: int,
    median_step_s: float | None,
    first_step_t: float | None,
    step_records: Iterable[dict[str, Any]] = (),
) -> dict[str, float]:
    """Seconds by cause (:data:`CAUSES`) from the run's start to ``end_t``; they sum to the wall time.
    ``step_records``: the ranks' per-step times (``step_times.jsonl``). Without them (an old log)
    only ``startup`` and ``steps`` at ``median_step_s`` are known, the rest is ``other``."""
    run = last_run(events)
    if not run:
        return {}
    start = run[0]["t"]
    end_t = max(end_t, start)
    timeline = steps_of(r for r in step_records if start <= r.get("t", end_t) <= end_t)
    if not timeline:
        # a run that resumed from a checkpoint (a requeued job) made only the steps after it
        resumed = next((e["step"] + 1 for e in run.of("restored") if e.get("generation") == 1), 0)
        return _without_steps(start, end_t, steps - resumed, median_step_s, first_step_t)
    tiles = _Tiles(start)
    generations = _by_generation(timeline)
    flagged = _straggler_streaks(run)
    median = _median_useful(generations, flagged)
    redone = _done_again(generations)
    tiles.add("startup", generations[0][0].end)
    for before, steps_of_generation in zip([None, *generations], generations):
        if before is not None:
            _gap(tiles, run, before[-1], steps_of_generation[0], median, redone)
        for step in steps_of_generation[1:]:
            _step(tiles, step, median, redone, flagged)
    tiles.add("other", end_t)
    return tiles.seconds


class _Tiles:
    """Time from ``start`` handed out in order: what a tile claims is only what lies past the
    last one's end, so tiles never overlap and never leave a hole."""

    def __init__(self, start: float) -> None:
        self.at = start
        self.seconds = dict.fromkeys(CAUSES, 0.0)

    def add(self, cause: str, until: float) -> None:
        if until > self.at:
            self.seconds[cause] += until - self.at
            self.at = until

    def split(self, until: float, parts: Sequence[tuple[str, float]], rest: str) -> None:
        """``until - at`` split into ``parts`` in order, each at most what is left; then ``rest``."""
        for cause, seconds in parts:
            self.add(cause, min(until, self.at + max(0.0, seconds)))
        self.add(rest, until)


def steps_of(records: Iterable[dict[str, Any]]) -> list[Step]:
    """The ranks' records of each step merged into one :class:`Step`, in order of their end."""
    by_step: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in records:
        by_step.setdefault((r["generation"], r["step"]), []).append(r)
    merged = []
    for (generation, step), ranks in by_step.items():
        slowest = max(ranks, key=lambda r: r["compute_s"])
        wait = slowest["compute_s"] - statistics.median(r["compute_s"] for r in ranks)
        blocked = max(r.get("blocked_s", 0.0) for r in ranks)
        merged.append(Step(generation, step, max(r["t"] for r in ranks), blocked, slowest["rank"], wait))
    return sorted(merged, key=lambda s: s.end)


def _by_generation(timeline: list[Step]) -> list[list[Step]]:
    """Steps grouped by generation, the generations in the order they ran."""
    groups: dict[int, list[Step]] = {}
    for step in timeline:
        groups.setdefault(step.generation, []).append(step)
    return sorted(groups.values(), key=lambda g: g[0].end)


def _done_again(generations: list[list[Step]]) -> set[tuple[int, int]]:
    """(generation, step) of each step done again by a later generation: its work was lost."""
    seen_later: set[int] = set()
    again = set()
    for steps in reversed(generations):
        again |= {(s.generation, s.step) for s in steps if s.step in seen_later}
        seen_later |= {s.step for s in steps}
    return again


def _straggler_streaks(run: Timeline) -> dict[tuple[int, int], int]:
    """(generation, rank) -> the first step of its straggler streak, from ``straggler`` events."""
    flagged: dict[tuple[int, int], int] = {}
    generation = 1
    for e in run:
        if e.is_("generation"):
            generation = e.get("generation", generation)
        elif e.is_("straggler"):
            first = e["step"] - e.get("steps", 1) + 1
            key = (generation, e["rank"])
            flagged[key] = min(first, flagged.get(key, first))
    return flagged


def _straggler_wait(step: Step, flagged: dict[tuple[int, int], int]) -> float:
    since = flagged.get((step.generation, step.slowest))
    return max(0.0, step.wait) if since is not None and step.step >= since else 0.0


def _median_useful(generations: list[list[Step]], flagged: dict[tuple[int, int], int]) -> float:
    """The median useful part of a step, every generation's first step left out (warm-up)."""
    useful = [
        max(0.0, s.end - prev.end - s.blocked - _straggler_wait(s, flagged))
        for steps in generations
        for prev, s in zip(steps, steps[1:])
    ]
    return statistics.median(useful) if useful else 0.0


def _step(
    tiles: _Tiles,
    step: Step,
    median: float,
    redone: set[tuple[int, int]],
    flagged: dict[tuple[int, int], int],
) -> None:
    if (step.generation, step.step) in redone:
        tiles.add("redone", step.end)
        return
    parts = [("checkpoint", step.blocked), ("straggler", _straggler_wait(step, flagged))]
    tiles.split(step.end, [*parts, ("productive", median)], "other")


def _gap(
    tiles: _Tiles,
    run: Timeline,
    last: Step,
    first: Step,
    median: float,
    redone: set[tuple[int, int]],
) -> None:
    """From ``last`` (a generation's last step) to the end of ``first`` (the next one's first)."""
    opened = Timeline(e for e in run if last.generation < (e.get("generation") or 0) <= first.generation)
    recovered = opened.of("recovered")
    useful = 0.0 if (first.generation, first.step) in redone else median
    if recovered:
        e = max(recovered, key=lambda r: r.get("seconds") or 0.0)
        detection = e.get("release_s") or 0.0
        waited = _waited(run, last.end, first.end)
        first_step = e.get("first_step_s") or 0.0
        parts = [
            ("detection", detection),
            ("waiting", waited),
            ("reform", (e.get("reform_s") or 0.0) - detection - waited),
            ("transfer", e.get("transfer_s") or 0.0),
            ("first_step", first_step - min(useful, first_step)),
            ("productive", useful),
        ]
        # The events measure from the fault: before it, the interrupted step's work was lost.
        tiles.add("redone", first.end - sum(max(0.0, s) for _, s in parts))
        tiles.split(first.end, parts, "other")
        return
    # A resize (or a pause no event explains): its first step's median part was work.
    cause = "resize" if opened.count("resize") else "other"
    waited = _waited(run, last.end, first.end)
    tiles.split(
        first.end, [("waiting", waited), (cause, first.end - tiles.at - waited - useful)], "productive"
    )


def _waited(run: Timeline, after: float, until: float) -> float:
    """Seconds from a ``waiting`` event in (after, until) to the next generation after it."""
    total = 0.0
    for i, e in enumerate(run):
        if e.is_("waiting") and after <= e.t <= until:
            formed = next((g.t for g in run[i:].of("generation")), until)
            total += max(0.0, min(formed, until) - e.t)
    return total


def _without_steps(
    start: float, end_t: float, steps: int, median_step_s: float | None, first_step_t: float | None
) -> dict[str, float]:
    tiles = _Tiles(start)
    tiles.add("startup", first_step_t if first_step_t is not None else end_t)
    productive = max(0, steps - 1) * (median_step_s or 0.0)
    tiles.split(end_t, [("productive", productive)], "other")
    return tiles.seconds
