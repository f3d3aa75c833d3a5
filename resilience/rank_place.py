"""Where a rank sits in its generation, and the variables that tell code written for torchrun
or submitit the same.

Libraries read a rank's place from the environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
submitit's ``JobEnvironment``). Under sres that place changes at a re-formation or resize, and
a rank process started as ``n1p0`` may hold rank 3 later; the agent sets these variables at the
start of every generation, before ``train`` is entered, so a read inside ``train`` is always
true. ``MASTER_ADDR``/``MASTER_PORT`` name the run's store: the process group is formed already
(``dist.init_process_group`` must not be called again), and the store refuses unsigned values.
"""

from __future__ import annotations

from dataclasses import dataclass

from resilience.contract.messages import Plan


@dataclass(frozen=True)
class RankPlace:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node: int
    """The index of this rank's node among the nodes that hold ranks (spares excluded), in the
    order of the lowest rank each holds: ``GROUP_RANK`` as torchrun sets it, so that code which
    derives a global rank from it (``GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK``) gets ``RANK``
    even after a spare with a higher node id took over node 0's ranks."""
    num_nodes: int


def place_of(plan: Plan, slot: str) -> RankPlace:
    """``slot``'s place in ``plan`` (the slot must hold a rank in it)."""
    rank = plan.rank_of(slot)
    if rank is None:
        raise ValueError(f"slot {slot} holds no rank in generation {plan.generation}")
    lowest: dict[int, int] = {}
    for member, member_slot in plan.members.items():
        node = plan.slots[member_slot].node
        lowest[node] = min(member, lowest.get(node, member))
    nodes = sorted(lowest, key=lowest.__getitem__)
    mine = plan.slots[slot].node
    return RankPlace(
        rank=rank,
        world_size=plan.world_size,
        local_rank=plan.slots[slot].local_rank,
        local_world_size=sum(1 for s in plan.members.values() if plan.slots[s].node == mine),
        node=nodes.index(mine),
        num_nodes=len(nodes),
    )


def torch_variables(place: RankPlace, store_host: str, store_port: int) -> dict[str, str]:
    """What torchrun would set for this place (``GROUP_RANK`` being the node's index)."""
    return {
        "RANK": str(place.rank),
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_RANK": str(place.local_rank),
        "LOCAL_WORLD_SIZE": str(place.local_world_size),
        "GROUP_RANK": str(place.node),
        "MASTER_ADDR": store_host,
        "MASTER_PORT": str(store_port),
    }


SUBMITIT_ROLES = ("global_rank", "local_rank", "num_tasks", "node", "num_nodes")
"""The roles of submitit's ``JobEnvironment._env`` (role -> variable) that a place fills."""


def submitit_variables(place: RankPlace, names: dict[str, str]) -> dict[str, str]:
    """The place in the variables ``names`` (a submitit ``JobEnvironment._env``) maps roles to:
    submitit's local and Slurm environments spell them differently."""
    values = {
        "global_rank": place.rank,
        "local_rank": place.local_rank,
        "num_tasks": place.world_size,
        "node": place.node,
        "num_nodes": place.num_nodes,
    }
    return {names[role]: str(values[role]) for role in SUBMITIT_ROLES if role in names}
