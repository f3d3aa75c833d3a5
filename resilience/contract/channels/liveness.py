"""A rank's life as the supervisor sees it through the store: warm and waiting, beating, and
what it reported when it left a generation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from resilience.contract import keys
from resilience.contract.messages import Report
from resilience.contract.store_core import Channel


class LivenessChannel(Channel):
    """Ranks write; the supervisor reads (the heartbeat counter tells it a slot is alive)."""

    doorbell: Callable[[str], None] | None = None
    """A rank's ``RankLink.wrote``: rung once a report is written, so the supervisor need not
    read the reports' counter every tick to see it at once."""

    def mark_ready(self, slot: str, at: float) -> None:
        """Set once by a warm rank waiting for a plan, with the time it was (not when we looked)."""
        self._core.put_float(keys.ready(slot), at)

    def ready_at(self, slot: str) -> float | None:
        return self._core.get_float(keys.ready(slot))

    def beat(self, slot: str) -> None:
        """A signed value that only grows, not a counter: anyone who reaches the store can
        ``add`` to a counter, and bumping one hid a real hang for 150 s. A forged value reads as
        absent, and one replayed from earlier is not larger. The monotonic clock, not the wall
        clock: only one process ever writes a slot's key, and a wall clock stepped back (NTP)
        would make every beat of the node older than its last for as long as the step."""
        self._core.put_int(keys.heartbeat(slot), time.monotonic_ns())

    def heartbeats(self, slot: str) -> int:
        """The slot's newest beat (0 before its first); a larger value than before means alive."""
        return self._core.get_int(keys.heartbeat(slot)) or 0

    def report(self, generation: int, slot: str, rep: Report) -> Report:
        """Record a rank's report with its order among this generation's reports (the first
        error is the cause; later ones are its consequences)."""
        seq = self._core.add(keys.report_seq(generation))
        rep = replace(rep, seq=seq, t=time.time(), slot=slot)
        self._core.put_all({keys.report(generation, slot): rep, keys.report_at(generation, seq): rep})
        self._core.add(keys.report_ready(generation))
        if self.doorbell is not None:
            self.doorbell("report")
        return rep

    def report_numbered(self, generation: int, seq: int) -> Report | None:
        """Report number ``seq`` of G (from 1), None while it is not written."""
        return self._core.get(keys.report_at(generation, seq), Report)

    def reports_written(self, generation: int) -> int:
        """How many reports of G exist: read them only when this moves."""
        return self._core.count(keys.report_ready(generation))

    def reports(self, generation: int, first: int = 1, written: int | None = None) -> list[Report] | None:
        """Reports ``first``.. of G written so far (``written``: their count, when the caller
        read it), in their order, in two round trips; None while one whose number was taken is
        still being written (read them one by one, or by slot, then)."""
        last = self.reports_written(generation) if written is None else written
        names = (keys.report_at(generation, seq) for seq in range(first, last + 1))
        return self._core.get_all(names, Report)

    def report_of(self, generation: int, slot: str) -> Report | None:
        return self._core.get(keys.report(generation, slot), Report)
