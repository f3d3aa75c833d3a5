"""A rank's step records: what each step waited for, by an injected clock."""

from __future__ import annotations

import pytest

from resilience.agent.step_timer import StepTimer


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
