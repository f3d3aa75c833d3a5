"""Restoring from the tiers: which step, which tier serves each rank, and doing it.

Used when the peers' memory cannot serve (every rank process was lost, a new job of the same
id started, every holder of a shard was lost): each rank lists what its node holds (own RAM
tier, neighbour copies) and the persistent tier; :func:`plan_restore` (pure) picks the newest
step that every rank can get, each rank from the cheapest tier that has it (own RAM, then a
neighbour's copy, then the persistent directory). Every load verifies the checksums; a rank
whose copy fails reports it, every rank marks that copy bad and the plan is made again: the
next tier (or an older step) serves, and the events log says why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist

from resilience.errors import Unrecoverable
from resilience.tiers import manifest as mf
from resilience.state import snapshot
from resilience.state.gather import all_gather_json, from_json, to_json
from resilience.state.snapshot import Snapshot
from resilience.tiers import registry
from resilience.tiers.base import SHARED_HOLDER, Offer, Where
from resilience.tiers.layout import NodeKey, TierConfig
from resilience.tiers.transport import recv_checkpoint, send_checkpoint

__all__ = ["Offer", "Restored", "Restorer", "TierPlan", "list_offers", "plan_restore"]


@dataclass(frozen=True)
class Source:
    owner: int
    """The rank that loads this copy."""
    tier: str
    holder: int
    of: int
    """Whose copy it is: ``owner``'s own, or (replicated state only) another rank's of the same step."""


@dataclass(frozen=True)
class TierPlan:
    step: int
    world_size: int
    """World size of the checkpoint; differs from the run's when resharding."""
    sources: tuple[Source, ...]

    def tier_of(self, owner: int) -> str:
        return next(s.tier for s in self.sources if s.owner == owner)


def plan_restore(
    world: int, offers: Iterable[Offer], after_step: int, bad: frozenset[tuple[str, int, int]] = frozenset()
) -> TierPlan | None:
    """The newest step after ``after_step`` that every rank can restore, and from where. Pure.

    Each rank's copy comes from the cheapest tier that has it (own RAM, neighbour,
    persistent), preferring a copy on its own process's node (``holder == owner``).
    ``bad`` holds (tier, owner, step) copies that failed verification. A rank with no copy of
    its own at a step may take another rank's, where that copy holds no shard (its replicated
    state is the same on every rank): one corrupt or missing copy then costs no steps. A copy
    that also holds its owner's per-rank part (random streams, loader positions) serves another
    rank only when no step can be restored otherwise (that rank is then not exact). A
    checkpoint written by another world size is used only from the persistent tier and only
    with all its ranks (resharding), and only when no same-size checkpoint is as new.
    """
    usable = [o for o in offers if (o.tier, o.owner, o.step) not in bad and o.step > after_step]
    exact = _newest(world, usable, lambda o: o.interchangeable and not o.per_rank)
    return exact if exact is not None else _newest(world, usable, lambda o: o.interchangeable)


def _newest(world: int, usable: list[Offer], lendable: Callable[[Offer], bool]) -> TierPlan | None:
    for step in sorted({o.step for o in usable}, reverse=True):
        for generation in sorted({o.generation for o in usable if o.step == step}, reverse=True):
            plan = _at(world, [o for o in usable if o.step == step and o.generation == generation], lendable)
            if plan is not None:
                return plan
    return None


def _at(world: int, copies: list[Offer], lendable: Callable[[Offer], bool]) -> TierPlan | None:
    """A plan from ``copies``: one step's, written by one generation (a step rewritten by a later
    generation, or written late by a rank cut off from it, is never mixed with another's)."""
    step = copies[0].step
    here = [o for o in copies if o.world_size == world]
    sources = []
    for owner in range(world):
        mine = [o for o in here if o.owner == owner] or [o for o in here if lendable(o)]
        if not mine:
            break
        best = min(mine, key=lambda o: (registry.cost(o.tier), o.holder != owner, o.holder, o.owner))
        sources.append(Source(owner, best.tier, best.holder, best.owner))
    else:
        return TierPlan(step, world, tuple(sources))
    for other in sorted({o.world_size for o in copies if o.world_size != world}):
        for shared in (t.name for t in registry.TIERS if t.shared):
            owners = {o.owner for o in copies if o.world_size == other and o.tier == shared}
            if owners == set(range(other)):
                return TierPlan(step, other, tuple(Source(r, shared, SHARED_HOLDER, r) for r in range(other)))
    return None


# --- listing ---------------------------------------------------------------------------------------


def list_offers(
    config: TierConfig,
    rank: int,
    node: NodeKey,
    include_shared: bool,
    report: Callable[[str, int, int, str], None],
    ram_base: Path | None = None,
) -> list[Offer]:
    """What this process can offer: every tier's valid copies of this job on its node, and
    (``include_shared``: one rank lists them for all) the complete shared-tier checkpoints.
    ``report(tier, owner, step, why)`` is called for every copy refused."""
    where = Where(config, node, ram_base)
    return [
        offer
        for tier in registry.TIERS
        if include_shared or not tier.shared
        for offer in tier.offers(where, rank, report)
    ]


# --- executing (collective over the state group) -----------------------------------------------------


@dataclass
class Restored:
    step: int
    tiers: dict[int, str]
    states: dict[str, Any]
    """name -> state to load (``ctx.register``), resharded from another world size; empty
    otherwise, where ``snaps`` hold it."""
    snaps: dict[str, Snapshot]
    """kind -> snapshot of this rank (empty when resharded)."""
    seconds: float
    bytes_moved: int
    borrowed: dict[int, int] = field(default_factory=dict)
    """rank -> the rank whose copy of the replicated state it loaded (its own was unusable)."""
    inexact: tuple[int, ...] = ()
    """Borrowers whose own per-rank part (random streams, loader positions) was in no usable copy."""

    @property
    def source(self) -> str:
        """The most expensive tier that served some rank."""
        return max(self.tiers.values(), key=registry.cost, default=registry.NAMES[0])


@dataclass(frozen=True)
class Failure:
    """A copy a rank could not restore, as every rank hears of it (JSON, :mod:`resilience.state.gather`)."""

    tier: str
    owner: int
    step: int
    why: str


class Restorer:
    """Runs a restore on every rank of a generation, falling back tier by tier."""

    def __init__(
        self,
        config: TierConfig,
        rank: int,
        world: int,
        node: NodeKey,
        group: dist.ProcessGroup | None,
        emit: Callable[..., None],
        ram_base: Path | None = None,
    ) -> None:
        self.config, self.rank, self.world, self.node, self.group = config, rank, world, node, group
        self.emit, self.ram_base = emit, ram_base
        self.where = Where(config, node, ram_base)
        self._reported: set[tuple[str, int, int]] = set()

    def _report(self, tier: str, owner: int, step: int, why: str) -> None:
        if (tier, owner, step) not in self._reported:
            self._reported.add((tier, owner, step))
            self.emit("checkpoint-invalid", tier=tier, owner=owner, step=step, reason=why, rank=self.rank)

    def gather_offers(self) -> list[Offer]:
        mine = list_offers(self.config, self.rank, self.node, self.rank == 0, self._report, self.ram_base)
        gathered = all_gather_json([to_json(o) for o in mine], self.group, "tier offers")
        offers = []
        for rank, part in enumerate(gathered):
            if type(part) is not list:
                raise Unrecoverable(f"tier offers from rank {rank}: not a list ({part!r:.200})")
            offers += [from_json(Offer, o, f"a tier offer from rank {rank}") for o in part]
        return offers

    def restore(self, offers: list[Offer], after_step: int) -> Restored | None:
        """The newest restorable step after ``after_step``, loaded; None when the tiers have
        nothing newer. Every rank calls it with the same offers."""
        started = time.perf_counter()
        bad: set[tuple[str, int, int]] = set()
        moved = 0
        while True:
            plan = plan_restore(self.world, offers, after_step, frozenset(bad))
            if plan is None:
                return None
            error, result, n = self._execute(plan)
            moved += n
            gathered = all_gather_json(to_json(error) if error else None, self.group, "tier restore failures")
            failed = [
                from_json(Failure, item, f"a tier restore failure from rank {rank}")
                for rank, item in enumerate(gathered)
                if item is not None
            ]
            if not failed:
                states, snaps = result
                per_rank = {(o.tier, o.holder, o.owner, o.step) for o in offers if o.per_rank}
                return Restored(
                    plan.step,
                    {s.owner: s.tier for s in plan.sources},
                    states,
                    snaps,
                    time.perf_counter() - started,
                    moved,
                    {s.owner: s.of for s in plan.sources if s.of != s.owner},
                    tuple(
                        s.owner
                        for s in plan.sources
                        if s.of != s.owner and (s.tier, s.holder, s.of, plan.step) in per_rank
                    ),
                )
            for f in failed:
                bad.add((f.tier, f.owner, f.step))
                if error is not None and (error.tier, error.owner, error.step) == (f.tier, f.owner, f.step):
                    self._report(f.tier, f.owner, f.step, f.why)

    def _execute(self, plan: TierPlan) -> tuple[Failure | None, Any, int]:
        """This rank's part of ``plan``: serve transfers, load its own copy, verify it."""
        if plan.world_size != self.world:
            return self._reshard(plan)
        moved = 0
        error = None
        loaded: dict[str, Snapshot] = {}
        for src in plan.sources:
            local = registry.tier(src.tier).shared or src.holder == src.owner
            kinds = ("replicated",) if src.of != src.owner else None  # never another rank's own part
            if local and src.owner == self.rank:
                try:
                    loaded = self._load(src.tier, plan.step, src.of, kinds=kinds)
                except mf.CheckpointInvalid as err:
                    error = Failure(src.tier, src.of, plan.step, str(err))
            elif not local and src.holder == self.rank:
                moved += send_checkpoint(
                    registry.tier(src.tier).path(self.where, plan.step, src.of), src.owner, self.group
                )
            elif not local and src.owner == self.rank:
                # The copy lands in this node's own (cheapest) tier: restored there too.
                here = registry.TIERS[0]
                try:
                    moved += recv_checkpoint(here.path(self.where, plan.step, src.of), src.holder, self.group)
                    loaded = self._load(here.name, plan.step, src.of, tier_name=src.tier, kinds=kinds)
                except mf.CheckpointInvalid as err:
                    error = Failure(src.tier, src.of, plan.step, str(err))
        if error is not None:
            return error, None, moved
        return None, ({}, loaded), moved  # the snapshots are the state (the recovery copies it out)

    def _load(
        self,
        tier: str,
        step: int,
        owner: int,
        world: int | None = None,
        tier_name: str | None = None,
        kinds: tuple[str, ...] | None = None,
    ) -> dict[str, Snapshot]:
        try:
            return registry.tier(tier).read(self.where, step, owner, world or self.world, kinds)
        except mf.CheckpointInvalid as err:
            if tier_name is None:
                raise
            # received from another tier's holder: name the tier that served it
            raise mf.CheckpointInvalid(
                f"{tier_name} tier: {str(err).removeprefix(f'{tier} tier: ')}"
            ) from None

    def _reshard(self, plan: TierPlan) -> tuple[Failure | None, Any, int]:
        """Another world size: read every shard of the (shared-tier) checkpoint."""
        shards: list[dict[str, Any]] = []
        replicated: dict[str, Any] = {}
        for owner in range(plan.world_size):
            try:  # replicated state is the same on every rank: read rank 0's only
                snaps = self._load(
                    plan.tier_of(owner),
                    plan.step,
                    owner,
                    world=plan.world_size,
                    kinds=("replicated", "sharded") if owner == 0 else ("sharded",),
                )
            except mf.CheckpointInvalid as err:
                return Failure(plan.tier_of(owner), owner, plan.step, str(err)), None, 0
            if owner == 0 and "replicated" in snaps:
                replicated = snapshot.materialize(snaps["replicated"], copy=False)
            shards.append(snapshot.materialize(snaps["sharded"], copy=False) if "sharded" in snaps else {})
        states = dict(replicated)
        for name in shards[0]:  # each object reshards itself (ShardedOptimizer, FSDP2 adapters)
            states[name] = {"shards": [s[name] for s in shards]}
        return None, (states, {}), 0
