"""ElasticSampler and batch plans: pure, no processes."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resilience.elastic import BatchError, ElasticSampler, batch_plan, coverage


@pytest.mark.parametrize(
    "global_batch, micro, world, used, micro_batches, lr",
    [
        (24, 4, 4, 24, (4, 2), 1.0),
        (24, 4, 3, 24, (4, 4), 1.0),
        (24, 8, 1, 24, (8, 8, 8), 1.0),
        (20, 4, 3, 21, (4, 3), 21 / 20),  # 18 and 21: 21 is closer
        (22, 4, 4, 20, (4, 1), 20 / 22),  # 20 and 24: a tie goes to the smaller
        (3, 4, 5, 5, (1,), 5 / 3),  # below one per rank: never zero
    ],
)
def test_batch_plan(global_batch, micro, world, used, micro_batches, lr):
    plan = batch_plan(global_batch, micro, world)
    assert (plan.global_batch, plan.micro_batches, plan.accumulation) == (
        used,
        micro_batches,
        len(micro_batches),
    )
    assert plan.lr_scale == pytest.approx(lr)
    assert plan.kept == (used == global_batch)


def test_lr_scalings_and_refusals():
    assert batch_plan(20, 4, 3, lr_scaling="sqrt").lr_scale == pytest.approx(math.sqrt(21 / 20))
    assert batch_plan(20, 4, 3, lr_scaling="none").lr_scale == 1.0
    with pytest.raises(BatchError, match="does not divide the global batch 20"):
        batch_plan(20, 4, 3, policy="fail")
    with pytest.raises(BatchError, match="lr scaling 'cubic'"):
        batch_plan(20, 4, 3, lr_scaling="cubic")


def _train(sampler: ElasticSampler, worlds: list[int]) -> list[list[int]]:
    """The samples of each step, over all ranks, as a run with these world sizes uses them."""
    out = []
    for step, world in enumerate(worlds):
        out.append([i for rank in range(world) for mb in sampler.indices(step, rank, world) for i in mb])
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(5, 60),
    batch=st.integers(1, 24),
    micro=st.integers(1, 8),
    seed=st.integers(0, 3),
    worlds=st.lists(st.integers(1, 6), min_size=1, max_size=40),
)
def test_every_sample_of_an_epoch_once_over_any_resizes(n, batch, micro, seed, worlds):
    sampler = ElasticSampler(n, batch, micro, seed)
    steps = _train(sampler, worlds)
    stream = [i for step in steps for i in step]
    for epoch_start in range(0, len(stream) - n + 1, n):
        assert sorted(stream[epoch_start : epoch_start + n]) == list(range(n))
    tail = stream[len(stream) // n * n :]
    assert len(set(tail)) == len(tail)  # the epoch in progress has no repeat either
    for step, world in zip(steps, worlds):
        plan = sampler.plan(world)
        assert len(step) == plan.global_batch
        if batch % world == 0:
            assert len(step) == batch  # kept wherever the world divides it


def test_a_redone_step_in_another_world_replaces_the_uncommitted_segment():
    sampler = ElasticSampler(50, 12, 4, 1)
    _train(sampler, [4, 4, 4])
    state = sampler.state_dict()
    sampler.indices(3, 0, 5)  # step 3 started at world 5 (12 -> 10), then a fault...
    sampler.load_state_dict(state)  # ...the committed state (step 2) is restored
    again = ElasticSampler(50, 12, 4, 1)
    again.load_state_dict(sampler.state_dict())
    assert _train(again, [4, 4, 4, 3])[3] == _train(ElasticSampler(50, 12, 4, 1), [4, 4, 4, 3])[3]
    live = ElasticSampler(50, 12, 4, 1)
    _train(live, [4, 4, 4])
    live.indices(3, 0, 5)  # the live object kept the uncommitted segment: replaced
    assert live.indices(3, 0, 3) == again.indices(3, 0, 3)


def test_state_of_another_sampler_is_refused():
    with pytest.raises(BatchError, match="does not fit"):
        ElasticSampler(50, 12, 4).load_state_dict(ElasticSampler(60, 12, 4).state_dict())


def test_coverage_keeps_each_steps_newest_generation(tmp_path):
    sampler = ElasticSampler(20, 8, 4, 0)
    for step, world, generation in [(0, 2, 1), (1, 2, 1), (1, 4, 2), (2, 4, 2)]:
        sampler.indices(step, 0, world)
        for rank in range(world):
            sampler.record(tmp_path, step, rank, world, generation)
    cov = coverage(tmp_path)
    assert cov.steps == 3 and cov.worlds == (2, 4, 4) and not cov.gaps and not cov.overlaps
    assert sum(cov.counts[0].values()) == 20 and set(cov.counts[0].values()) == {1}
