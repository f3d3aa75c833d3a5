"""The ranks' events copied into ``events.jsonl``, and refused input recorded, each tick.

Ranks may run where the log folder is not, so they push their events (tier saves, restores,
refused checkpoints) through the store and the supervisor writes them down. The store and the
liveness port are open to anyone who reaches them, so a record is input, not a fact: one that
does not decode, is not a rank's event type or lacks its fields is left out with a
``dropped-input`` event (and one warning line per channel), never a crash.
"""

from __future__ import annotations

from collections.abc import Callable

from launcher.observability import event_types
from launcher.observability.events import EventLog
from launcher.supervisor.observe.doorbell import DoorbellLook
from resilience.contract.liveness import LivenessServer
from resilience.contract.messages import RankEvent
from resilience.contract.rank_events import RankEvents
from resilience.contract.run_store import RunStore

MAX_DROPPED_EVENTS = 100
"""``dropped-input`` events written at most per run: a flood of bad input must not fill the disk."""


class RankEventRelay:
    """Copies what ranks said through the store; a :class:`~launcher.supervisor.tickers.Ticker`."""

    def __init__(
        self,
        store: RunStore,
        liveness: LivenessServer,
        events: EventLog,
        say: Callable[[str], None],
        look_every_s: float = 0.0,
    ) -> None:
        """``look_every_s``: the store's counter of events is read when a rank rang (it wrote
        one) and at least this often (writers without a liveness connection: tiers' threads,
        fork servers), not at every tick (a store round trip each, 50 a second)."""
        self.store, self.liveness, self.events, self.say = store, liveness, events, say
        self._look = DoorbellLook(liveness, "event", look_every_s)
        self._rank_events = RankEvents(store)
        self._warned: set[str] = set()
        self._dropped = 0

    def tick(self, now: float) -> None:
        if self._look.due(now):
            self.copy()

    def copy(self, writers_gone: bool = False) -> None:
        """Copy the events written since the last call; with ``writers_gone`` (every rank process
        has ended) an event still being written is given up at once."""
        events = self._rank_events.pop(writers_gone)
        dropped = [("rank-event", why) for why in self._rank_events.dropped]
        self._rank_events.dropped.clear()
        dropped += [("liveness", why) for why in self.liveness.take_dropped()]
        while self.store.forged:
            dropped.append(
                ("store", f"{self.store.forged.popleft()!r} holds a value written without the run's secret")
            )
        for event in events:
            try:
                self._copy_rank_event(event)
            except (KeyError, TypeError, ValueError) as err:
                dropped.append(("rank-event", f"{event.event!r} refused: {type(err).__name__}: {err}"))
        for channel, why in dropped:
            self._dropped += 1
            if self._dropped <= MAX_DROPPED_EVENTS:
                self.events.emit("dropped-input", channel=channel, why=why[:300])
            if channel not in self._warned:  # once per channel: the events have every one
                self._warned.add(channel)
                self.say(
                    f"warning: {channel} input refused: {why[:300]} (every refusal: dropped-input events)"
                )

    def _copy_rank_event(self, event: RankEvent) -> None:
        declared = event_types.BY_NAME.get(event.event)
        if declared is None or declared.source != event_types.RANK:
            raise ValueError("not an event a rank sends")
        line = _console_line(event)
        self.events.emit(event.event, **event.fields, t=event.t)  # TypeError: a field not declared
        if line is not None and line not in self._warned:
            self._warned.add(line)
            self.say(line)


def _console_line(event: RankEvent) -> str | None:
    """The line a rank event is also said with (once): one that weakens the run's promise, or a
    restore from the tiers (a run that resumed a checkpoint said nothing on the console)."""
    record = event.fields
    if event.event == "restored":
        tiers = ", ".join(sorted(set(record["tiers"].values())))
        return (
            f"restored step {record['step']} from the {tiers} tier ({record['bytes'] / 2**20:.1f} MiB in "
            f"{record['seconds']:.2f} s): training goes on from step {record['step'] + 1}"
        )
    if event.event == "inexact":
        return (
            f"warning: rank(s) {', '.join(map(str, record['ranks']))} resumed after step {record['step']} "
            f"without their own random streams and data positions of that step ({record['why']}): "
            f"this run is no longer bitwise what a fault-free run gives"
        )
    if event.event == "changed-after-commit":
        return (
            f"warning: {', '.join(record['names'])} changed after the commit block (step {record['step']}): "
            f"taken again at the next step; a fault landing in between would miss it: move it into "
            f"`with ctx.commit():`"
        )
    return None
