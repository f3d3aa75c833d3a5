"""What a rank process keeps from one generation to the next: the memory peers recover from.

A survivor's snapshots, its buddies' copies and its per-rank parts are why recovery needs no
disk. They outlive every generation, so they live in one object that the commit pipeline
fills and :mod:`resilience.agent.recovery` reads and trims; nothing else holds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resilience.agent.rank_parts import RankParts
from resilience.state.recovery_plan import Holdings
from resilience.state.replication import KEEP_OWN, SnapshotRing
from resilience.tiers.restore import Restored


def _own_rings() -> dict[str, SnapshotRing]:
    return {"replicated": SnapshotRing(KEEP_OWN), "sharded": SnapshotRing(KEEP_OWN)}


@dataclass
class Kept:
    own: dict[str, SnapshotRing] = field(default_factory=_own_rings)
    """This rank's snapshots by part (``replicated`` only in sharded runs, which may roll back)."""
    replicas: dict[int, SnapshotRing] = field(default_factory=dict)
    """Shards of other ranks (owner -> ring) that this rank holds as their buddy."""
    parts: RankParts = field(default_factory=RankParts)
    sharded: bool = False
    """The run registers sharded state: commits snapshot it and buddies copy it."""
    shard_world: int = 0
    shard_rank: int = -1
    """In which world size and as which rank the shards held were made."""
    twins: tuple[int, ...] = ()
    """Ranks whose shards are this rank's too (HSDP replicas)."""

    def holdings(self, rank: int, world_size: int, live_step: int | None) -> Holdings:
        """What this process can offer in a recovery (gathered from every rank)."""
        own = self.own["replicated"].steps() or ((live_step,) if live_step is not None else ())
        return Holdings(
            rank,
            own=own,
            shards=self.own["sharded"].steps(),
            replicas={o: r.steps() for o, r in self.replicas.items()},
            sharded=self.sharded,
            shard_world=self.shard_world,
            shard_rank=self.shard_rank,
            twins=self.twins,
            **self.parts.holdings(rank, world_size),
        )

    def shards_made(self, world_size: int, rank: int) -> None:
        """The shards held from now on are of this world and rank."""
        self.sharded = True
        self.shard_world, self.shard_rank = world_size, rank

    def shard_as(self, world_size: int, rank: int) -> None:
        """At a sharded commit: the first one in this world (or as this rank) drops the shards
        held, which are of another layout."""
        if (self.shard_world, self.shard_rank) != (world_size, rank):
            self.own["sharded"].clear()
            self.replicas.clear()
            self.shard_world, self.shard_rank = world_size, rank

    def adopt(self, tiered: Restored, rank: int, world_size: int) -> None:
        """The tiers restored this rank: their snapshots become what it keeps."""
        for kind, ring in self.own.items():
            ring.clear()
            if kind in tiered.snaps:
                ring.put(tiered.snaps[kind])
        self.parts.adopt(tiered.snaps.get("rank"), rank, world_size)
        if "sharded" in tiered.snaps:
            self.shard_world, self.shard_rank = world_size, rank
        self.sharded = "sharded" in tiered.snaps or any(
            isinstance(v, dict) and "shards" in v for v in tiered.states.values()
        )
