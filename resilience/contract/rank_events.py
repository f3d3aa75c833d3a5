"""The supervisor's reader of the events ranks push through the store, in order.

Ranks may run where the log folder is not, so each event goes to the store
(:meth:`~resilience.contract.channels.signals.EventChannel.push`) and the supervisor copies it into
events.jsonl. Anyone who reaches the store's port can write there too: a record that does not
decode, or lacks the run's MAC, is skipped with its reason, never a crash.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from resilience.contract import keys
from resilience.contract.messages import RankEvent
from resilience.contract.run_store import RunStore

HOLE_SKIP_S = 2.0
"""How long a reserved but unwritten event may hold up the ones after it."""
MAX_GAP = 4096
"""Holes in a row past which the counter is taken as moved by someone else: the run's writers
reserve one index each at a time, so a longer run of empty indices is no writer's. The counter
is an unsigned ``add`` anyone who reaches the store can make; ``add(rank-events, 1e12)`` once
left ``sres run`` checking a trillion keys after training had finished."""


class RankEvents:
    """The supervisor's reader of rank events, in order.

    A writer reserves an index, then writes its record. One killed in between (a rank of a
    node that dies while it reports a checkpoint) leaves a hole that no one will fill; waiting
    for it would hold back every later event of the run. A live writer fills its hole within
    microseconds, so a hole still empty after ``HOLE_SKIP_S`` is skipped.
    """

    def __init__(self, store: RunStore, clock: Callable[[], float] = time.monotonic) -> None:
        self._core, self.clock = store.core, clock
        self.seen = 0
        self._hole_since: float | None = None
        self._gap = 0  # holes skipped in a row
        self.dropped: list[str] = []
        """Why each record that did not decode was skipped (the caller empties it)."""

    def pop(self, writers_gone: bool = False) -> list[RankEvent]:
        """The events written since the last call; with ``writers_gone`` (every rank process
        has ended) holes are skipped at once."""
        out = []
        count = self._core.count(keys.RANK_EVENTS)
        while self.seen < count:
            key = keys.rank_event(self.seen + 1)
            if not self._core.exists(key):
                now = self.clock()
                self._hole_since = now if self._hole_since is None else self._hole_since
                if now - self._hole_since < HOLE_SKIP_S and not writers_gone:
                    break  # still being written, probably (holes in a row share one wait)
                self._gap += 1
                if self._gap > MAX_GAP and count - MAX_GAP > self.seen + 1:
                    self.dropped.append(
                        f"records {self.seen + 1}..{count - MAX_GAP} were never written: the counter "
                        "was moved past them (not by the run's ranks)"
                    )
                    self.seen, self._gap = count - MAX_GAP, 0  # the newest indices may hold records
                    continue
                self.seen += 1
                continue
            self._gap, self._hole_since = 0, None
            try:
                out.append(self._core.strict(key, RankEvent))
            except (ValueError, TypeError, KeyError, AttributeError) as err:  # anyone may write the store
                why = f"{type(err).__name__}: {err}"
                self.dropped.append(f"record {self.seen + 1} does not decode: {why}")
            self.seen += 1
        return out
