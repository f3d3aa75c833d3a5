"""Which step a generation resumes at, and who sends what to whom. Pure: no process, no group.

Every rank says what it holds (:class:`Holdings`). Data-parallel (replicated) state is the
same on every rank, so any live peer can serve it; sharded state exists once per rank, and on
its buddies and twins. :func:`plan_recovery` picks the newest step that every survivor still
holds and for which every replaced rank's state can be fetched; a survivor that got one step
further rolls back to it (commits are all-or-nothing across survivors). It never picks a step
for which some state is missing: that is :class:`Unrecoverable`. :func:`plan_rank_parts` says
where each rank's own per-rank part comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from resilience.errors import Unrecoverable


@dataclass(frozen=True)
class Holdings:
    """What one rank can offer: steps of its own state, and of buddies' shards it holds."""

    rank: int
    own: tuple[int, ...] = ()
    """Steps of this rank's replicated (data-parallel) state."""
    shards: tuple[int, ...] = ()
    """Steps of this rank's own sharded state."""
    replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    sharded: bool = False
    shard_world: int = 0
    """World size in which the sharded state held here (own and replicas) was made; 0: none."""
    shard_rank: int = -1
    """The rank whose shard ``shards`` are (this rank's own before a resize renumbered it)."""
    twins: tuple[int, ...] = ()
    """Ranks whose sharded state is this rank's too (HSDP: the same shard in the other replica
    groups): they serve it without buddy copies."""
    ranked: tuple[int, ...] = ()
    """Steps of this rank's own per-rank part (random streams, loader positions)."""
    rank_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    """owner -> steps of its per-rank part held here (this rank is its buddy)."""
    rank_world: int = 0
    """World size in which the per-rank parts held here were taken; 0: none."""


MAX_STRIPES = 4
"""Holders a replaced rank's replicated state comes from at once: a few streams fill a link that
one (one socket, one copying thread a side) does not; more would only cut the pieces smaller."""


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    part: str  # "replicated" | "sharded"
    owner: int
    """Whose snapshot ``src`` sends: the shard's owner (a buddy's copy), or ``src`` itself (a
    twin's own shard, or replicated state)."""
    stripe: int = 0
    stripes: int = 1
    """Replicated state comes from up to :data:`MAX_STRIPES` holders at once: ``src`` sends the
    ``stripe``-th of ``stripes`` shares of the stream (every ``stripes``-th piece)."""


@dataclass(frozen=True)
class RankPart:
    """Where rank ``rank`` gets its own per-rank part from: ``holder`` (itself or a buddy), as
    taken at ``step``'s commit (older than the recovery's step only when the newer was lost)."""

    rank: int
    holder: int
    step: int


@dataclass(frozen=True)
class RecoveryPlan:
    step: int  # -1: nothing committed yet, start from scratch
    transfers: tuple[Transfer, ...] = ()
    reshard: tuple[tuple[int, int], ...] = ()
    """After a resize: (owner in the old world, holder now) for every old shard; each holder
    broadcasts it and every rank rebuilds its own shard of the new world from all of them."""

    rank_parts: tuple[RankPart, ...] = ()
    inexact: tuple[int, ...] = ()
    """Ranks whose per-rank part of ``step`` is on no live process: they resume with an older
    one (or none), and the run is no longer bitwise what a fault-free run gives."""

    def source(self, rank: int) -> str:
        return "peer" if any(t.dst == rank for t in self.transfers) else "self"

    def stripes_to(self, rank: int) -> list[int]:
        """The holders whose stripes of the replicated state ``rank`` receives, in stripe order."""
        mine = [t for t in self.transfers if t.dst == rank and t.part == "replicated"]
        return [t.src for t in sorted(mine, key=lambda t: t.stripe)]


def plan_rank_parts(
    step: int, world: int, holdings: Mapping[int, Holdings]
) -> tuple[tuple[RankPart, ...], tuple[int, ...]]:
    """Where each rank's per-rank part of ``step`` comes from, and which ranks lack it. Pure.

    A rank's part is its own: from itself, else from a buddy's copy; never another rank's.
    When both were lost at ``step`` (a node lost after the commit, before the copy reached the
    buddy) the newest older copy serves and the rank is named inexact. After a resize the
    parts belong to another numbering and none is used.
    """
    if step < 0 or not any(h.ranked or h.rank_replicas for h in holdings.values()):
        return (), ()
    if {h.rank_world for h in holdings.values() if h.rank_world} != {world}:
        return (), ()
    parts, inexact = [], []
    for rank in range(world):
        offers = [(s, rank) for s in holdings.get(rank, Holdings(rank)).ranked]
        offers += [
            (s, q) for q, h in sorted(holdings.items()) if q != rank for s in h.rank_replicas.get(rank, ())
        ]
        exact = [o for o in offers if o[0] == step]
        older = [o for o in offers if o[0] < step]
        if exact:
            pick = min(exact, key=lambda o: (o[1] != rank, o[1]))
        elif older:
            pick = max(older, key=lambda o: (o[0], o[1] == rank, -o[1]))
            inexact.append(rank)
        else:
            inexact.append(rank)
            continue
        parts.append(RankPart(rank, pick[1], pick[0]))
    return tuple(parts), tuple(inexact)


def plan_recovery(world: int, holdings: Mapping[int, Holdings], factor: int = 2) -> RecoveryPlan:
    """Pick the step to resume at and the transfers that give every rank its state. Pure.

    The newest step for which the replicated state exists somewhere and every rank's shard
    (sharded runs) exists on itself, a buddy or a twin. Ranks lacking the replicated state at
    that step (replaced, behind by one commit, or cut off inside a commit) receive it from a
    live peer; ranks lacking their shard receive it from a buddy's copy or a twin's own.
    """
    sharded = any(h.sharded for h in holdings.values())
    candidates = sorted(set().union(*(h.own for h in holdings.values())), reverse=True)
    if not candidates:
        return RecoveryPlan(-1)
    old_world = max((h.shard_world for h in holdings.values()), default=0)
    if sharded and old_world and _resized(world, holdings, old_world):
        return _plan_reshard(candidates, holdings, old_world, factor)
    missing = ""
    for step in candidates:
        transfers, lost = _transfers_at(step, world, holdings, sharded)
        if lost is None:
            return RecoveryPlan(step, tuple(transfers))
        # The buddy copy of this step may have been cut off by the fault: an older step may
        # be complete.
        missing = missing or (
            f"the state of rank {lost} at step {step} is on no live process: every "
            f"holder of its shard was lost (replication factor {factor})"
        )
    if candidates == [0]:
        # The first commit's buddy copy was cut off (a fault at step 1, while it was still on
        # its way): the commit before it is the initial state, which every rank rebuilds.
        return RecoveryPlan(-1)
    raise Unrecoverable(missing or "no committed step is held by the survivors")


def _resized(world: int, holdings: Mapping[int, Holdings], old_world: int) -> bool:
    """The shards held were made in another world, or for other ranks (renumbered survivors)."""
    return old_world != world or any(h.shard_world and h.shard_rank != r for r, h in holdings.items())


def _transfers_at(
    step: int, world: int, holdings: Mapping[int, Holdings], sharded: bool
) -> tuple[list[Transfer], int | None]:
    """The transfers that give every rank its state of ``step``, rank by rank (replicated
    first); with the first rank whose shard of ``step`` is on no live process, else None."""
    donors = sorted(r for r, h in holdings.items() if step in h.own)
    transfers: list[Transfer] = []
    for rank in range(world):
        mine = holdings.get(rank, Holdings(rank))
        if step not in mine.own:  # from several holders at once, each rank's from other ones first
            picked = [donors[(rank + i) % len(donors)] for i in range(min(MAX_STRIPES, len(donors)))]
            transfers += [Transfer(d, rank, "replicated", d, i, len(picked)) for i, d in enumerate(picked)]
        if sharded and step not in mine.shards:
            shard = _shard_transfer(step, rank, holdings)
            if shard is None:
                return transfers, rank
            transfers.append(shard)
    return transfers, None


def _shard_transfer(step: int, rank: int, holdings: Mapping[int, Holdings]) -> Transfer | None:
    """``rank``'s shard of ``step`` from the first live holder: a buddy's copy, or a twin's own
    shard; None when nobody holds it."""
    holders = sorted(
        q
        for q, h in holdings.items()
        if step in h.replicas.get(rank, ()) or (rank in h.twins and step in h.shards)
    )
    if not holders:
        return None
    holder = holders[0]
    twin = step not in holdings[holder].replicas.get(rank, ())
    return Transfer(holder, rank, "sharded", holder if twin else rank)


def _plan_reshard(
    candidates: list[int], holdings: Mapping[int, Holdings], old_world: int, factor: int
) -> RecoveryPlan:
    """The world changed since the shards were made: the newest step at which every old shard
    is held by someone (its owner or a buddy); all of them move to every rank."""
    world = len(holdings)
    for step in candidates:
        sources = []
        for owner in range(old_world):
            holders = sorted(
                r
                for r, h in holdings.items()
                if (h.shard_rank == owner and step in h.shards) or step in h.replicas.get(owner, ())
            )
            if not holders:
                break
            sources.append((owner, holders[0]))
        else:
            replicated, _ = _transfers_at(step, world, holdings, sharded=False)
            return RecoveryPlan(step, tuple(replicated), tuple(sources))
    raise Unrecoverable(
        f"resizing from {old_world} ranks: some shard is on no live process at any step held "
        f"(replication factor {factor})"
    )
