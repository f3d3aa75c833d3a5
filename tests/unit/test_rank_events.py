"""Rank events reach events.jsonl in order, and a writer killed half-way holds nothing back."""

from __future__ import annotations

import torch.distributed as dist

from resilience.contract import membership


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_hole_left_by_a_killed_writer_is_skipped_after_a_while_and_later_events_still_come():
    store, clock = dist.HashStore(), Clock()
    reader = membership.RankEvents(store, clock)
    membership.push_event(store, "checkpoint-saved", step=1)
    store.add(membership.RANK_EVENTS, 1)  # a rank reserved an index and was SIGKILLed before writing
    membership.push_event(store, "restored", step=1)
    assert [e["event"] for e in reader.pop()] == ["checkpoint-saved"]
    clock.now += membership.HOLE_SKIP_S / 2
    assert reader.pop() == []  # perhaps still being written
    clock.now += membership.HOLE_SKIP_S
    assert [e["event"] for e in reader.pop()] == ["restored"]
    membership.push_event(store, "checkpoint-saved", step=2)
    assert [e["step"] for e in reader.pop()] == [2]
    store.add(membership.RANK_EVENTS, 1)  # another killed writer, then the run ends
    membership.push_event(store, "checkpoint-saved", step=3)
    assert [e["step"] for e in reader.pop(writers_gone=True)] == [3]  # nothing is left to wait for


def test_a_hole_that_gets_filled_in_time_keeps_the_order():
    store, clock = dist.HashStore(), Clock()
    reader = membership.RankEvents(store, clock)
    index = store.add(membership.RANK_EVENTS, 1)
    membership.push_event(store, "second")
    assert reader.pop() == []
    store.set(membership.rank_event_key(index), '{"event": "first"}')
    assert [e["event"] for e in reader.pop()] == ["first", "second"]
