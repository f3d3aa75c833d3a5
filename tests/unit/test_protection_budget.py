"""The protection budget's decisions (``resilience.tiers.budget``), with injected clocks."""

from __future__ import annotations

import threading

import pytest

from resilience.contract.tier_config import TierConfig
from resilience.errors import TierConfigError
from resilience.tiers import budget
from resilience.tiers.budget import CopyCost


@pytest.mark.parametrize(
    ("cost_s", "step_s", "share", "every"),
    [
        (0.0, 0.1, 0.03, 1),  # nothing measured: every commit
        (0.002, 0.1, 0.03, 1),  # 2% at every commit: within
        (0.004, 0.1, 0.03, 2),  # 4% -> 2% at every other
        (0.03, 0.1, 0.03, 16),  # 30% -> 1.9% at every 16th (8th would be 3.75%)
        (0.2, 0.1, 0.03, 64),  # 200%: capped, 3.1%
        (0.2, 0.1, 0.0, 1),  # a budget of 0 copies every commit whatever it costs
    ],
)
def test_the_cadence_is_the_smallest_power_of_two_within_the_budget(cost_s, step_s, share, every):
    chosen = budget.choose_every(cost_s, step_s, share)
    assert chosen == every
    if 0 < chosen < budget.MAX_EVERY and share:
        assert cost_s / (chosen * step_s) <= share
        assert chosen == 1 or cost_s / (chosen // 2 * step_s) > share


def test_a_cost_just_under_the_line_does_not_shorten_the_cadence_at_every_window():
    # At 8: 2.9% (within); with the cadence at 16 now it stays at 16 (8 would be above 3/4 of it).
    assert budget.choose_every(0.0232, 0.1, 0.03, current=16) == 16
    # Clearly cheaper now (1.5% at 8, under 3/4 of 3%): shortened.
    assert budget.choose_every(0.012, 0.1, 0.03, current=16) == 8
    # Dearer: lengthened at once.
    assert budget.choose_every(0.05, 0.1, 0.03, current=8) == 32


def test_steps_at_risk_count_the_unprotected_steps_and_the_copy_s_own_lag():
    assert budget.steps_at_risk(1, budget.lag_steps(0.05, 0.1)) == 1  # today's default: one step
    assert budget.steps_at_risk(16, budget.lag_steps(0.25, 0.1)) == 18
    assert budget.lag_steps(0.0, 0.1) == 0


def test_ranks_decide_at_the_same_steps_once_a_generation_has_measured():
    steps = [s for s in range(100) if budget.decides_at(s, commits=s - 9)]  # a generation from step 10
    assert steps == [32, 48, 64, 80, 96]


def test_copy_cost_is_the_copying_threads_time_per_protected_commit():
    cpu, wall = iter([1.0, 1.2, 5.0, 5.5]), iter([10.0, 10.5, 20.0, 21.0])
    cost = CopyCost(cpu=lambda: next(cpu), wall=lambda: next(wall))
    assert cost.take() is None  # nothing protected yet
    with cost.measure():
        pass
    with cost.measure():
        pass
    cost.protected()
    cost.protected()
    got = cost.take()
    assert got is not None and got.commits == 2
    assert (round(got.cpu_s, 6), round(got.wall_s, 6)) == (0.35, 0.75)
    assert cost.take() is None  # taken


def test_copy_cost_adds_up_across_threads():
    cost = CopyCost()

    def work() -> None:
        for _ in range(200):
            with cost.measure():
                sum(range(200))
            cost.protected()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = cost.take()
    assert got is not None and got.commits == 800 and got.cpu_s > 0


def test_the_budget_is_a_validated_share_and_a_fixed_cadence_turns_it_off():
    assert TierConfig(job_id="j").budgeted and TierConfig(job_id="j").budget == 0.03
    assert TierConfig(job_id="j", budget=0).budgeted is False
    assert TierConfig(job_id="j", ram_every=10).budgeted is False
    for bad in (1.5, -0.1, "3%", True):
        with pytest.raises(TierConfigError):
            TierConfig(job_id="j", budget=bad)


def test_sres_status_says_the_cadence_and_the_steps_at_risk():
    from launcher.cli.elastic import _status_text

    status = {
        "world_size": 4,
        "nodes": ["a", "b"],
        "spares": [],
        "min_nodes": 1,
        "max_nodes": 2,
        "generation": 3,
        "step": 120,
        "faults": 1,
        "last_resize": None,
        "protection": {"step": 96, "every": 32, "steps_at_risk": 34, "overhead": 0.021, "budget": 0.03},
    }
    line = [x for x in _status_text(status).splitlines() if x.startswith("protection")]
    assert line == [
        "protection   tiers copy every 32 step(s), 34 step(s) at risk "
        "(2.1% of step time, budget 3%; since step 96)"
    ]
    assert not [
        x for x in _status_text({**status, "protection": None}).splitlines() if x.startswith("protection")
    ]
