"""How long each recovery took, and the run's goodput: read back from the ranks' store keys.

Rank 0 records when a generation formed, when its state arrived and when its first step
completed; the faults that led to that generation then get one ``recovered`` event each. The
loop ticks it (a :class:`~launcher.supervisor.tickers.Ticker`): it looks at the current
generation, which it is told by the callable it was built with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from launcher.observability import goodput
from launcher.observability.events import EventLog
from launcher.supervisor.observe import step_reports
from resilience.contract.messages import RecoveryInfo
from resilience.contract.run_store import RunStore


@dataclass
class PendingFault:
    kind: str
    t: float
    progress: int
    generation: int


@dataclass
class PendingResize:
    from_world: int
    to_world: int
    why: str
    t: float
    generation: int
    jobs: dict[str, str] | None = None
    """The Slurm job each node of the new world runs in (host -> job id; a satellite's own)."""


class RecoveryWatch:
    def __init__(
        self,
        store: RunStore,
        events: EventLog,
        slots: Callable[[], Iterable[str]],
        generation: Callable[[], int],
        say: Callable[[str], None],
    ) -> None:
        self.store, self.events, self.slots, self.generation, self.say = store, events, slots, generation, say
        self.pending: list[PendingFault] = []
        self.resizes: list[PendingResize] = []

    def fault(self, kind: str, t: float, progress: int, generation: int) -> None:
        self.pending.append(PendingFault(kind, t, progress, generation))

    def resized(
        self,
        from_world: int,
        to_world: int,
        why: str,
        t: float,
        generation: int,
        jobs: dict[str, str] | None = None,
    ) -> None:
        self.resizes.append(PendingResize(from_world, to_world, why, t, generation, jobs))

    def tick(self, now: float) -> None:
        self.check(self.generation())

    def check(self, generation: int) -> None:
        """Emit ``recovered`` for the pending faults and ``resize`` for a resize once generation
        G's first step is done."""
        if not self.pending and not self.resizes:
            return
        first_step_t = self.store.progress.first_step_t(generation)
        info = self.store.progress.recovery(generation) if first_step_t is not None else None
        if first_step_t is None or info is None:
            return
        self._emit_resizes(generation, first_step_t, info)
        for fault in self.pending:
            seconds = first_step_t - fault.t
            self.events.emit(
                "recovered",
                generation=generation,
                step=info.step,
                source=info.source,
                bytes=info.bytes,
                seconds=seconds,
                steps_lost=max(0, fault.progress - info.step),
                release_s=self._release_seconds(fault),
                reform_s=info.formed_t - fault.t,
                transfer_s=info.recovered_t - info.formed_t,
                first_step_s=first_step_t - info.recovered_t,
            )
            self.say(
                f"recovered: generation {generation} resumed after step {info.step} from {info.source} "
                f"in {seconds:.2f} s"
            )
        lost = max((f.progress for f in self.pending), default=-1)
        if info.step < 0 <= lost:
            self.say(
                f"warning: no peer and no checkpoint tier held a usable step: generation {generation} starts "
                f"over from the initial state, {lost + 1} step(s) to redo (the result is unchanged; "
                f"--persistent-dir keeps a copy that survives this)"
            )
        self.pending = []

    def _emit_resizes(self, generation: int, first_step_t: float, info: RecoveryInfo) -> None:
        batch = self.store.progress.batch(generation)
        sizes = dict.fromkeys(("accumulation", "global_batch", "lr_scale"))
        if batch is not None:
            sizes = {
                "accumulation": batch.accumulation,
                "global_batch": batch.global_batch,
                "lr_scale": batch.lr_scale,
            }
        left = self._reports_t(generation - 1) if self.resizes else []
        for r in self.resizes:
            seconds = first_step_t - r.t
            # A requested resize waits for every rank to leave at the step boundary (training goes on).
            boundary = max(left) - r.t if left and r.why != "fault" else None
            self.events.emit(
                "resize",
                from_world=r.from_world,
                to_world=r.to_world,
                why=r.why,
                generation=generation,
                step=info.step,
                seconds=seconds,
                boundary_s=boundary,
                reform_s=info.formed_t - r.t - (boundary or 0.0),
                transfer_s=info.recovered_t - info.formed_t,
                first_step_s=first_step_t - info.recovered_t,
                **sizes,
                **({"jobs": r.jobs} if r.jobs else {}),
            )
            kept = "" if batch is None else f", global batch {batch.global_batch} x{batch.lr_scale:g} lr"
            self.say(
                f"resized: world {r.from_world} -> {r.to_world} ({r.why}), "
                f"first step after {seconds:.2f} s{kept}"
            )
        self.resizes.clear()

    def _release_seconds(self, fault: PendingFault) -> float | None:
        return release_seconds(fault.t, self._reports_t(fault.generation))

    def _reports_t(self, generation: int) -> list[float]:
        """When each rank reported leaving ``generation``: all of them at once where every
        numbered report is written (at 4,096 ranks, one read per slot was 8,192 requests)."""
        slots = set(self.slots())
        every = self.store.liveness.reports(generation)
        if every is not None:
            return [r.t for r in every if r.slot in slots]
        reports = (self.store.liveness.report_of(generation, slot) for slot in slots)
        return [r.t for r in reports if r is not None]

    def finished(self, end_t: float) -> dict[str, Any]:
        """Fields of the ``finished`` event: steps done, wall time, goodput (the share of the
        wall time that became steps) and the account of that time by cause."""
        progress, generation = self.store.progress.step(), self.generation()
        # the last generation that trained a step wrote it (one that formed after the last step did not)
        stats = next(filter(None, map(self.store.progress.stats, range(generation, 0, -1))), None)
        steps = progress + 1 if progress is not None else 0
        first_step_t = self.store.progress.first_step_t(1)
        median = stats.median_step_s if stats is not None else None
        records = step_reports.read_file(self.events.path.parent)
        causes = goodput.account(self.events.events, end_t, steps, median, first_step_t, records)
        wall = sum(causes.values())  # from the start event to the end
        share = causes["productive"] / wall if causes and wall > 0 and median is not None else None
        return {
            "steps": steps,
            "goodput": share,
            "wall_s": wall,
            "median_step_s": median,
            "goodput_by_cause": {k: round(v, 4) for k, v in causes.items()},
        }


def release_seconds(fault_t: float, reported_t: list[float]) -> float | None:
    """From the fault to the last survivor leaving the faulted generation (its report); None when
    no survivor reported. Never negative: where every survivor had left before the supervisor
    decided the fault (a rank's own error, which its peers' collectives saw first), nothing was
    waited for (the chaos report once showed -0.080 s)."""
    return max(0.0, max(reported_t) - fault_t) if reported_t else None
