"""A rank's life as the supervisor sees it through the store: warm and waiting, beating, and
what it reported when it left a generation.
"""

from __future__ import annotations

import time
from dataclasses import replace

from resilience.contract import keys
from resilience.contract.messages import Report
from resilience.contract.store_core import Channel


class LivenessChannel(Channel):
    """Ranks write; the supervisor reads (the heartbeat counter tells it a slot is alive)."""

    def mark_ready(self, slot: str, at: float) -> None:
        """Set once by a warm rank waiting for a plan, with the time it was (not when we looked)."""
        self._core.put_float(keys.ready(slot), at)

    def ready_at(self, slot: str) -> float | None:
        return self._core.get_float(keys.ready(slot))

    def beat(self, slot: str) -> None:
        self._core.add(keys.heartbeat(slot))

    def heartbeats(self, slot: str) -> int:
        return self._core.count(keys.heartbeat(slot))

    def report(self, generation: int, slot: str, rep: Report) -> Report:
        """Record a rank's report with its order among this generation's reports (the first
        error is the cause; later ones are its consequences)."""
        seq = self._core.add(keys.report_seq(generation))
        rep = replace(rep, seq=seq, t=time.time())
        self._core.put(keys.report(generation, slot), rep)
        self._core.add(keys.report_ready(generation))
        return rep

    def reports_written(self, generation: int) -> int:
        """How many reports of G exist: read them only when this moves."""
        return self._core.count(keys.report_ready(generation))

    def report_of(self, generation: int, slot: str) -> Report | None:
        return self._core.get(keys.report(generation, slot), Report)
