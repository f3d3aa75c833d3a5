"""A rank's place as torch and submitit read it, from a generation's plan: true after a
re-formation that moved ranks, and with spare nodes left out of the node count."""

from __future__ import annotations

from resilience.contract.messages import Plan, SlotInfo
from resilience.rank_place import RankPlace, place_of, submitit_variables, torch_variables


def _plan(members: dict[int, str]) -> Plan:
    slots = {
        "n0p0": SlotInfo(0, 0),
        "n0p1": SlotInfo(0, 1),
        "n1p0": SlotInfo(1, 0),
        "n1p1": SlotInfo(1, 1),
        "n2p0": SlotInfo(2, 0),
        "n2p1": SlotInfo(2, 1),  # a spare node
    }
    return Plan(generation=2, world_size=len(members), members=members, slots=slots, procs_per_node=2)


def test_a_spare_that_took_a_lost_nodes_ranks_is_node_1_of_2():
    plan = _plan({0: "n0p0", 1: "n0p1", 2: "n2p0", 3: "n2p1"})  # node 1 was lost, node 2 replaced it
    assert place_of(plan, "n2p1") == RankPlace(
        rank=3, world_size=4, local_rank=1, local_world_size=2, node=1, num_nodes=2
    )
    assert place_of(plan, "n0p0").node == 0


def test_group_rank_follows_the_ranks_when_a_spare_took_node_0s_ranks():
    """Node 0 lost, the spare node 2 holds ranks 0 and 1: it is group rank 0, and every rank's
    GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK is its RANK (frameworks derive the global rank so;
    by node id, rank 1 read group rank 1 and so global rank 3)."""
    plan = _plan({0: "n2p0", 1: "n2p1", 2: "n1p0", 3: "n1p1"})
    for rank, slot in plan.members.items():
        env = torch_variables(place_of(plan, slot), "10.0.0.1", 29500)
        assert int(env["GROUP_RANK"]) * int(env["LOCAL_WORLD_SIZE"]) + int(env["LOCAL_RANK"]) == rank
    assert place_of(plan, "n2p1").node == 0


def test_a_shrunk_world_counts_only_the_ranks_left():
    plan = _plan({0: "n0p0", 1: "n1p0", 2: "n1p1"})
    assert place_of(plan, "n0p0") == RankPlace(0, 3, 0, 1, node=0, num_nodes=2)
    assert place_of(plan, "n1p1").local_world_size == 2


def test_the_variables_torch_and_both_submitit_environments_read():
    place = RankPlace(rank=3, world_size=4, local_rank=1, local_world_size=2, node=1, num_nodes=2)
    assert torch_variables(place, "10.0.0.1", 29500) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    from submitit.local.local import LocalJobEnvironment
    from submitit.slurm.slurm import SlurmJobEnvironment

    assert submitit_variables(place, SlurmJobEnvironment._env) == {
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "4",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NUM_NODES": "2",
    }
    assert submitit_variables(place, LocalJobEnvironment._env)["SUBMITIT_LOCAL_GLOBALID"] == "3"
