"""The ranks' reports of a generation as the supervisor reads them: by number, each once, whatever
the number of ranks, and only when a rank says it wrote one.

A rank's report (``done``, an error, a collateral failure) is written to the store with a number
and a counter bumped once it is whole. Read by slot, 4,096 ranks were 4,096 round trips a look;
read one by one by number, a recovery's 4,096 collateral reports took 1.5 s of the supervisor's
loop; the counter read at every tick was a round trip a tick whatever the run does. So the new
ones are read in one ``multi_get``, and the counter only when a rank rang its doorbell over its
liveness connection, at every tick while some live process has no connection (it cannot ring),
and every half beat period in case a ring was lost.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from launcher.supervisor.observe.doorbell import DoorbellLook, Doorbells
from resilience.contract.messages import Report
from resilience.contract.run_store import RunStore


class ReportReader:
    def __init__(self, store: RunStore, look_every_s: float, doorbells: Doorbells | None) -> None:
        self.store = store
        self._look = DoorbellLook(doorbells, "report", look_every_s) if doorbells is not None else None
        self.all_linked = False
        """Every live process had a liveness connection at the last look at heartbeats: each
        rings when it writes a report (set by the Observer)."""
        self._reports: dict[str, Report] = {}
        self._seen = (0, 0)
        """(the counter, the generation) at the last read."""
        self._next = 1
        """The number of the next report of the generation to read (reports are numbered from 1)."""

    def read(self, now: float, generation: int, members: Mapping[int, str]) -> dict[str, Report]:
        """Members' reports of ``generation`` so far."""
        if generation != self._seen[1]:
            self._reports, self._next = {}, 1
        elif not self._due(now):
            return dict(self._reports)
        count = self.store.liveness.reports_written(generation)
        if (count, generation) != self._seen:
            member_slots = set(members.values())
            for report in self._new(generation, count):
                if report.slot in member_slots and report.slot not in self._reports:
                    self._reports[report.slot] = report
            # A number taken but not yet written holds the reading here: its writer bumps the
            # counter (and rings) once it is written, and the next look goes on from it.
            self._seen = (count, generation)
        return dict(self._reports)

    def of_slot(self, slot: str) -> Report | None:
        """The report of a process that ended, read by its slot: a rank reports ``done`` and exits,
        and its report may be numbered after one still being written (the harness at 256 ranks
        saw ranks that had finished taken for a lost node)."""
        report = self.store.liveness.report_of(self._seen[1], slot)
        if report is not None:
            self._reports[slot] = report
        return report

    def _due(self, now: float) -> bool:
        return self._look is None or not self.all_linked or self._look.due(now)

    def _new(self, generation: int, written: int) -> Iterator[Report]:
        """Reports from the next unread number: all at once, else one by one up to the first
        number taken but not yet written."""
        batch = self.store.liveness.reports(generation, self._next, written)
        if batch is not None:
            self._next += len(batch)
            yield from batch
            return
        while (report := self.store.liveness.report_numbered(generation, self._next)) is not None:
            self._next += 1
            yield report
