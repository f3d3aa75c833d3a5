"""The goodput model: each rung's cost, the run's account, calibration on published runs, and
goodput that never rises when a cost rises (pure, fixed seeds)."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launcher.observability.goodput_model import Draws, FaultMix, SimulatedJob, expected, run_trial, simulate
from launcher.observability.goodput_presets import PRESETS, preset_work_hours
from launcher.observability.goodput_strategies import Ladder, Restart, daly_interval

JOB = SimulatedJob(gpus=2048, failures_per_node_hour=2e-3, planned_per_day=1.0, work_hours=24.0, step_s=4.0)
MIX = FaultMix(process=0.2, hang=0.1, node=0.6, correlated=0.1, correlated_nodes=4)
LADDER = Ladder(inprocess_s=0.3, spare_s=0.6, detect_s=1.0, hang_timeout_s=30.0, spares=2, node_wait_s=100.0)


def draws(**uniforms: float) -> Draws:
    base = dict.fromkeys((f.name for f in dataclasses.fields(Draws)), 0.5)
    return Draws(**{**base, **uniforms})


def test_each_rung_costs_what_it_says():
    spare_free = draws(spare=0.0, host=0.99, domain=0.99, lost=0.5)
    no_spare = draws(spare=0.999999, host=0.99, domain=0.99, wait=1 - math.exp(-1), lost=0.5)  # a 100 s wait
    process = LADDER.cost("process", spare_free, JOB, MIX)
    assert (process.rung, process.detection, process.recovery, process.lost_work) == (
        "in-process",
        1.0,
        0.3,
        2.0,
    )
    assert LADDER.cost("hang", spare_free, JOB, MIX).detection == 30.0
    spare = LADDER.cost("node", spare_free, JOB, MIX)
    assert (spare.rung, spare.recovery, spare.lost_work) == ("spare", 0.6, 2.0)
    shrink = LADDER.cost("node", no_spare, JOB, MIX)
    assert shrink.rung == "shrink"
    assert shrink.recovery == pytest.approx(0.68 + 0.47 + (100.0 + 3.0) / JOB.nodes)
    waits = dataclasses.replace(LADDER, elastic=False).cost("node", no_spare, JOB, MIX)
    assert (waits.rung, waits.recovery) == ("new node", pytest.approx(100.0 + 3.0 + 0.6))
    both_holders = LADDER.cost("correlated", draws(spare=0.0, host=0.99, domain=0.0, lost=0.5), JOB, MIX)
    # 4 nodes, a pool of 2: the world shrinks by 4 until the scheduler's nodes come (a median wait)
    shrunk = 0.68 + 0.47 + (100 * math.log(2) + 3.0) * 4 / JOB.nodes
    assert both_holders.rung == "persistent" and both_holders.lost_work == 900.0
    assert both_holders.recovery == pytest.approx(60 + shrunk)
    host = LADDER.cost("node", draws(host=0.0, lost=0.5), JOB, MIX)
    assert (host.rung, host.recovery, host.lost_work) == ("requeue", 960.0, 900.0)
    planned = LADDER.cost("planned", spare_free, JOB, MIX)
    assert (planned.rung, planned.detection, planned.lost_work) == ("spare", 0.0, 0.0)
    restart = Restart(restart_s=400, detect_s=60, hang_timeout_s=600, ckpt_write_s=10, interval_s=1000)
    assert restart.cost("hang", spare_free, JOB, MIX).detection == 600
    assert restart.cost("node", spare_free, JOB, MIX).lost_work == 500
    assert restart.cost("planned", spare_free, JOB, MIX).lost_work == 0
    assert restart.speed(JOB) == pytest.approx(1000 / 1010)


def test_a_spare_is_free_less_often_when_refills_are_slow_or_the_pool_small():
    fast, slow = LADDER, dataclasses.replace(LADDER, refill_s=100 * LADDER.refill_s)
    assert 1 >= fast.spare_free(1, JOB, MIX) > slow.spare_free(1, JOB, MIX) > 0
    assert fast.spare_free(3, JOB, MIX) == 0  # more nodes at once than the pool holds
    assert Ladder().pool(SimulatedJob(gpus=8 * 1024)) == 4  # default: one per 256 nodes


def test_a_trial_accounts_for_every_second_of_its_wall_time():
    for strategy in (LADDER, Restart()):
        trial = run_trial(strategy, JOB, MIX, random.Random(3))
        assert sum(trial.failures.values()) > 10
        assert trial.work_s + sum(trial.lost.values()) + trial.steady_s == pytest.approx(trial.wall_s)


def test_the_monte_carlo_mean_of_long_runs_is_the_closed_form():
    job = dataclasses.replace(JOB, work_hours=20 * 24)
    for strategy in (LADDER, Restart()):
        result = simulate(strategy, job, MIX, trials=40, rng=random.Random(7))
        assert result.mean == pytest.approx(result.expected, rel=0.005), strategy.name
        assert result.failures() > 100


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_reproduces_its_published_goodput_and_failure_count(name):
    """The restart-based run as published lands in the preset's tolerance, and the failures the
    model draws in its days match the published count within sampling error."""
    preset = PRESETS[name]
    goodput = expected(preset.baseline, preset.job, preset.mix)
    job = dataclasses.replace(preset.job, work_hours=preset_work_hours(preset, goodput))
    result = simulate(preset.baseline, job, preset.mix, trials=100, rng=random.Random(0))
    low, high = preset.tolerance
    assert low <= result.mean <= high and low <= goodput <= high
    published = preset.job.unexpected_per_s * preset.days * 86400
    unexpected = result.failures(("process", "hang", "node", "correlated"))
    assert abs(unexpected - published) <= 4 * math.sqrt(published / 100), (unexpected, published)
    assert len(preset.sources) >= 5


def test_llama3_counts_are_the_papers():
    preset = PRESETS["llama3"]
    assert preset.job.unexpected_per_s * 54 * 86400 == pytest.approx(419)
    assert preset.job.planned_per_s * 54 * 86400 == pytest.approx(47)
    assert preset.mix.process * 419 == pytest.approx(56) and preset.mix.correlated * 419 == pytest.approx(35)


COSTS = [f.name for f in dataclasses.fields(Ladder) if f.name.endswith("_s")] + [
    "lost_steps",
    "steady_overhead",
]


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(COSTS), st.floats(1.01, 20.0), st.integers(0, 2**32))
def test_goodput_never_rises_when_a_cost_of_ours_rises(name, factor, seed):
    value = getattr(LADDER, name) or 0.1
    raised = min(value * factor, 0.9) if name == "steady_overhead" else value * factor
    before = dataclasses.replace(LADDER, **{name: value})
    after = dataclasses.replace(LADDER, **{name: raised})
    job = dataclasses.replace(JOB, work_hours=6.0)
    assert expected(after, job, MIX) <= expected(before, job, MIX) + 1e-12
    one, two = (
        run_trial(before, job, MIX, random.Random(seed)),
        run_trial(after, job, MIX, random.Random(seed)),
    )
    assert two.goodput <= one.goodput + 1e-12, (name, value, raised)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["restart_s", "detect_s", "hang_timeout_s", "ckpt_write_s"]), st.floats(1.01, 20.0))
def test_goodput_never_rises_when_a_cost_of_the_baseline_rises(name, factor):
    base = Restart()
    raised = dataclasses.replace(base, **{name: getattr(base, name) * factor})
    for job in (JOB, SimulatedJob(gpus=16384)):
        assert expected(raised, job, MIX) <= expected(base, job, MIX) + 1e-12


@pytest.mark.parametrize(
    "make",
    [
        lambda: SimulatedJob(gpus=1024, failures_per_node_hour=float("nan")),
        lambda: SimulatedJob(gpus=1024, failures_per_node_hour=-1.0),
        lambda: SimulatedJob(gpus=1024, work_hours=0.0),
        lambda: SimulatedJob(gpus=1001),
        lambda: Ladder(spare_s=float("nan")),
        lambda: Ladder(refill_s=-1.0),
        lambda: Ladder(steady_overhead=1.0),
        lambda: Restart(ckpt_write_s=0.0),
        lambda: Restart(restart_s=float("inf")),
        lambda: FaultMix(process=0.5, hang=0.5, node=0.5, correlated=0.0),
    ],
)
def test_bad_inputs_are_refused_with_one_message(make):
    with pytest.raises(ValueError):
        make()


def test_without_failures_goodput_is_the_steady_speed():
    job = dataclasses.replace(JOB, failures_per_node_hour=0.0, planned_per_day=0.0)
    ladder = dataclasses.replace(LADDER, steady_overhead=0.02)
    assert run_trial(ladder, job, MIX, random.Random(0)).goodput == pytest.approx(0.98)
    assert expected(ladder, job, MIX) == pytest.approx(0.98) and expected(Restart(), job, MIX) == 1.0
    assert daly_interval(60, 1e6) == pytest.approx(math.sqrt(2 * 60 * 1e6) - 60, rel=0.01)
