"""Rank events reach events.jsonl in order, and a writer killed half-way holds nothing back."""

from __future__ import annotations

import torch.distributed as dist

from resilience.contract import keys
from resilience.contract.rank_events import HOLE_SKIP_S, RankEvents
from resilience.contract.run_store import RunStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hole_left_by_a_killed_writer_is_skipped_after_a_while_and_later_events_still_come():
    store, clock = RunStore(dist.HashStore()), Clock()
    reader = RankEvents(store, clock)
    store.events.push("checkpoint-saved", step=1)
    store.raw.add(keys.RANK_EVENTS, 1)  # a rank reserved an index and was SIGKILLed before writing
    store.events.push("restored", step=1)
    assert [e.event for e in reader.pop()] == ["checkpoint-saved"]
    clock.now += HOLE_SKIP_S / 2
    assert reader.pop() == []  # perhaps still being written
    clock.now += HOLE_SKIP_S
    assert [e.event for e in reader.pop()] == ["restored"]
    store.events.push("checkpoint-saved", step=2)
    assert [e.fields["step"] for e in reader.pop()] == [2]
    store.raw.add(keys.RANK_EVENTS, 1)  # another killed writer, then the run ends
    store.events.push("checkpoint-saved", step=3)
    assert [e.fields["step"] for e in reader.pop(writers_gone=True)] == [3]  # nothing is left to wait for


def test_a_hole_that_gets_filled_in_time_keeps_the_order():
    store, clock = RunStore(dist.HashStore()), Clock()
    reader = RankEvents(store, clock)
    index = store.raw.add(keys.RANK_EVENTS, 1)
    store.events.push("second")
    assert reader.pop() == []
    store.raw.set(keys.rank_event(index), '{"event": "first"}')
    assert [e.event for e in reader.pop()] == ["first", "second"]


def test_a_record_that_does_not_decode_is_skipped_with_its_reason_and_the_next_still_comes():
    """Anyone who reaches the store's port may write a record: input, never a crash."""
    store, clock = RunStore(dist.HashStore()), Clock()
    reader = RankEvents(store, clock)
    for raw in (b"\xff\xfe", b"[1, 2]", b'{"event": 7}', b'{"t": 1.0}', b'{"event": "x", "t": "soon"}'):
        store.raw.set(keys.rank_event(store.raw.add(keys.RANK_EVENTS, 1)), raw)
    store.events.push("checkpoint-saved", step=4)
    assert [e.fields["step"] for e in reader.pop()] == [4]
    assert len(reader.dropped) == 5 and all("does not decode" in why for why in reader.dropped)


def test_a_counter_moved_far_past_the_records_is_passed_over_at_once_and_later_events_come():
    """Another user's ``add(rank-events, 10**12)`` once left the reader checking a trillion
    empty indices after training had finished. Past a gap no writer makes, it jumps."""
    store, clock = RunStore(dist.HashStore()), Clock()
    reader = RankEvents(store, clock)
    store.events.push("checkpoint-saved", step=1)
    store.raw.add(keys.RANK_EVENTS, 10**12)
    store.events.push("checkpoint-saved", step=2)  # a rank's next event, after the bump
    assert [e.fields["step"] for e in reader.pop(writers_gone=True)] == [1, 2]
    assert len(reader.dropped) == 1 and "never written" in reader.dropped[0]
    store.events.push("checkpoint-saved", step=3)
    assert [e.fields["step"] for e in reader.pop()] == [3]
