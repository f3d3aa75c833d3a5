"""plan_recovery: which step a generation resumes at, and who sends what. Pure."""

import pytest

from resilience.state.recovery_plan import MAX_STRIPES
from resilience.state.replication import Holdings, Transfer, Unrecoverable, buddies, plan_recovery


def test_fresh_start_has_nothing_to_move():
    plan = plan_recovery(4, {r: Holdings(r) for r in range(4)})
    assert plan.step == -1 and plan.transfers == ()


def test_replicated_state_comes_from_a_live_peer():
    holdings = {
        0: Holdings(0, own=(8, 9)),
        1: Holdings(1),
        2: Holdings(2, own=(8, 9)),
        3: Holdings(3, own=(8, 9)),
    }
    plan = plan_recovery(4, holdings)
    assert plan.step == 9
    # from every holder at once, each its stripe; rank 1's from the holders after it first
    assert plan.transfers == (
        Transfer(2, 1, "replicated", 2, 0, 3),
        Transfer(3, 1, "replicated", 3, 1, 3),
        Transfer(0, 1, "replicated", 0, 2, 3),
    )
    assert plan.stripes_to(1) == [2, 3, 0] and plan.stripes_to(0) == []
    assert plan.source(1) == "peer" and plan.source(0) == "self"


def test_replicated_state_comes_from_at_most_max_stripes_holders_spread_over_them():
    holdings = {r: Holdings(r, own=(5,)) for r in range(10)} | {3: Holdings(3), 7: Holdings(7)}
    plan = plan_recovery(10, holdings)
    assert plan.stripes_to(3) == [4, 5, 6, 8] and plan.stripes_to(7) == [9, 0, 1, 2]
    assert len(plan.transfers) == 2 * MAX_STRIPES


def test_a_survivor_one_commit_behind_receives_the_newer_state():
    holdings = {0: Holdings(0, own=(9,)), 1: Holdings(1, own=(8,)), 2: Holdings(2, own=(9,))}
    plan = plan_recovery(3, holdings)
    assert plan.step == 9 and plan.transfers == (
        Transfer(2, 1, "replicated", 2, 0, 2),
        Transfer(0, 1, "replicated", 0, 1, 2),
    )


def test_a_sharded_survivor_one_commit_ahead_rolls_back():
    # Rank 1 never committed step 9, so its shard of step 9 exists nowhere: all go back to 8.
    holdings = {
        0: Holdings(0, own=(8, 9), shards=(8, 9), replicas={2: (8, 9)}, sharded=True),
        1: Holdings(1, own=(7, 8), shards=(7, 8), replicas={0: (7, 8)}, sharded=True),
        2: Holdings(2, own=(8, 9), shards=(8, 9), replicas={1: (7, 8)}, sharded=True),
    }
    plan = plan_recovery(3, holdings)
    assert plan.step == 8 and plan.transfers == ()


def test_sharded_state_comes_from_the_buddy():
    holdings = {
        0: Holdings(0, own=(4, 5), shards=(4, 5), replicas={3: (4, 5)}, sharded=True),
        1: Holdings(1),  # replaced
        2: Holdings(2, own=(4, 5), shards=(4, 5), replicas={1: (4, 5)}, sharded=True),
        3: Holdings(3, own=(4, 5), shards=(4, 5), replicas={2: (4, 5)}, sharded=True),
    }
    plan = plan_recovery(4, holdings)
    assert plan.step == 5
    assert Transfer(2, 1, "sharded", 1) in plan.transfers


def test_buddy_copy_cut_off_by_the_fault_rolls_back_one_step():
    holdings = {
        0: Holdings(0, own=(4, 5), shards=(4, 5), replicas={3: (4, 5)}, sharded=True),
        1: Holdings(1),
        2: Holdings(2, own=(4, 5), shards=(4, 5), replicas={1: (3, 4)}, sharded=True),
        3: Holdings(3, own=(4, 5), shards=(4, 5), replicas={2: (4, 5)}, sharded=True),
    }
    assert plan_recovery(4, holdings).step == 4


def test_a_first_commit_whose_buddy_copy_was_cut_off_starts_over():
    """Found by sres chaos (seed 7, sharded): rank 2 hung at step 1 while its copy of commit 0
    was on its way; the commit before the first is the initial state, rebuilt by every rank."""
    holdings = {
        0: Holdings(0, own=(0,), shards=(0,), replicas={3: (0,)}, sharded=True),
        1: Holdings(1, own=(0,), shards=(0,), replicas={0: (0,)}, sharded=True),
        2: Holdings(2),
        3: Holdings(3, own=(0,), shards=(0,), replicas={}, sharded=True),
    }
    assert plan_recovery(4, holdings).step == -1


def test_losing_both_holders_of_a_shard_is_unrecoverable():
    holdings = {
        0: Holdings(0, own=(5,), shards=(5,), replicas={3: (5,)}, sharded=True),
        1: Holdings(1),
        2: Holdings(2),
        3: Holdings(3, own=(5,), shards=(5,), replicas={2: (5,)}, sharded=True),
    }
    with pytest.raises(Unrecoverable, match="rank 1 at step 5 is on no live process"):
        plan_recovery(4, holdings)


def test_buddies_are_on_other_nodes():
    assert buddies(0, world=8, procs_per_node=2, factor=2) == [2]
    assert buddies(7, world=8, procs_per_node=2, factor=3) == [1, 3]
    assert buddies(0, world=1, procs_per_node=1, factor=2) == []


def test_an_hsdp_shard_comes_from_its_twin_in_another_replica_group():
    # HSDP 2x2: ranks 0 and 2 hold the same shards, so do 1 and 3; no buddy copies are made.
    def rank(r, twin):
        return Holdings(r, own=(4, 5), shards=(4, 5), sharded=True, twins=(twin,))

    plan = plan_recovery(4, {0: rank(0, 2), 1: Holdings(1), 2: rank(2, 0), 3: rank(3, 1)})
    assert plan.step == 5 and Transfer(3, 1, "sharded", 3) in plan.transfers  # rank 3's own shard
    with pytest.raises(Unrecoverable, match="rank 1 at step 5"):  # both holders of that shard lost
        plan_recovery(4, {0: rank(0, 2), 1: Holdings(1), 2: rank(2, 0), 3: Holdings(3)})


def test_twins_count_as_copies_of_a_shard():
    assert buddies(0, world=4, procs_per_node=1, factor=2, twins=1) == []
    assert buddies(0, world=4, procs_per_node=1, factor=3, twins=1) == [1]
