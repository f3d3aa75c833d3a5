"""The pace of background copies: the budget a round gets, and the pauses that spread it."""

from __future__ import annotations

import pytest

from resilience.state.pacing import MAX_PAUSE_S, MIN_STEPS, Pace, pause_s, round_budget


@pytest.mark.parametrize(
    "times, share, budget",
    [
        ([3.0] * MIN_STEPS, 0.5, 1.5),
        ([3.0] * (MIN_STEPS - 1), 0.5, 0.0),  # warm-up steps: no pace yet
        ([3.0] * 5, 0.0, 0.0),  # --copy-pace 0: at once
        ([9.0, 9.0, 9.0] + [2.0] * 10, 0.5, 1.0),  # the recent steps, not the first
        ([1.0, 2.0, 30.0, 2.0, 1.0], 0.5, 1.0),  # one long step does not pace the next round
    ],
)
def test_a_round_gets_a_share_of_the_median_recent_step(times, share, budget):
    assert round_budget(times, share) == pytest.approx(budget)


@pytest.mark.parametrize(
    "elapsed, done, total, budget, pause",
    [
        (0.0, 25, 100, 1.0, 0.25),  # a quarter out at once: wait until a quarter of the budget
        (0.3, 25, 100, 1.0, 0.0),  # behind schedule: no pause
        (0.1, 50, 100, 0.0, 0.0),  # no budget
        (0.0, 100, 100, 1.0, 0.0),  # nothing left: the round ends now, not at its budget
        (0.0, 90, 100, 10.0, MAX_PAUSE_S),  # never a long sleep between two chunks
    ],
)
def test_a_pause_keeps_the_sends_on_an_even_schedule(elapsed, done, total, budget, pause):
    assert pause_s(elapsed, done, total, budget) == pytest.approx(pause)


def test_a_paced_round_ends_at_its_budget_whatever_its_chunks():
    now = [0.0]
    pace = Pace(0.4, 100, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    for chunk in (10, 30, 20, 40):
        now[0] += 0.01  # each chunk takes 10 ms to send
        pace.sent(chunk)
    # the last chunk left at 0.6 of the budget (60 of 100 bytes before it) plus its 10 ms
    assert now[0] == pytest.approx(0.4 * 0.6 + 0.01)
    assert pace.paused_s == pytest.approx(now[0] - 0.04)
