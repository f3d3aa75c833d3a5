"""The goodput account: wall time split by cause, from a run's events (pure)."""

from __future__ import annotations

import pytest

from launcher.goodput import CAUSES, account


def test_causes_sum_to_the_wall_time_and_each_is_measured():
    events = [
        {"event": "start", "t": 100.0},  # an earlier run of a requeued job is left out:
        {"event": "generation", "t": 101.0, "generation": 1},
        {"event": "fault", "t": 110.0},
        {"event": "fault", "t": 110.5},  # a second fault recovered by the same generation: counted once
        {"event": "recovered", "t": 112.0, "generation": 2, "seconds": 2.0, "release_s": 0.3, "reform_s": 0.8,
         "transfer_s": 0.4, "first_step_s": 0.8, "steps_lost": 1},
        {"event": "recovered", "t": 112.0, "generation": 2, "seconds": 1.5, "release_s": 0.1, "reform_s": 0.3,
         "transfer_s": 0.4, "first_step_s": 0.8, "steps_lost": 0},
        {"event": "resize", "t": 120.0, "generation": 3, "why": "request", "boundary_s": 2.0, "reform_s": 0.5,
         "transfer_s": 0.2, "first_step_s": 0.6},
        {"event": "resize", "t": 112.0, "generation": 2, "why": "fault", "reform_s": 0.8, "transfer_s": 0.4,
         "first_step_s": 0.8},  # the fault's own resize: already in its recovery
    ]
    earlier = [{"event": "start", "t": 0.0}, {"event": "requeue", "t": 50.0}]
    seconds = account(earlier + events, end_t=130.0, steps=41, median_step_s=0.5, first_step_t=103.0)
    assert list(seconds) == list(CAUSES)
    assert sum(seconds.values()) == pytest.approx(30.0)
    assert seconds["startup"] == 3.0 and seconds["productive"] == 20.0
    assert seconds["detection"] == pytest.approx(0.3) and seconds["reform"] == pytest.approx(0.5)
    assert seconds["transfer"] == pytest.approx(0.4) and seconds["first_step"] == pytest.approx(0.3)
    assert seconds["redone"] == 0.5 and seconds["resize"] == pytest.approx(0.8)
    assert seconds["other"] == pytest.approx(30.0 - 3.0 - 20.0 - 0.3 - 0.5 - 0.4 - 0.3 - 0.5 - 0.8)


def test_a_run_that_never_stepped_is_all_startup():
    seconds = account([{"event": "start", "t": 5.0}], end_t=9.0, steps=0, median_step_s=None, first_step_t=None)
    assert seconds["startup"] == 4.0 and sum(seconds.values()) == 4.0
