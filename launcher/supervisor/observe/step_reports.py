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

from json.encoder import encode_basestring  # the C-accelerated one json uses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from launcher.observability.events import read_jsonl
from launcher.observability.straggler import Straggler, StragglerConfig, StragglerDetector
from launcher.supervisor.observe.view import RankStep
from resilience.contract.messages import StepRecord, record_window
from resilience.contract.run_dir import RunDir

if TYPE_CHECKING:  # torch: ``sres report`` and ``status`` read files, not a store
    from resilience.contract.run_store import RunStore


def read_file(log_dir: Path) -> list[dict[str, Any]]:
    """The run's step records so far (none before the first steps are reported)."""
    path = RunDir(Path(log_dir)).step_times
    return [record for _, record in read_jsonl(path)] if path.exists() else []


class StepSource(Protocol):
    """The ranks' connections as a source of step records (the liveness server)."""

    def take_steps(self) -> dict[tuple[int, str], list[StepRecord]]: ...

    def unlinked(self, slots: Iterable[str]) -> list[str]: ...


class StepReports:
    """Reads each member's new steps of a generation and judges them; writes nothing."""

    def __init__(self, store: RunStore, config: StragglerConfig, linked: StepSource | None = None) -> None:
        """``linked``: the steps that came over the ranks' connections (taken first: no request);
        a member without one has its steps in the store."""
        self.store, self.config, self.linked = store, config, linked
        self._generation = 0
        self._members: Mapping[int, str] = {}
        self._rank_of: dict[str, int] = {}
        self._seen: dict[int, int] = {}
        self.detector = StragglerDetector(config)

    def read(self, generation: int, members: Mapping[int, str]) -> tuple[list[RankStep], list[Straggler]]:
        """New steps of every member in ``generation``, and the stragglers they complete. A new
        generation first takes the old one's last steps (made since the last look, before the
        fault): without them the goodput account would see a hole before every recovery."""
        fresh = self.linked.take_steps() if self.linked is not None else {}
        steps: list[RankStep] = []
        stragglers: list[Straggler] = []
        if generation != self._generation:
            if self._members:
                steps, stragglers = self._read(self._generation, self._members, fresh)
            self._generation, self._seen = generation, {}
            self.detector = StragglerDetector(self.config, record_window(len(members)))
        if members is not self._members:  # the same plan's members (a read-only view) are not copied
            self._members, self._rank_of = members, {slot: rank for rank, slot in members.items()}
        more, found = self._read(generation, members, fresh)
        return steps + more, stragglers + found

    def _read(
        self, generation: int, members: Mapping[int, str], fresh: Mapping[tuple[int, str], list[StepRecord]]
    ) -> tuple[list[RankStep], list[Straggler]]:
        rank_of = self._rank_of if members is self._members else {s: r for r, s in members.items()}
        got = [
            (rank_of[slot], slot, records)
            for (g, slot), records in fresh.items()
            if g == generation and slot in rank_of
        ]
        unlinked = members.values() if self.linked is None else self.linked.unlinked(members.values())
        for slot in unlinked:
            recent = self.store.progress.recent_steps(generation, slot)
            if recent is not None:
                got.append((rank_of[slot], slot, list(recent.records)))
        reports: dict[int, dict[int, float]] = {}
        steps: list[RankStep] = []
        for rank, slot, records in got:
            seen = self._seen.get(rank, -1)
            new = [r for r in records if r.step > seen]
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
    '"compute_s": %r, "step_s": %r, "blocked_s": %r'
)
"""A step's line, formatted rather than ``json.dumps``-ed: the supervisor writes one per rank
and step (up to 512 a step: :data:`~resilience.contract.messages.RECORDS_PER_STEP`), and this is a
quarter of the cost. Its values were checked when they were decoded (an int step, finite float
times: :meth:`RecentSteps.decode`) and rounded by the rank; ``steps`` only where a record stands
for more than one."""


def _line(s: RankStep) -> str:
    step, compute_s, step_s, t, blocked_s, steps = s.record
    line = _LINE % (s.generation, s.rank, encode_basestring(s.slot), step, t, compute_s, step_s, blocked_s)
    return line + (f', "steps": {steps}}}' if steps != 1 else "}")
