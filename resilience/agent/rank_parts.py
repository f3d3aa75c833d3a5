"""Each rank's own part of a commit, kept where a replacement of that rank gets it back.

The per-rank part (random streams, data loaders' positions: ``resilience.state.committed``)
is small and differs between ranks, so no peer's copy will do. It is kept as snapshots in this
process, and each commit's is sent to the rank's buddies on other nodes in the background,
with its own tag so that it never waits behind a shard copy on the same group. A process that
replaces a rank receives its part from a buddy at recovery (``plan_rank_parts``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypedDict

import torch.distributed as dist

from resilience.state import snapshot
from resilience.state.recovery_plan import RankPart
from resilience.state.replication import KEEP_OWN, BuddyReplicator, SnapshotRing
from resilience.state.transfer import recv_snapshot, send_snapshot
from resilience.state.snapshot import Snapshot

TAG = 1
"""The per-rank rounds' tag on the state group (shard copies use 0)."""


class PartHoldings(TypedDict):
    """The per-rank fields of a ``Holdings``, spread into it: mypy checks them against its own."""

    ranked: tuple[int, ...]
    rank_replicas: dict[int, tuple[int, ...]]
    rank_world: int


class RankParts:
    """This process's own per-rank snapshots, its buddies' copies, and the background round."""

    def __init__(self) -> None:
        self.own = SnapshotRing(KEEP_OWN)
        self.replicas: dict[int, SnapshotRing] = {}
        self.rank, self.world = -1, 0
        """As which rank, in which world size, the parts held here were taken."""
        self.replicator: BuddyReplicator | None = None

    def enter(self, world: int) -> None:
        """A new generation: after a resize the parts held belong to another numbering."""
        self.replicator = None
        if self.world and world != self.world:
            self.clear()

    def clear(self) -> None:
        self.own.clear()
        self.replicas.clear()
        self.rank, self.world = -1, 0

    def holdings(self, rank: int, world: int) -> PartHoldings:
        """``Holdings`` fields: what this process can offer of per-rank parts."""
        same = self.world == world
        return {
            "ranked": self.own.steps() if same and self.rank == rank else (),
            "rank_replicas": {o: r.steps() for o, r in self.replicas.items()} if same else {},
            "rank_world": self.world,
        }

    def commit(
        self,
        step: int,
        part: Mapping[str, Any],
        group: dist.ProcessGroup,
        rank: int,
        world: int,
        procs_per_node: int,
        factor: int,
    ) -> None:
        """Keep ``part`` as ``step``'s and start sending it to the buddies. The caller has
        joined the previous round (``in_flight``)."""
        snap = snapshot.capture(part, step)
        self.own.put(snap)
        self.rank, self.world = rank, world
        if self.replicator is None:
            self.replicator = BuddyReplicator(
                group, rank, world, procs_per_node, factor, self.replicas, tag=TAG
            )
        self.replicator.start(snap)

    @property
    def in_flight(self) -> threading.Thread | None:
        return self.replicator.in_flight if self.replicator is not None else None

    def wait(self) -> None:
        if self.replicator is not None:
            self.replicator.wait()

    def abandon(self) -> None:
        if self.replicator is not None:
            self.replicator.abandon()

    def recover(
        self,
        parts: tuple[RankPart, ...],
        step: int,
        me: int,
        world: int,
        group: dist.ProcessGroup,
        midway: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Serve and receive per-rank parts as ``parts`` says (every rank walks the same list);
        return this rank's, ready to load (empty when it has none)."""
        mine: Snapshot | None = None
        for part in parts:
            if part.holder == me and part.rank == me:
                mine = self.own.get(part.step)
            elif part.holder == me:
                held = self.replicas[part.rank].get(part.step)
                assert held is not None, "the plan names a holder only for what it said it holds"
                send_snapshot(held, part.rank, group, midway)
            elif part.rank == me:
                mine = recv_snapshot(part.holder, group)
        for ring in (self.own, *self.replicas.values()):
            ring.drop_after(step)
        if mine is None:
            self.own.clear()
            return {}
        if self.own.get(mine.step) is not mine:
            self.own.clear()
            self.own.put(mine)
        self.rank, self.world = me, world
        return snapshot.materialize(mine, copy=True)

    def adopt(self, snap: Snapshot | None, rank: int, world: int) -> None:
        """The tiers restored this rank: their copy of its part is now its own."""
        self.clear()
        if snap is not None:
            self.own.put(snap)
            self.rank, self.world = rank, world
