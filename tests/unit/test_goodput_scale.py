"""The control path's curve: its least-squares line, how a scale is known (measured, interpolated,
extrapolated), one line for a malformed file, and what it adds to a larger job's recoveries (pure)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from launcher.errors import ConfigError
from launcher.observability.goodput_model import Draws, FaultMix, SimulatedJob, expected, run_trial
from launcher.observability.goodput_scale import (
    DEFAULT_CURVE,
    ControlCurve,
    CurvePoint,
    LineFit,
    load_curve,
    parse_curve,
)
from launcher.observability.goodput_strategies import Ladder


def point(ranks: int, released_s: float, **changes: object) -> dict[str, object]:
    fields = {"ranks": ranks, "nodes": max(1, ranks // 8), "detect_s": 0.05, "released_s": released_s}
    return {**fields, "barrier_s": 0.02, **changes}


def curve(*points: dict[str, object]) -> dict[str, object]:
    return {"machine": "test", "command": "control_plane.py", "measured": "2026-11-28", "points": [*points]}


def test_the_line_is_the_least_squares_fit_of_released_over_ranks():
    on_a_line = parse_curve(curve(point(1000, 1.5), point(2000, 2.5), point(3000, 3.5))).fit()
    assert on_a_line.intercept_s == pytest.approx(0.5) and on_a_line.growth_per_1000_s == pytest.approx(1.0)
    # x = 1, 2, 3 and y = 1, 2, 2: slope Sxy / Sxx = 1 / 2, through the means (2, 5/3)
    scattered = parse_curve(curve(point(1, 1.0), point(2, 2.0), point(3, 2.0))).fit()
    assert (scattered.per_rank_s, scattered.intercept_s) == (pytest.approx(0.5), pytest.approx(2 / 3))
    assert scattered.at(5) == pytest.approx(2 / 3 + 2.5)


def test_a_scale_is_measured_interpolated_or_extrapolated():
    measured = parse_curve(curve(point(64, 0.3), point(256, 0.35), point(1024, 0.6)))
    labels = {n: measured.at(n).how for n in (8, 64, 100, 256, 1024, 4096)}
    assert labels == {
        8: "extrapolated",
        64: "measured",
        100: "interpolated",
        256: "measured",
        1024: "measured",
        4096: "extrapolated",
    }
    at = measured.at(4096)
    assert (at.low_ranks, at.high_ranks) == (64, 1024)
    assert at.seconds == pytest.approx(measured.fit().at(4096))
    assert at.growth_per_1000_s == pytest.approx(measured.fit().growth_per_1000_s)


def test_the_packaged_curve_loads():
    shipped = load_curve(DEFAULT_CURVE)
    assert shipped.command.startswith("python benchmarks/control_plane.py") and len(shipped.points) >= 2


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "Expecting property name"),
        (json.dumps([1, 2]), "the curve: a JSON object, not list"),
        (json.dumps({"machine": "m", "command": "c", "measured": "d"}), "the curve: no points"),
        (json.dumps(curve(point(64, 0.3), {"ranks": 256, "nodes": 32})), "point 1: no detect_s, released_s"),
        (json.dumps(curve(point(0, 0.3), point(64, 0.4))), "ranks 0: a whole number, at least 1"),
        (json.dumps(curve(point(-8, 0.3), point(64, 0.4))), "ranks -8: a whole number"),
        (json.dumps(curve(point(64, 0.3), point(64.5, 0.4))), "ranks 64.5: a whole number"),
        (json.dumps(curve(point(64, 0.3), point(256, -0.1))), "released_s -0.1: seconds, not negative"),
        (json.dumps(curve(point(64, 0.3), point(256, "0.4"))), "point 1: released_s '0.4' is not a number"),
        (json.dumps(curve(point(256, 0.3), point(64, 0.4))), "64 ranks after 256: points sorted by ranks"),
        (json.dumps(curve(point(64, 0.3), point(64, 0.4))), "two points at 64 ranks"),
        (json.dumps(curve(point(64, 0.3))), "1 point\\(s\\): a line needs at least two scales"),
    ],
)
def test_a_malformed_curve_is_one_config_error_line(tmp_path, content, says):
    path = tmp_path / "curve.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=says) as refused:
        load_curve(path)
    assert str(refused.value).startswith(f"control-path curve {path}: ") and "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="No such file"):
        load_curve(tmp_path / "absent.json")


GROWING = LineFit(intercept_s=0.2, per_rank_s=0.001)
MIX = FaultMix(process=0.5, hang=0.1, node=0.4, correlated=0.0)
SPARE_FREE = Draws(gap=0.5, planned=0.99, kind=0.1, spare=0.0, wait=0.5, host=0.99, domain=0.99, lost=0.5)


SCALES = (1024, 16384)


def test_a_larger_job_pays_more_control_path_when_the_curve_grows():
    ladder = Ladder(inprocess_s=0.3, spare_s=0.6, spares=4, control_path=GROWING)
    small, large = (SimulatedJob(gpus=n) for n in SCALES)
    for kind, measured in (("process", 0.3), ("hang", 0.3), ("node", 0.6)):
        costs = [ladder.cost(kind, SPARE_FREE, job, MIX) for job in (small, large)]
        assert costs[0].rung in ("in-process", "spare") and costs[1].rung == costs[0].rung
        # what the path costs beyond the 4 ranks the costs were measured at: 0.001 s a rank
        assert [c.recovery for c in costs] == [pytest.approx(measured + 0.001 * (n - 4)) for n in SCALES]
    flat = dataclasses.replace(ladder, control_path=None)
    assert flat.cost("process", SPARE_FREE, large, MIX).recovery == 0.3
    assert expected(ladder, large, MIX) < expected(flat, large, MIX)
    falling = dataclasses.replace(ladder, control_path=LineFit(1.0, -1e-5))
    assert falling.cost("process", SPARE_FREE, large, MIX).recovery == 0.3  # never below what was measured
    at_scale = dataclasses.replace(ladder, measured_ranks=16384)  # measured there: nothing added
    assert at_scale.cost("node", SPARE_FREE, large, MIX).recovery == pytest.approx(0.6)


def test_a_simulated_in_process_recovery_costs_what_the_curve_adds():
    ladder = Ladder(inprocess_s=0.3, control_path=GROWING)
    job = SimulatedJob(gpus=4096, failures_per_node_hour=1e-3, work_hours=48.0)
    only_process = FaultMix(process=1.0, hang=0.0, node=0.0, correlated=0.0)
    seconds = {}
    for name, strategy in (("flat", dataclasses.replace(ladder, control_path=None)), ("curve", ladder)):
        trial = run_trial(strategy, job, only_process, random.Random(7))
        seconds[name] = trial.lost["in-process", "recovery"] / trial.failures["process"]
    assert seconds["flat"] == pytest.approx(0.3, rel=0.05)  # a failure during a recovery cuts one short
    assert seconds["curve"] == pytest.approx(0.3 + 0.001 * (4096 - 4), rel=0.05)


def test_a_point_refuses_what_no_measurement_gives():
    with pytest.raises(ValueError, match="nodes True"):
        CurvePoint(ranks=64, nodes=True, detect_s=0.1, released_s=0.2, barrier_s=0.0)
    with pytest.raises(ValueError, match="detect_s nan"):
        CurvePoint(ranks=64, nodes=8, detect_s=float("nan"), released_s=0.2, barrier_s=0.0)
    with pytest.raises(ValueError, match="at least two"):
        ControlCurve("m", "c", "d", ())
    with pytest.raises(ValueError, match="measured at 0 ranks"):
        Ladder(measured_ranks=0)
