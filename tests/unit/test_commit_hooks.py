"""A commit opened and closed from two hooks (what a framework integration does): the same
commit as ``with ctx.commit():``, and each misuse a one-line ``CommitOrderError``, which the rank
reports as refused (the same on every entry, so never retried)."""

from __future__ import annotations

import pytest
import torch

from resilience.context import Context
from resilience.errors import CommitOrderError


def _ctx() -> Context:
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=-1)
    ctx.register(model=torch.nn.Linear(2, 2))
    return ctx


def test_hooks_commit_as_the_block_does():
    ctx = _ctx()
    for step in range(3):
        ctx.begin_step(step)
        ctx.open_commit()
        ctx.close_commit()
    assert ctx.step == 2
    ctx.boundary()  # train returns: nothing left open


def test_a_commit_left_open_fails_the_next_step_and_the_end_of_train():
    ctx = _ctx()
    ctx.begin_step(0)
    ctx.open_commit()
    with pytest.raises(CommitOrderError, match="still open"):
        ctx.begin_step(1)
    with pytest.raises(CommitOrderError, match="left open"):
        ctx.boundary()


@pytest.mark.parametrize(
    "misuse, said",
    [
        (lambda ctx: ctx.close_commit(), "without open_commit"),
        (lambda ctx: ctx.open_commit(), "outside a step"),
        (lambda ctx: ctx.begin_step(3), "must go on at step 0"),
    ],
)
def test_each_misuse_is_one_line(misuse, said):
    with pytest.raises(CommitOrderError, match=said) as raised:
        misuse(_ctx())
    assert "\n" not in str(raised.value)


def test_opening_twice_is_refused():
    ctx = _ctx()
    ctx.begin_step(0)
    ctx.open_commit()
    with pytest.raises(CommitOrderError, match="open already"):
        ctx.open_commit()


def test_steps_still_allows_a_loop_that_skips_a_commit():
    """``ctx.steps()`` numbers steps itself: a step its loop did not commit is no error there."""
    ctx = _ctx()
    for step in ctx.steps(3):
        if step != 1:
            with ctx.commit():
                pass
    assert ctx.step == 2


def test_a_frameworks_loader_position_is_refused_in_a_run_that_may_resize():
    """Per rank and world size: after a resize no rank would have one (as a DataLoader's)."""
    from resilience.errors import RegistrationError
    from resilience.integrations.epochs import EpochBatches

    ctx = Context(rank=0, world_size=2, local_rank=0, generation=1, step=-1, resizable=True)
    with pytest.raises(RegistrationError, match="may change its world size"):
        ctx.register(loader=EpochBatches([1, 2, 3]))


def test_a_fresh_run_goes_on_after_the_frameworks_own_checkpoint():
    """torchtitan loaded its checkpoint of step 9 where sres had nothing: the loop goes on at 10."""
    ctx = _ctx()
    ctx.start_after(9)
    with pytest.raises(CommitOrderError, match="must go on at step 10"):
        ctx.begin_step(0)
    ctx.begin_step(10)
    ctx.open_commit()
    ctx.close_commit()
    assert ctx.step == 10


def test_only_an_entry_that_restored_nothing_goes_on_after_a_frameworks_checkpoint():
    resumed = Context(rank=0, world_size=1, local_rank=0, generation=2, step=4)
    with pytest.raises(CommitOrderError, match="resumed after step 4"):
        resumed.start_after(9)
    began = _ctx()
    began.begin_step(0)
    with pytest.raises(CommitOrderError, match="began a step"):
        began.start_after(9)
