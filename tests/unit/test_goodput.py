"""The goodput account: wall time split by cause, from a run's events (pure)."""

from __future__ import annotations

import pytest

from launcher.observability.goodput import CAUSES, account


def test_causes_sum_to_the_wall_time_and_each_is_measured():
    events = [
        {"event": "start", "t": 100.0},  # an earlier run of a requeued job is left out:
        {"event": "generation", "t": 101.0, "generation": 1},
        {"event": "fault", "t": 110.0},
        {"event": "fault", "t": 110.5},  # a second fault recovered by the same generation: counted once
        {
            "event": "recovered",
            "t": 112.0,
            "generation": 2,
            "seconds": 2.0,
            "release_s": 0.3,
            "reform_s": 0.8,
            "transfer_s": 0.4,
            "first_step_s": 0.8,
            "steps_lost": 1,
        },
        {
            "event": "recovered",
            "t": 112.0,
            "generation": 2,
            "seconds": 1.5,
            "release_s": 0.1,
            "reform_s": 0.3,
            "transfer_s": 0.4,
            "first_step_s": 0.8,
            "steps_lost": 0,
        },
        {
            "event": "resize",
            "t": 120.0,
            "generation": 3,
            "why": "request",
            "boundary_s": 2.0,
            "reform_s": 0.5,
            "transfer_s": 0.2,
            "first_step_s": 0.6,
        },
        {
            "event": "resize",
            "t": 112.0,
            "generation": 2,
            "why": "fault",
            "reform_s": 0.8,
            "transfer_s": 0.4,
            "first_step_s": 0.8,
        },  # the fault's own resize: already in its recovery
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


def test_a_run_resumed_from_a_checkpoint_counts_only_its_own_steps():
    """A requeued job's second run restored step 8 and ended at step 19: 11 steps are its own (it
    read 20 as the job's steps and gave a goodput of 2), and the first run's step times are not its."""
    earlier = [{"event": "start", "t": 0.0}, {"event": "requeue", "t": 9.0}]
    run = [
        {"event": "start", "t": 10.0},
        {"event": "generation", "generation": 1, "t": 10.5},
        {"event": "restored", "generation": 1, "step": 8, "t": 11.0},
    ]
    records = [
        {"generation": 1, "step": s, "rank": 0, "compute_s": 1.0, "step_s": 1.0, "t": t, "blocked_s": b}
        for s, t, b in [(3, 5.0, 4.0), (9, 13.0, 0.0), (10, 14.0, 0.0)]
    ]
    seconds = account(
        earlier + run, end_t=22.0, steps=20, median_step_s=1.0, first_step_t=12.0, step_records=records
    )
    assert (
        seconds["productive"] == 10.0 and seconds["checkpoint"] == 0.0
    )  # the first run's 4 s are not this one's
    assert sum(seconds.values()) == pytest.approx(12.0)


def test_a_run_that_never_stepped_is_all_startup():
    seconds = account(
        [{"event": "start", "t": 5.0}], end_t=9.0, steps=0, median_step_s=None, first_step_t=None
    )
    assert seconds["startup"] == 4.0 and sum(seconds.values()) == 4.0


def test_stalls_inside_steps_and_waiting_for_a_node_are_their_own_causes():
    """Two ranks, 4 steps: rank 1 computes 0.1 s more on every step (a straggler wait of 0.05 s
    over the median of two), and each commit blocks 0.02 s; a fault waited 5 s for a node."""
    records = [
        {
            "generation": 1,
            "rank": r,
            "step": s,
            "compute_s": 0.1 + 0.1 * r,
            "step_s": 0.5,
            "blocked_s": 0.02,
            "t": 0.0,
        }
        for r in (0, 1)
        for s in range(4)
    ]
    events = [
        {"event": "start", "t": 0.0},
        {"event": "waiting", "t": 10.0},
        {"event": "generation", "t": 15.0, "generation": 2},
        {
            "event": "recovered",
            "t": 16.0,
            "generation": 2,
            "seconds": 6.0,
            "release_s": 0.2,
            "reform_s": 5.5,
            "transfer_s": 0.1,
            "first_step_s": 0.3,
            "steps_lost": 0,
        },
    ]
    seconds = account(events, end_t=20.0, steps=4, median_step_s=None, first_step_t=1.0, step_records=records)
    assert seconds["checkpoint"] == pytest.approx(4 * 0.02) and seconds["straggler"] == pytest.approx(
        4 * 0.05
    )
    assert seconds["productive"] == pytest.approx(3 * (0.5 - 0.02 - 0.05))  # the useful part of a step
    assert seconds["waiting"] == 5.0 and seconds["reform"] == pytest.approx(
        0.3
    )  # 5.5 - 0.2 detection - 5 waiting
    assert sum(seconds.values()) == pytest.approx(20.0)
