"""``sres simulate``: the goodput model's Monte-Carlo against its closed forms, and the command."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest

from launcher.observability.simulate import (
    Costs,
    Job,
    daly_interval,
    expected_inprocess,
    expected_restart,
    measured_costs,
    monte_carlo,
)

COSTS = Costs(recovery_s=30.0, lost_s=10.0, steady_overhead=0.02, ckpt_write_s=60.0, restart_s=600.0)


def test_without_failures_goodput_is_one_minus_the_steady_overhead():
    job = Job(gpus=1024, failures_per_node_hour=0.0, work_hours=24)
    inprocess, restart = monte_carlo(job, COSTS, trials=3, rng=random.Random(0))
    assert inprocess.goodputs == pytest.approx((0.98,) * 3) and inprocess.expected == pytest.approx(0.98)
    assert restart.goodputs == pytest.approx((1.0,) * 3) and set(inprocess.failures + restart.failures) == {0}


@pytest.mark.parametrize("gpus", [4096, 16384])
def test_monte_carlo_mean_is_within_one_percent_of_the_closed_form(gpus):
    """A failure rate 10x the default, so that every run sees hundreds of failures."""
    job = Job(gpus=gpus, failures_per_node_hour=1.6e-3, work_hours=10 * 24)
    for result in monte_carlo(job, COSTS, trials=60, rng=random.Random(gpus)):
        assert result.mean == pytest.approx(result.expected, rel=0.01), result.strategy
        assert sum(result.failures) / len(result.failures) > 100


def test_closed_forms():
    job = Job(gpus=16384, work_hours=1)
    rate = job.rate_per_s
    assert expected_inprocess(job, COSTS) == pytest.approx(0.98 * (1 - rate * 10) * math.exp(-rate * 30))
    # Daly's optimum is Young's sqrt(2 delta M) to first order, and beats a nearby interval.
    assert daly_interval(60, 1e6) == pytest.approx(math.sqrt(2 * 60 * 1e6) - 60, rel=0.01)
    best = expected_restart(job, COSTS)
    assert best > expected_restart(job, COSTS, interval_s=daly_interval(60, job.mtbf_s) * 1.5)
    assert best > expected_restart(job, COSTS, interval_s=daly_interval(60, job.mtbf_s) / 1.5)


def test_measured_costs_are_medians_of_recoveries():
    events = [
        {"event": "fault"},
        {"event": "recovered", "seconds": 0.5, "steps_lost": 0, "reform_s": 0.1, "transfer_s": 0.2},
        {"event": "recovered", "seconds": 0.7, "steps_lost": 1, "reform_s": 0.3, "transfer_s": 0.2},
        {"event": "recovered", "seconds": 0.9, "steps_lost": 0, "reform_s": 0.2, "transfer_s": 0.4},
    ]
    m = measured_costs(
        events + [{"event": "finished", "goodput_by_cause": {"productive": 95.0, "checkpoint": 5.0}}]
    )
    assert (m.recoveries, m.recovery_s, m.steps_lost, m.steady_overhead) == (3, 0.7, 0, 0.05)
    assert m.parts == {"reform_s": 0.2, "transfer_s": 0.2}
    with pytest.raises(ValueError, match="no 'recovered' event"):
        measured_costs([{"event": "finished"}])


@pytest.mark.local  # spawns: python -m launcher.cli simulate
def test_the_command_prints_a_table_and_writes_a_plot(tmp_path):
    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps({"event": "recovered", "t": 1.0, "seconds": s, "steps_lost": 0}) + "\n"
            for s in (0.4, 0.6, 0.5)
        )
    )
    plot = tmp_path / "goodput.png"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "simulate",
            str(tmp_path),
            "--gpus",
            "1024,16384",
            "--trials",
            "5",
            "--days",
            "2",
            "--plot",
            str(plot),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "median of 3 recoveries" in done.stdout and done.stdout.count("restart from checkpoint") == 2
    assert plot.read_bytes()[:4] == b"\x89PNG"
    refused = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "simulate", "--gpus", "1000"], capture_output=True, text=True
    )
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "sres: error:" in refused.stderr
