"""When the supervisor reads a store counter that ranks ring for (their reports, their events):
when a rank rang over its liveness connection, else every so often, in case a ring was lost or
its writer has no connection. Read at every tick, each counter was a store round trip a tick."""

from __future__ import annotations

from typing import Protocol


class Doorbells(Protocol):
    def rung(self, what: str) -> int:
        """How many times ranks said they wrote ``what`` (``report``, ``event``) to the store."""


class DoorbellLook:
    def __init__(self, doorbells: Doorbells, what: str, every_s: float) -> None:
        self.doorbells, self.what, self.every_s = doorbells, what, every_s
        self._rung = -1
        self._next = 0.0

    def due(self, now: float) -> bool:
        """Whether to read the counter now (a ring since the last look, or ``every_s`` passed)."""
        rung = self.doorbells.rung(self.what)
        if rung == self._rung and now < self._next:
            return False
        self._rung, self._next = rung, now + self.every_s
        return True
