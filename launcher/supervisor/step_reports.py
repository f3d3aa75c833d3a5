"""The ranks' per-step times: read from the store, kept in ``step_times.jsonl``, judged for stragglers.

Each rank publishes its recent steps (:mod:`resilience.agent.step_timer`); the supervisor
reads them about twice a second, appends the steps it has not seen to
``<log dir>/step_times.jsonl`` (one line per rank and step: what the run report's heatmap
draws) and hands them to the :class:`~launcher.observability.straggler.StragglerDetector` of the generation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from launcher.observability.events import read_events
from launcher.observability.straggler import Straggler, StragglerConfig, StragglerDetector
from resilience.contract.run_store import RunStore

FILE = "step_times.jsonl"


def read_file(log_dir: Path) -> list[dict]:
    """The run's step records so far (none before the first steps are reported)."""
    path = Path(log_dir) / FILE
    return read_events(path) if path.exists() else []


class StepReports:
    def __init__(self, store: RunStore, log_dir: Path, config: StragglerConfig) -> None:
        self.store, self.config = store, config
        self.path = Path(log_dir) / FILE
        self._generation = 0
        self._seen: dict[int, int] = {}
        self.detector = StragglerDetector(config)

    def read(self, generation: int, members: Mapping[int, str]) -> list[Straggler]:
        """New steps of every member in ``generation``: written down, then judged."""
        if generation != self._generation:
            self._generation, self._seen, self.detector = generation, {}, StragglerDetector(self.config)
        reports: dict[int, dict[int, float]] = {}
        lines = []
        for rank, slot in members.items():
            recent = self.store.recent_steps(generation, slot)
            new = (
                [r for r in recent.records if r.step > self._seen.get(rank, -1)] if recent is not None else []
            )
            if not new:
                continue
            self._seen[rank] = new[-1].step
            reports[rank] = {r.step: r.compute_s for r in new}
            lines += [
                json.dumps(
                    {
                        "generation": generation,
                        "rank": rank,
                        "slot": slot,
                        "step": r.step,
                        "t": r.t,
                        "compute_s": round(r.compute_s, 6),
                        "step_s": round(r.step_s, 6),
                        "blocked_s": round(r.blocked_s, 6),
                    }
                )
                for r in new
            ]
        if lines:
            with self.path.open("a") as f:
                f.write("\n".join(lines) + "\n")
        return self.detector.observe(set(members), reports) if reports else []

    @property
    def scores(self) -> dict[int, float]:
        return dict(self.detector.scores)
