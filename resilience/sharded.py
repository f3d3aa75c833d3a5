"""ShardedOptimizer: ZeRO-1, each rank keeps the optimizer state of its share of parameters.

Gradients are still all-reduced in full (by DDP); each rank then steps only the parameters
it owns and broadcasts them to the others. Optimizer memory drops by the world size, and the
state becomes *sharded*: it exists once, on its owner, which is why ``ctx.register`` sends
it to buddy ranks on other nodes after every commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist


def partition(sizes: list[int], world: int) -> list[int]:
    """Owner rank of each parameter: greedy by size, largest first, ties to the lower rank. Pure."""
    load = [0] * world
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += sizes[index]
    return owner


class ShardedOptimizer:
    """Wraps ``optimizer_class`` so that each rank holds the state of its own parameters only.

    ``ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3)``; call after the
    default process group is ready (inside ``train``, it is).
    """

    sharded = True  # read by Context.register: this state needs buddy copies

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        optimizer_class: type[torch.optim.Optimizer],
        **defaults: Any,
    ) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.owner = partition([p.numel() for p in self.params], self.world)
        mine = [p for p, o in zip(self.params, self.owner) if o == self.rank]
        # An optimizer needs at least one parameter: a rank that owns none gets a dummy.
        self._dummy = None if mine else torch.nn.Parameter(torch.zeros(1))
        self.local = optimizer_class(mine or [self._dummy], **defaults)

    @property
    def param_groups(self):
        return self.local.param_groups

    @torch.no_grad()
    def step(self) -> None:
        self.local.step()
        if self.world == 1:
            return
        for rank in range(self.world):
            owned = [p for p, o in zip(self.params, self.owner) if o == rank]
            if not owned:
                continue
            flat = (
                torch.cat([p.detach().reshape(-1) for p in owned])
                if rank == self.rank
                else torch.empty(sum(p.numel() for p in owned), dtype=owned[0].dtype, device=owned[0].device)
            )
            dist.broadcast(flat, src=rank)
            if rank != self.rank:
                offset = 0
                for p in owned:
                    p.copy_(flat[offset : offset + p.numel()].view_as(p))
                    offset += p.numel()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {
            "world_size": self.world,
            "rank": self.rank,
            "owner": list(self.owner),
            "local": self.local.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "shards" in state:  # every shard of a checkpoint written by another world size
            state = reshard(state["shards"], self.owner, self.rank, self.world)
        if (
            state["world_size"] != self.world
            or state["owner"] != list(self.owner)
            or state["rank"] != self.rank
        ):
            raise ValueError(
                f"sharded optimizer state of rank {state['rank']}/{state['world_size']} does not fit rank "
                f"{self.rank}/{self.world}; resharding to another world size needs a checkpoint tier"
            )
        self.local.load_state_dict(state["local"])


def reshard(shards: list[dict[str, Any]], owner: list[int], rank: int, world: int) -> dict[str, Any]:
    """The state of ``rank`` in a world of ``world`` ranks whose parameter owners are ``owner``,
    built from every shard of a checkpoint written by ``len(shards)`` ranks. Pure.

    Each parameter's optimizer state moves whole from its old owner to its new one; the
    hyperparameters come from the first shard (one parameter group, as ShardedOptimizer has).
    """
    old_owner = list(shards[0]["owner"])
    if len(old_owner) != len(owner):
        raise ValueError(f"the checkpoint has {len(old_owner)} parameters, the model {len(owner)}")
    if sorted(s["rank"] for s in shards) != list(range(len(shards))):
        raise ValueError("resharding needs every shard of the checkpoint")
    by_rank = {s["rank"]: s for s in shards}
    where: dict[int, tuple[int, int]] = {}
    counters = [0] * len(shards)
    for index, o in enumerate(old_owner):
        where[index] = (o, counters[o])
        counters[o] += 1
    groups = [dict(g) for g in by_rank[0]["local"]["param_groups"]]
    if len(groups) != 1:
        raise ValueError("resharding supports one parameter group")
    mine = [i for i, o in enumerate(owner) if o == rank]
    state = {}
    for local, index in enumerate(mine):
        o, old_local = where[index]
        entry = by_rank[o]["local"]["state"].get(old_local)
        if entry is not None:
            state[local] = entry
    groups[0]["params"] = list(range(max(1, len(mine))))
    return {
        "world_size": world,
        "rank": rank,
        "owner": list(owner),
        "local": {"state": state, "param_groups": groups},
    }
