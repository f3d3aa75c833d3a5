"""A rank's step records: what each step waited for, by an injected clock."""

from __future__ import annotations

import pytest

from resilience.agent.step_timer import StepTimer
from resilience.contract.messages import StepRecord, record_window


def test_the_wait_at_a_step_boundary_for_a_buddy_round_counts_in_the_next_step():
    """The commit waits for the previous snapshot (its own step's blocked time); the end of the
    step waits for that commit's buddy round, before the next step starts: that wait belongs to
    the next step, whose wall time from the last commit holds it."""
    now = [0.0]
    timer = StepTimer(None, "n0p0", 1, clock=lambda: now[0], wall=lambda: now[0])  # type: ignore[arg-type]
    timer.step_started()
    now[0] = 1.0
    timer.blocked(0.1)
    timer.step_committed(0)
    timer.blocked_at_boundary(0.3)
    now[0] = 1.3
    timer.step_started()
    now[0] = 2.3
    timer.step_committed(1)
    assert [r.blocked_s for r in timer.recent] == [0.1, 0.3]
    assert timer.recent[1].step_s == pytest.approx(1.3) and timer.recent[1].compute_s == pytest.approx(1.0)


class _Up:
    def __init__(self) -> None:
        self.sent: list[list[int]] = []

    def steps(self, generation, steps) -> None:
        self.sent.append([r.step for r in steps.records])


def test_a_large_run_reports_its_steps_at_most_once_a_beat_period_and_loses_none():
    """Every 5 steps at least; with ``every_s`` (the rank's beat period at scale) no more often
    than that: at 4,096 ranks of half-second steps, every 5 steps was 1,600 lines a second."""
    now, up = [0.0], _Up()
    timer = StepTimer(None, "n0p0", 1, clock=lambda: now[0], wall=lambda: now[0], link=up, every_s=4.0)  # type: ignore[arg-type]
    for step in range(1, 21):
        timer.step_started()
        now[0] += 0.5
        timer.step_committed(step)
    assert up.sent == [list(range(1, 9)), list(range(9, 17))]
    timer.publish()  # the generation's end sends the rest
    assert [s for batch in up.sent for s in batch] == list(range(1, 21))


class _UpRecords:
    def __init__(self) -> None:
        self.sent: list[StepRecord] = []

    def steps(self, generation, steps) -> None:
        self.sent += steps.records


def test_past_512_ranks_a_record_stands_for_a_window_of_steps_and_none_is_lost():
    """At 4,096 ranks a record per rank and step was 8,192 a second for the supervisor; one per
    window of 8 steps ending at a multiple of 8 (every rank's at the same steps) is 1,024. A
    window goes up once whole; the generation's end sends the part of one that is left."""
    assert [record_window(n) for n in (4, 512, 513, 4096, 16384)] == [1, 1, 2, 8, 32]
    now, up = [0.0], _UpRecords()
    timer = StepTimer(
        None, "n0p0", 1, clock=lambda: now[0], wall=lambda: now[0], link=up, every_s=0.0, window=8
    )  # type: ignore[arg-type]
    for step in range(13, 30):  # resumed after step 12: the first window is 13..16
        timer.step_started()
        now[0] += 0.25
        timer.blocked(0.125)
        timer.step_committed(step)
    assert [(r.step, r.steps) for r in up.sent] == [(16, 4), (24, 8)]
    assert up.sent[1].compute_s == pytest.approx(2.0) and up.sent[1].blocked_s == pytest.approx(1.0)
    assert up.sent[1].t == now[0] - 5 * 0.25  # its last commit's
    timer.publish()
    assert [(r.step, r.steps) for r in up.sent] == [(16, 4), (24, 8), (29, 5)]
    assert sum(r.steps for r in up.sent) == 29 - 12
