"""What ranks relay to the supervisor as it happens: Slurm's signals (preemption, a lent node
taken back) and events for the run's events.jsonl, which ranks may not be able to reach.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from resilience.contract import keys
from resilience.contract.messages import RankEvent
from resilience.contract.store_core import Channel, StoreCore


class EventChannel(Channel):
    """Ranks push; the supervisor's :class:`~resilience.contract.rank_events.RankEvents` reads."""

    doorbell: Callable[[str], None] | None = None
    """A rank's ``RankLink.wrote``: rung once an event is written (see ``LivenessChannel``)."""

    def push(self, event: str, **fields: object) -> None:
        """An event from a rank for the supervisor's events.jsonl (ranks may run where the log
        folder is not): an index reserved first keeps the order a reader sees."""
        index = self._core.add(keys.RANK_EVENTS)
        self._core.put(keys.rank_event(index), RankEvent(event, dict(fields), time.time()))
        if self.doorbell is not None:
            self.doorbell("event")


class SignalChannel(Channel):
    """Signals only a rank receives, kept where the supervisor polls."""

    def __init__(self, core: StoreCore, events: EventChannel) -> None:
        super().__init__(core)
        self._events = events

    def mark_preempted(self, by: str) -> None:
        self._core.put_text(keys.PREEMPT, by)

    def preempted_by(self) -> str | None:
        """The slot of the rank that caught the preemption signal; None while none did."""
        return self._core.text(keys.PREEMPT)

    def report_reclaimed(self, slot: str) -> None:
        """A rank on a lent node got Slurm's signal that the node is being taken back (the
        ``reclaim-signal`` event's time is when the rank passed it on, within a heartbeat poll)."""
        self._core.flag(keys.reclaim(slot))
        self._core.add(keys.RECLAIMS)
        self._events.push("reclaim-signal", slot=slot)

    def reclaims(self) -> int:
        """How many reclaim notices ranks wrote: read the slots' keys only when it moves."""
        return self._core.count(keys.RECLAIMS)

    def reclaimed_slots(self, slots: Iterable[str]) -> list[str]:
        return [s for s in slots if self._core.has(keys.reclaim(s))]
