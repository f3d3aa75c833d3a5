"""The goodput account: wall time tiled by cause, from a run's events and step records (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.observability import report
from launcher.observability.goodput import CAUSES, account


def records(generation: int, steps: range, t0: float, step_s: float, **per_rank: Any) -> list[dict[str, Any]]:
    """Two ranks' records of ``steps``, one every ``step_s`` from ``t0`` (the first ends at t0).
    ``per_rank``: overrides by field, a callable (rank, step) -> value."""
    out = []
    for i, step in enumerate(steps):
        for rank in (0, 1):
            r = {
                "generation": generation,
                "rank": rank,
                "step": step,
                "t": t0 + i * step_s,
                "compute_s": 0.1,
                "step_s": step_s,
                "blocked_s": 0.0,
            }
            r.update({k: f(rank, step) for k, f in per_rank.items()})
            out.append(r)
    return out


def test_a_fault_and_a_resize_are_tiled_with_no_overlap_and_no_hole():
    """Generation 1 runs steps 0-5 (1 s each, 0.2 s of each blocked by a commit); a fault at 16.5
    s loses steps 4 and 5 (the commit was step 3); generation 2 ends its first step, 4, at 20.0;
    a resize opens generation 3 after step 7."""
    events = [
        {"event": "start", "t": 0.0},
        {"event": "generation", "t": 1.0, "generation": 1},
        {"event": "fault", "t": 16.5},
        {
            "event": "recovered",
            "t": 20.0,
            "generation": 2,
            "seconds": 3.5,
            "release_s": 0.5,
            "reform_s": 1.5,
            "transfer_s": 0.5,
            "first_step_s": 1.5,
            "steps_lost": 2,
        },
        {
            "event": "resize",
            "t": 26.0,
            "generation": 3,
            "boundary_s": 1.0,
            "reform_s": 1.0,
            "transfer_s": 0.5,
            "first_step_s": 1.5,
        },
    ]
    steps = (
        records(1, range(0, 6), 11.0, 1.0, blocked_s=lambda r, s: 0.2 if s <= 3 else 0.0)
        + records(2, range(4, 8), 20.0, 1.0)
        + records(3, range(8, 10), 26.0, 1.0)
    )
    seconds = account(events, end_t=28.0, steps=10, median_step_s=None, first_step_t=None, step_records=steps)
    assert list(seconds) == list(CAUSES)
    assert sum(seconds.values()) == pytest.approx(28.0)
    assert seconds["startup"] == 11.0  # to the end of step 0
    assert seconds["redone"] == pytest.approx(2.0 + 0.5)  # steps 4, 5 and the step the fault cut
    assert seconds["checkpoint"] == pytest.approx(3 * 0.2)  # steps 1-3
    assert (seconds["detection"], seconds["reform"], seconds["transfer"]) == pytest.approx((0.5, 1.0, 0.5))
    assert seconds["first_step"] == pytest.approx(0.5)  # 1.5 s, of which a median step (1.0 s) is work
    assert seconds["resize"] == pytest.approx(2.0)  # step 7 at 23.0 to step 8 at 26.0, less a step
    # steps 1-3 less their commits; 4 (the recovery's first step), 5-7; 8 (the resize's first), 9
    assert seconds["productive"] == pytest.approx(3 * 0.8 + 1.0 + 3 * 1.0 + 1.0 + 1.0)
    assert seconds["other"] == pytest.approx(1.0) and seconds["straggler"] == 0.0  # the end: 27 to 28


def test_waiting_for_a_node_is_its_own_cause_and_not_reform():
    events = [
        {"event": "start", "t": 0.0},
        {"event": "generation", "t": 1.0, "generation": 1},
        {"event": "waiting", "t": 4.0},
        {"event": "generation", "t": 9.0, "generation": 2},
        {
            "event": "recovered",
            "t": 10.0,
            "generation": 2,
            "seconds": 6.0,
            "release_s": 0.2,
            "reform_s": 5.5,
            "transfer_s": 0.1,
            "first_step_s": 1.2,
            "steps_lost": 0,
        },
    ]
    steps = records(1, range(0, 3), 2.0, 1.0) + records(2, range(3, 5), 10.0, 1.0)
    seconds = account(events, end_t=11.0, steps=5, median_step_s=None, first_step_t=None, step_records=steps)
    assert seconds["waiting"] == pytest.approx(5.0) and seconds["reform"] == pytest.approx(0.3)
    assert seconds["detection"] == pytest.approx(0.2) and seconds["first_step"] == pytest.approx(0.2)
    assert sum(seconds.values()) == pytest.approx(11.0) and min(seconds.values()) >= 0


def test_only_a_flagged_straggler_s_wait_counts_and_never_the_warm_up():
    """Rank 1 is slow on the first step of each generation (warm-up: not a straggler) and, from step
    10 on, on every step: the supervisor flagged it at step 14 (a streak of 5)."""
    compute = lambda r, s: 0.1 + (0.5 if r == 1 and (s == 0 or s >= 10) else 0.0)  # noqa: E731
    events = [
        {"event": "start", "t": 0.0},
        {"event": "generation", "t": 0.5, "generation": 1},
        {"event": "straggler", "t": 15.0, "rank": 1, "step": 14, "steps": 5, "score": 6.0},
    ]
    steps = records(1, range(0, 20), 1.0, 1.0, compute_s=compute)
    seconds = account(events, end_t=20.0, steps=20, median_step_s=None, first_step_t=None, step_records=steps)
    assert seconds["straggler"] == pytest.approx(10 * 0.25)  # its compute over the median of two
    assert sum(seconds.values()) == pytest.approx(20.0)

    unflagged = account(events[:2], 20.0, 20, None, None, steps)
    assert unflagged["straggler"] == 0.0 and unflagged["productive"] == pytest.approx(19.0)


def test_a_run_resumed_from_a_checkpoint_counts_only_its_own_steps():
    """A requeued job's second run: the first run's step records are not its own."""
    events = [
        {"event": "start", "t": 0.0},
        {"event": "requeue", "t": 9.0},
        {"event": "start", "t": 10.0},
        {"event": "generation", "generation": 1, "t": 10.5},
        {"event": "restored", "generation": 1, "step": 8, "t": 11.0},
    ]
    steps = records(1, range(3, 6), 2.0, 1.0, blocked_s=lambda r, s: 0.5) + records(
        1, range(9, 14), 12.0, 1.0
    )
    seconds = account(events, end_t=17.0, steps=14, median_step_s=None, first_step_t=None, step_records=steps)
    assert seconds["startup"] == 2.0 and seconds["productive"] == pytest.approx(4.0)
    assert seconds["checkpoint"] == 0.0 and sum(seconds.values()) == pytest.approx(7.0)


def test_without_step_records_only_start_up_and_steps_at_the_median_are_known():
    run = [{"event": "start", "t": 5.0}]
    never = account(run, end_t=9.0, steps=0, median_step_s=None, first_step_t=None)
    assert never["startup"] == 4.0 and sum(never.values()) == 4.0
    old = account(run, end_t=20.0, steps=11, median_step_s=1.0, first_step_t=7.0)
    assert (old["startup"], old["productive"], old["other"]) == (2.0, 10.0, 3.0)
    slow = account(run, end_t=20.0, steps=100, median_step_s=1.0, first_step_t=7.0)
    assert slow["productive"] == 13.0 and slow["other"] == 0.0  # never more than the time there was


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
    """Generations of steps with random times, gaps, commits and recovery events."""
    events: list[dict[str, Any]] = [{"event": "start", "t": 0.0}]
    recs: list[dict[str, Any]] = []
    t, step = draw(st.floats(0, 5)), 0
    for generation in range(1, draw(st.integers(1, 4)) + 1):
        if generation > 1:
            kind = draw(st.sampled_from(["recovered", "resize"]))
            parts = {
                k: draw(st.floats(0, 3)) for k in ("release_s", "reform_s", "transfer_s", "first_step_s")
            }
            events.append({"event": kind, "generation": generation, "t": t, "seconds": 1.0, **parts})
            t += draw(st.floats(0, 4))
            step = max(0, step - draw(st.integers(0, 3)))
        if draw(st.booleans()):
            events.append({"event": "straggler", "rank": 1, "step": step + 2, "steps": 2, "t": t})
        for _ in range(draw(st.integers(1, 6))):
            t += draw(st.floats(0, 2))
            for rank in (0, 1):
                recs.append(
                    {
                        "generation": generation,
                        "rank": rank,
                        "step": step,
                        "t": t + draw(st.floats(0, 0.1)),
                        "compute_s": draw(st.floats(0, 1)),
                        "step_s": 1.0,
                        "blocked_s": draw(st.floats(0, 1)),
                    }
                )
            step += 1
    return events, recs, t + draw(st.floats(0, 3))


@settings(max_examples=300, deadline=None)
@given(runs())
def test_no_part_is_negative_and_the_parts_sum_to_the_wall_time(run):
    events, recs, end_t = run
    seconds = account(events, end_t, 0, None, None, recs)
    assert min(seconds.values()) >= 0, seconds
    assert sum(seconds.values()) == pytest.approx(end_t, abs=1e-6)


def test_release_seconds_are_never_negative():
    """Every survivor left before the supervisor decided the fault (a rank's own error): the
    recovery waited for nobody, 0 s, not -0.08 s."""
    from launcher.supervisor.observe.recovery_watch import release_seconds

    assert release_seconds(100.0, [99.92, 99.97]) == 0.0
    assert release_seconds(100.0, [99.9, 100.25]) == 0.25
    assert release_seconds(100.0, []) is None


def test_the_step_time_chart_ends_above_steady_steps():
    """A recovery's 5,000 ms step does not set the axis of 60 ms steps; without spikes, no cut."""
    from launcher.observability.report_plots import y_top

    assert y_top([60.0] * 50 + [5000.0]) == 180.0
    assert y_top([60.0, 61.0, 70.0]) is None
    assert y_top([]) is None


def test_a_requeued_run_still_going_is_accounted_from_its_own_start(tmp_path):
    """The log of a job requeued once: the first run's ``requeue`` is no end of the second,
    whose steps are still coming (what ``sres status`` and a benchmark read mid-run)."""

    events = [
        {"event": "start", "t": 0.0},
        {"event": "generation", "t": 1.0, "generation": 1},
        {"event": "requeue", "t": 5.0},
        {"event": "start", "t": 10.0},
        {"event": "generation", "t": 11.0, "generation": 1},
    ]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    steps = records(1, range(0, 8), 12.0, 1.0)
    (tmp_path / "step_times.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    data = report.load(tmp_path)
    assert data.end is None
    seconds = report.causes(data)
    assert seconds["productive"] == pytest.approx(7.0)
    assert sum(seconds.values()) == pytest.approx(19.0 - 10.0)
