"""What a commit takes (parts, random streams, the boundary check) and where a lost rank's own
part comes from (``plan_rank_parts``): pure, no processes."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from resilience.context import Context
from resilience.errors import RegistrationError
from resilience.state import committed
from resilience.state.replication import Holdings, RankPart, plan_rank_parts


def test_random_streams_come_back_exactly():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = committed.rng_state()
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    committed.set_rng_state(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])


def test_parts_keep_parameters_by_reference_and_copy_what_changes_outside_the_optimizer():
    model = torch.nn.BatchNorm1d(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    loader = torch.utils.data.DataLoader(list(range(4)))
    objects = {"model": model, "opt": opt, "sched": sched, "extra": committed.PerRank({"n": 1})}
    parts = committed.take(objects, rng=True)
    assert set(parts["replicated"]) == {"model", "opt", "sched"} and set(parts["rank"]) == {
        "extra",
        committed.RNG,
    }
    assert parts["replicated"]["model"]["weight"].data_ptr() == model.weight.data_ptr()
    assert parts["replicated"]["model"]["running_mean"].data_ptr() != model.running_mean.data_ptr()
    before = committed.small(parts, objects)
    model(torch.randn(4, 2))  # draws random numbers; running statistics move in forward
    opt.step()
    sched.step()  # the learning rate moves
    after = committed.small(committed.take(objects, rng=True), objects)
    assert committed.changed(before, after) == sorted([committed.RNG, "model", "opt", "sched"])
    assert committed.part_of(loader) == "rank"


def test_a_plain_dataloader_is_refused_with_the_two_ways_that_work():
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=-1)
    with pytest.raises(RegistrationError) as err:
        ctx.register(loader=torch.utils.data.DataLoader(list(range(4))))
    assert "StatefulDataLoader" in str(err.value) and "ElasticSampler" in str(err.value)
    assert "\n" not in str(err.value)


def test_random_streams_are_set_before_the_first_step_after_a_re_entry():
    torch.manual_seed(5)
    saved = committed.rng_state()
    expected = torch.rand(2)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=2, step=3, restored={committed.RNG: saved})
    torch.manual_seed(0)  # what train's top does on every entry
    for _ in ctx.steps(5):
        assert torch.equal(torch.rand(2), expected)


def test_state_changed_after_the_commit_block_is_taken_at_the_step_boundary():
    seen = []

    class Runtime:
        def before_step(self, step):
            pass

        def before_commit(self):
            pass

        def after_commit(self, step, ctx):
            pass

        def committed(self, step, ctx, changed):
            seen.append((step, changed))

    counter = {"n": 0}
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=-1, runtime=Runtime())
    ctx.register(counter=counter)
    for _ in ctx.steps(2):
        with ctx.commit():
            pass
        counter["n"] += 1  # after the commit block: belongs to the step just committed
    assert seen == [(0, ["counter"]), (1, ["counter"])]
    assert ctx.states()["replicated"]["counter"] == {"n": 2}


def _h(rank, ranked=(), replicas=None, world=2):
    return Holdings(
        rank,
        own=(5,),
        ranked=ranked,
        rank_replicas=replicas or {},
        rank_world=world if ranked or replicas else 0,
    )


def test_a_replaced_rank_gets_its_own_part_from_its_buddy_never_a_peers():
    holdings = {0: _h(0, ranked=(4, 5), replicas={1: (4, 5)}), 1: Holdings(1)}
    assert plan_rank_parts(5, 2, holdings) == ((RankPart(0, 0, 5), RankPart(1, 0, 5)), ())


def test_a_part_lost_with_its_buddy_copy_resumes_older_and_is_named_inexact():
    holdings = {0: _h(0, ranked=(4, 5), replicas={1: (4,)}), 1: Holdings(1)}
    assert plan_rank_parts(5, 2, holdings) == ((RankPart(0, 0, 5), RankPart(1, 0, 4)), (1,))
    assert plan_rank_parts(5, 2, {0: _h(0, ranked=(5,)), 1: Holdings(1)}) == ((RankPart(0, 0, 5),), (1,))


def test_no_parts_after_a_resize_nor_before_the_first_commit():
    holdings = {0: _h(0, ranked=(5,), world=3), 1: _h(1, ranked=(5,), world=3)}
    assert plan_rank_parts(5, 2, holdings) == ((), ())
    assert plan_rank_parts(-1, 2, {0: _h(0, ranked=(5,))}) == ((), ())


def test_a_parameter_changed_in_place_after_the_commit_is_seen_without_reading_it():
    model = torch.nn.Linear(2, 2)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=-1)
    ctx.register(model=model)
    for _ in ctx.steps(1):
        with ctx.commit():
            pass
    assert ctx.matches_commit()
    model(torch.randn(3, 2)).sum().backward()  # a step's forward and backward change no parameter
    assert ctx.matches_commit()
    with torch.no_grad():
        model.weight.mul_(2)
    assert not ctx.matches_commit()


def test_the_state_loaded_on_entry_is_not_committed_again():
    seen = []

    class Runtime:
        def before_step(self, step):
            pass

        def before_commit(self):
            pass

        def after_commit(self, step, ctx):
            pass

        def committed(self, step, ctx, changed):
            seen.append(step)

    ctx = Context(
        rank=0,
        world_size=1,
        local_rank=0,
        generation=2,
        step=8,
        runtime=Runtime(),
        restored={"counter": {"n": 8}},
    )
    ctx.register(counter={})
    for _ in ctx.steps(9):  # nothing left to train
        pass
    ctx.boundary()
    assert seen == []
