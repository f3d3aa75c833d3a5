"""Recovery, once per generation: agree on the step, move what is missing, say what to load.

Every rank gathers what every rank holds (:class:`~resilience.state.recovery_plan.Holdings`),
and all of them compute the same plan from it, so all enter the same transfers, or the same
collective tier restore, or none. Peers' memory comes first: survivors hold the newest
commit. The tiers serve when no peer holds the state (every rank process lost, a new job of
the same id), when peers cannot serve some rank's shard, or when some rank's own part of the
peers' step is lost (an older step the tiers hold whole is exact).

Functions only: what a rank keeps across generations is :class:`~resilience.agent.kept.Kept`,
passed in; a recovery keeps nothing of its own.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.distributed_c10d import _set_pg_timeout

from resilience.agent import faults
from resilience.agent.kept import Kept
from resilience.context import Context
from resilience.contract.messages import Plan, RecoveryInfo
from resilience.contract.rank_env import RankEnv
from resilience.contract.run_store import RunStore
from resilience.errors import Unrecoverable
from resilience.state import snapshot
from resilience.state.gather import all_gather_json, from_json, to_json
from resilience.state.recovery_plan import Holdings, RecoveryPlan, plan_rank_parts, plan_recovery
from resilience.state.replication import SnapshotRing
from resilience.state.transfer import (
    Apart,
    broadcast_snapshot,
    recv_apart,
    recv_striped,
    send_snapshot,
    send_state,
)
from resilience.tiers.agent import TierAgent
from resilience.tiers.restore import Restored

State = dict[str, Any]


@dataclass(frozen=True)
class Scene:
    """One generation as this rank sees it: where a recovery runs."""

    plan: Plan
    rank: int
    group: dist.ProcessGroup
    """The state group (gloo, CPU buffers): recovery traffic never meets training collectives."""
    env: RankEnv
    store: RunStore
    tiers: TierAgent | None


@dataclass(frozen=True)
class Live:
    """The previous generation's registered objects, when they hold exactly the last commit."""

    step: int
    states: State


def take_live(ctx: Context | None, cut_off: bool, kept: Kept) -> Live | None:
    """The previous generation's registered state, if it is the last clean commit.

    Data-parallel state is not copied at every commit: the registered objects of the failed
    generation hold exactly the last commit, unless the fault cut a commit off (then this rank
    gets the state from a peer). Sharded runs snapshot every commit instead, since their
    buddies may force a rollback to the commit before.
    """
    if kept.sharded or ctx is None:
        return None
    kept.own["replicated"].clear()
    if cut_off or ctx.step < 0 or not ctx.matches_commit():
        return None  # cut off inside a commit, or changed in place since: a peer's copy serves
    return Live(ctx.step, ctx.states()["replicated"])


def recover(scene: Scene, kept: Kept, live: Live | None) -> tuple[int, State | None]:
    """Collective: the step this generation resumes after, and the state to load (None: none)."""
    started, formed_t = time.perf_counter(), time.time()
    world, rank = scene.plan.world_size, scene.rank
    gathered = gather_holdings(
        kept.holdings(rank, world, live.step if live is not None else None), scene.group
    )
    recovery, tiered = _decide(scene, kept, gathered)
    moved, received = _transfer(scene, kept, recovery, live)
    if tiered is None:
        part = kept.parts.recover(recovery.rank_parts, recovery.step, rank, world, scene.group)
    else:  # the tiers' copy of this rank's part (adopted by _decide)
        part = snapshot.materialize(tiered.snaps["rank"]) if "rank" in tiered.snaps else {}
    resharded = _reshard(scene, kept, recovery) if recovery.reshard else {}
    restored: State | None
    if tiered is not None and not tiered.snaps:
        restored = dict(tiered.states)  # resharded from another world size
    else:
        restored = _restored_state(kept, recovery.step, live, received)
        if restored is not None:
            restored.update(resharded)
            restored.update(part)
    for group in (None, scene.group):
        _set_pg_timeout(timedelta(seconds=scene.env.collective_timeout_s), group)
    moved_total = all_gather_json(moved, scene.group, "bytes moved")
    if not all(type(n) is int for n in moved_total):
        raise Unrecoverable(f"bytes moved: not all ints ({moved_total!r:.200})")
    if rank == 0:
        _publish(scene, recovery, tiered, sum(moved_total) // 2, started, formed_t)
    return recovery.step, restored


def gather_holdings(mine: Holdings, group: dist.ProcessGroup) -> list[Holdings]:
    """Every rank's holdings, as JSON (:mod:`resilience.state.gather`: no pickle crosses gloo),
    each checked to be what it says: the holdings of the rank it came from."""
    gathered = []
    for rank, data in enumerate(all_gather_json(to_json(mine), group, "holdings")):
        holdings = from_json(Holdings, data, f"holdings from rank {rank}")
        if holdings.rank != rank:
            raise Unrecoverable(f"holdings from rank {rank} are rank {holdings.rank}'s")
        gathered.append(holdings)
    return gathered


def _decide(scene: Scene, kept: Kept, gathered: list[Holdings]) -> tuple[RecoveryPlan, Restored | None]:
    """The peers' recovery plan, or a restore from the tiers when they have a newer step (or
    the only exact one). Every rank decides alike, from the same gathered holdings."""
    holdings = {h.rank: h for h in gathered}
    world = scene.plan.world_size
    try:
        recovery, peer_error = plan_recovery(world, holdings, scene.env.replication_factor), None
        parts, inexact = plan_rank_parts(recovery.step, world, holdings)
        recovery = dataclasses.replace(recovery, rank_parts=parts, inexact=inexact)
    except Unrecoverable as err:
        recovery, peer_error = RecoveryPlan(-1), err
    tiered = None
    if scene.tiers is not None and (peer_error is not None or recovery.step < 0 or recovery.inexact):
        tiered = scene.tiers.restore(scene.plan, scene.group, -1 if recovery.inexact else recovery.step)
    if tiered is None:
        if peer_error is not None:
            raise peer_error
        return recovery, None
    kept.adopt(tiered, scene.rank, world)
    return RecoveryPlan(tiered.step), tiered


def _transfer(scene: Scene, kept: Kept, recovery: RecoveryPlan, live: Live | None) -> tuple[int, list[Apart]]:
    """Send and receive replicated state and shards as ``recovery`` says: the bytes moved here,
    and the state received to be loaded once. Only sharded runs keep what they receive (they may
    roll back); the others receive it apart (:class:`~resilience.state.transfer.Apart`), since
    it becomes the model's and optimizer's own tensors."""
    moved, rank, received = 0, scene.rank, []
    keeps = kept.sharded or any(t.part == "sharded" and t.dst == rank for t in recovery.transfers)
    midway = faults.transfer_hook(
        scene.env.injections, scene.store, rank, scene.plan.world_size, recovery.step
    )
    for t in recovery.transfers:
        if t.src == rank:
            ring = kept.own[t.part] if t.owner == rank else kept.replicas[t.owner]
            snap, stripe = ring.get(recovery.step), (t.stripe, t.stripes)
            if snap is not None:
                moved += send_snapshot(snap, t.dst, scene.group, midway, stripe=stripe)
            else:  # straight from the previous generation's objects: no copy first
                assert live is not None, "the plan names a source only for what it said it holds"
                skeleton, tensors, sizes = snapshot.describe(live.states)
                moved += send_state(
                    recovery.step, skeleton, tensors, sizes, t.dst, scene.group, midway, stripe=stripe
                )
        elif t.dst == rank and t.stripe == 0:  # every stripe at once
            sources = recovery.stripes_to(rank) if t.part == "replicated" else [t.src]
            if not keeps:
                received.append(recv_apart(sources, scene.group))
                moved += received[-1].nbytes
                continue
            snap = recv_striped(sources, scene.group)
            moved += snap.nbytes
            kept.own[t.part].put(snap)
            if t.part == "sharded":
                kept.shards_made(scene.plan.world_size, rank)
    for ring in kept.own.values():
        ring.drop_after(recovery.step)
    return moved, received


def _reshard(scene: Scene, kept: Kept, recovery: RecoveryPlan) -> State:
    """The world changed since the shards were made: every old shard is broadcast by a
    holder, each rank rebuilds its own from all of them (``ShardedOptimizer`` takes
    ``{"shards": [...]}``). Every rank keeps them all as replicas until its first commit in
    this world, so a fault before then reshards again."""
    kept.sharded = True  # a rank that just joined has held no shard yet
    shards: dict[int, snapshot.Snapshot] = {}
    for owner, holder in recovery.reshard:
        mine = None
        if holder == scene.rank:
            own = kept.own["sharded"].get(recovery.step) if kept.shard_rank == owner else None
            mine = own if own is not None else kept.replicas[owner].get(recovery.step)
        shards[owner] = broadcast_snapshot(mine, holder, scene.group)
    kept.own["sharded"].clear()
    kept.replicas.clear()
    for owner, snap in shards.items():
        kept.replicas.setdefault(owner, SnapshotRing()).put(snap)
    kept.shard_rank = -1
    states = [snapshot.materialize(shards[o], copy=True) for o in sorted(shards)]
    return {name: {"shards": [s[name] for s in states]} for name in states[0]}


def _restored_state(kept: Kept, step: int, live: Live | None, received: list[Apart]) -> State | None:
    if step < 0:
        return None
    if live is not None and live.step == step and kept.own["replicated"].get(step) is None and not received:
        return dict(live.states)  # the old objects' own state dicts: no copy at all
    restored: State = {}
    for apart in received:
        restored.update(apart.states())
    for ring in kept.own.values():
        snap = ring.get(step)
        if snap is not None:
            # Copied, each tensor into an allocation of its own: a kept snapshot (sharded runs:
            # rollback) must not change with training, and a view of a snapshot's buffer (the
            # tiers' restores; a file's mapping) would keep the whole buffer alive in the model
            # or optimizer that loads it, and torch.save would write it whole (1.33x the
            # fault-free size for a model and AdamW, tests/tiers/test_restore.py).
            restored.update(snapshot.materialize(snap, copy=True))
    if not kept.sharded:
        kept.own["replicated"].clear()
    return restored


def _publish(
    scene: Scene,
    recovery: RecoveryPlan,
    tiered: Restored | None,
    peer_bytes: int,
    started: float,
    formed_t: float,
) -> None:
    """Rank 0 tells the supervisor how the generation recovered (its ``recovered`` event)."""
    inexact = tiered.inexact if tiered is not None else recovery.inexact
    if inexact:
        scene.store.events.push(
            "inexact",
            step=recovery.step,
            ranks=list(inexact),
            why="their random streams and data positions of that step were lost",
        )
    scene.store.progress.publish_recovery(
        scene.plan.generation,
        RecoveryInfo(
            step=recovery.step,
            source=tiered.source if tiered is not None else ("peer" if recovery.transfers else "self"),
            bytes=tiered.bytes_moved if tiered is not None else peer_bytes,
            recover_s=time.perf_counter() - started,
            formed_t=formed_t,
            recovered_t=time.time(),
        ),
    )
