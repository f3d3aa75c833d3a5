"""The ranks' per-step times: read from the store and judged for stragglers (the Observer's
part), and kept in ``step_times.jsonl`` (the loop's writer).

Each rank publishes its recent steps (:mod:`resilience.agent.step_timer`); the Observer reads
them about twice a second with :class:`StepReports`, which hands the steps it has not seen to
the :class:`~launcher.observability.straggler.StragglerDetector` of the generation and returns
them in the observation (:attr:`~launcher.supervisor.observe.view.Observation.steps`); the loop then
appends them to ``<log dir>/step_times.jsonl`` with :class:`StepLog` (one line per rank and
step: what the run report's heatmap draws). Reading the world never writes a file.
"""

from __future__ import annotations

import json
import math
from json.encoder import encode_basestring  # the C-accelerated one json uses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from launcher.observability.events import read_jsonl
from launcher.observability.straggler import Straggler, StragglerConfig, StragglerDetector
from launcher.supervisor.observe.view import RankStep
from resilience.contract.messages import RecentSteps
from resilience.contract.run_dir import RunDir
from resilience.contract.run_store import RunStore


def read_file(log_dir: Path) -> list[dict[str, Any]]:
    """The run's step records so far (none before the first steps are reported)."""
    path = RunDir(Path(log_dir)).step_times
    return [record for _, record in read_jsonl(path)] if path.exists() else []


class StepReports:
    """Reads each member's new steps of a generation and judges them; writes nothing."""

    def __init__(
        self,
        store: RunStore,
        config: StragglerConfig,
        linked: Callable[[int, str, int], RecentSteps | None] | None = None,
    ) -> None:
        """``linked``: a rank's steps sent over its liveness connection, after a step (read first:
        no request)."""
        self.store, self.config, self.linked = store, config, linked
        self._generation = 0
        self._members: Mapping[int, str] = {}
        self._seen: dict[int, int] = {}
        self.detector = StragglerDetector(config)

    def read(self, generation: int, members: Mapping[int, str]) -> tuple[list[RankStep], list[Straggler]]:
        """New steps of every member in ``generation``, and the stragglers they complete. A new
        generation first takes the old one's last steps (made since the last look, before the
        fault): without them the goodput account would see a hole before every recovery."""
        steps: list[RankStep] = []
        stragglers: list[Straggler] = []
        if generation != self._generation:
            if self._members:
                steps, stragglers = self._read(self._generation, self._members)
            self._generation, self._seen, self.detector = generation, {}, StragglerDetector(self.config)
        self._members = dict(members)
        more, found = self._read(generation, members)
        return steps + more, stragglers + found

    def _read(self, generation: int, members: Mapping[int, str]) -> tuple[list[RankStep], list[Straggler]]:
        reports: dict[int, dict[int, float]] = {}
        steps: list[RankStep] = []
        for rank, slot in members.items():
            seen = self._seen.get(rank, -1)
            recent = self.linked(generation, slot, seen) if self.linked is not None else None
            if recent is None:
                recent = self.store.progress.recent_steps(generation, slot)
            new = [r for r in recent.records if r.step > seen] if recent is not None else []
            if not new:
                continue
            self._seen[rank] = new[-1].step
            reports[rank] = {r.step: r.compute_s for r in new}
            steps += [RankStep(generation, rank, slot, r) for r in new]
        return steps, (self.detector.observe(set(members), reports) if reports else [])

    @property
    def scores(self) -> dict[int, float]:
        return dict(self.detector.scores)


class StepLog:
    """Appends steps to ``<log dir>/step_times.jsonl``."""

    def __init__(self, log_dir: Path) -> None:
        self.path = RunDir(Path(log_dir)).step_times

    def append(self, steps: Iterable[RankStep]) -> None:
        lines = [_line(s) for s in steps]
        if lines:
            with self.path.open("a") as f:
                f.write("\n".join(lines) + "\n")


_LINE = (
    '{"generation": %d, "rank": %d, "slot": %s, "step": %d, "t": %r, '
    '"compute_s": %r, "step_s": %r, "blocked_s": %r}'
)
"""A step's line, formatted rather than ``json.dumps``-ed: the supervisor writes one per rank
and step (8,000 a second at 4,096 ranks of half-second steps), and this is half the cost."""


def _line(s: RankStep) -> str:
    r = s.record
    numbers = (r.t, round(r.compute_s, 6), round(r.step_s, 6), round(r.blocked_s, 6))
    if type(r.step) is int and all(type(x) is float and math.isfinite(x) for x in numbers):
        return _LINE % (s.generation, s.rank, encode_basestring(s.slot), r.step, *numbers)
    return json.dumps(  # what a rank sent that the format cannot write as JSON (it came signed)
        {
            "generation": s.generation,
            "rank": s.rank,
            "slot": s.slot,
            "step": r.step,
            "t": r.t,
            "compute_s": round(r.compute_s, 6),
            "step_s": round(r.step_s, 6),
            "blocked_s": round(r.blocked_s, 6),
        }
    )
