"""Who holds whose state, how a generation agrees on the step to resume, and the transfers.

Every rank keeps its last two committed snapshots (own memory). Data-parallel (replicated)
state is the same on every rank, so any live peer can serve it. Sharded state (e.g. a
ZeRO-1 optimizer shard) exists once per rank, so each rank also sends its shard to
``factor - 1`` buddy ranks on other nodes after each commit, in the background.

At re-formation, :func:`plan_recovery` (pure) picks the newest step that every survivor
still holds and for which every replaced rank's state can be fetched; a survivor that got
one step further rolls back to it (commits are all-or-nothing across survivors). It never
picks a step for which some state is missing: that is :class:`Unrecoverable`.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from resilience.state.snapshot import Snapshot, checksum, empty_like_layout, layout
from resilience.errors import ResilienceError

KEEP = 2
"""Snapshots of a buddy's state kept: its last complete copy and the one before."""
KEEP_OWN = 3
"""Snapshots of a rank's own state kept. A rank killed while sending its copy of commit N
leaves its newest complete copy at N - 1, while the survivors may already have committed
N + 1 (their own copy rounds of N did not involve its cut transfer, and its main thread
took part in step N + 1's collectives before waiting for that transfer). All roll back to
N - 1, so each needs its last three commits; one more step is impossible, as nobody can do
step N + 2's collectives without the dead rank."""


class Unrecoverable(ResilienceError, RuntimeError):
    """Some rank's state exists on no live process: peers cannot restore it."""


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


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    part: str  # "replicated" | "sharded"
    owner: int
    """Whose snapshot ``src`` sends: the shard's owner (a buddy's copy), or ``src`` itself (a
    twin's own shard, or replicated state)."""


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


def buddies(rank: int, world: int, procs_per_node: int, factor: int, twins: int = 0) -> list[int]:
    """Ranks that hold copies of ``rank``'s shard: same local rank on the next nodes, as many
    as ``factor`` copies need beyond the rank's own and its ``twins``' (HSDP replica groups)."""
    factor -= twins
    out: list[int] = []
    for k in range(1, factor):
        b = (rank + k * procs_per_node) % world
        if b != rank and b not in out:
            out.append(b)
    return out


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
    if (
        sharded
        and old_world
        and (old_world != world or any(h.shard_world and h.shard_rank != r for r, h in holdings.items()))
    ):
        return _plan_reshard(candidates, holdings, old_world, factor)
    missing = ""
    for step in candidates:
        donors = sorted(r for r, h in holdings.items() if step in h.own)
        transfers: list[Transfer] = []
        for rank in range(world):
            mine = holdings.get(rank, Holdings(rank))
            if step not in mine.own:
                donor = donors[rank % len(donors)]  # spread the load over live peers
                transfers.append(Transfer(donor, rank, "replicated", donor))
            if sharded and step not in mine.shards:
                holders = sorted(
                    q
                    for q, h in holdings.items()
                    if step in h.replicas.get(rank, ()) or (rank in h.twins and step in h.shards)
                )
                if not holders:
                    # The buddy copy of this step may have been cut off by the fault: an older
                    # step may be complete.
                    missing = missing or (
                        f"the state of rank {rank} at step {step} is on no live process: every "
                        f"holder of its shard was lost (replication factor {factor})"
                    )
                    break
                holder = holders[0]
                twin = step not in holdings[holder].replicas.get(rank, ())
                transfers.append(Transfer(holder, rank, "sharded", holder if twin else rank))
        else:
            return RecoveryPlan(step, tuple(transfers))
    if candidates == [0]:
        # The first commit's buddy copy was cut off (a fault at step 1, while it was still on
        # its way): the commit before it is the initial state, which every rank rebuilds.
        return RecoveryPlan(-1)
    raise Unrecoverable(missing or "no committed step is held by the survivors")


def _replicated_transfers(step: int, holdings: Mapping[int, Holdings], world: int) -> list[Transfer]:
    donors = sorted(r for r, h in holdings.items() if step in h.own)
    return [
        Transfer(donors[rank % len(donors)], rank, "replicated", donors[rank % len(donors)])
        for rank in range(world)
        if step not in holdings.get(rank, Holdings(rank)).own
    ]


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
            return RecoveryPlan(step, tuple(_replicated_transfers(step, holdings, world)), tuple(sources))
    raise Unrecoverable(
        f"resizing from {old_world} ranks: some shard is on no live process at any step held "
        f"(replication factor {factor})"
    )


class SnapshotRing:
    """The last ``keep`` snapshots of one owner's state, by step."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._by_step: dict[int, Snapshot] = {}

    def put(self, snap: Snapshot) -> None:
        self._by_step[snap.step] = snap
        for step in sorted(self._by_step)[: -self.keep]:
            del self._by_step[step]

    def get(self, step: int) -> Snapshot | None:
        return self._by_step.get(step)

    def steps(self) -> tuple[int, ...]:
        return tuple(sorted(self._by_step))

    def take_oldest(self) -> Snapshot | None:
        """A buffer donor for the next capture, once the ring is full. It leaves the ring: a
        snapshot being overwritten must never be offered to a recovery."""
        if len(self._by_step) < self.keep:
            return None
        return self._by_step.pop(min(self._by_step))

    def drop_after(self, step: int) -> None:
        for s in [s for s in self._by_step if s > step]:
            del self._by_step[s]

    def clear(self) -> None:
        self._by_step.clear()


# --- transfers over a (gloo) process group -------------------------------------------------


def send_snapshot(
    snap: Snapshot,
    dst: int,
    group: dist.ProcessGroup | None = None,
    midway: Callable[[], None] | None = None,
    tag: int = 0,
) -> int:
    return send_state(snap.step, snap.skeleton, snap.regions(), layout(snap), dst, group, midway, tag)


def send_state(
    step: int,
    skeleton: bytes,
    tensors: list[torch.Tensor],
    sizes: dict[str, int],
    dst: int,
    group: dist.ProcessGroup | None = None,
    midway: Callable[[], None] | None = None,
    tag: int = 0,
) -> int:
    """Stream state to ``dst``: metadata, then one message per tensor. The tensors may be live
    ones (no copy into a snapshot first); the caller must not change them until this returns.
    ``midway`` runs when the metadata and half the tensors are out (where faults are injected).
    ``tag`` keeps two streams between the same ranks apart (two background rounds at once)."""
    meta = pickle.dumps((step, skeleton, sizes, checksum(skeleton, tensors)))
    dist.send(torch.tensor([len(meta)], dtype=torch.int64), dst, group=group, tag=tag)
    dist.send(torch.frombuffer(bytearray(meta), dtype=torch.uint8), dst, group=group, tag=tag)
    sent = len(meta)
    for i, t in enumerate(tensors):
        if midway is not None and i == len(tensors) // 2:
            midway()
        flat = t.detach().contiguous().reshape(-1)
        dist.send(flat, dst, group=group, tag=tag)
        sent += flat.numel() * flat.element_size()
    return sent


def broadcast_snapshot(snap: Snapshot | None, src: int, group: dist.ProcessGroup | None = None) -> Snapshot:
    """``src``'s snapshot on every rank of ``group`` (``snap`` is given on ``src`` only), checksum verified."""
    if snap is not None:
        meta = pickle.dumps((snap.step, snap.skeleton, layout(snap), checksum(snap.skeleton, snap.regions())))
        size = torch.tensor([len(meta)], dtype=torch.int64)
    else:
        size = torch.empty(1, dtype=torch.int64)
    dist.broadcast(size, src, group=group)
    buf = (
        torch.frombuffer(bytearray(meta), dtype=torch.uint8)
        if snap is not None
        else torch.empty(int(size.item()), dtype=torch.uint8)
    )
    dist.broadcast(buf, src, group=group)
    step, skeleton, sizes, expected = pickle.loads(buf.numpy().tobytes())
    out = snap if snap is not None else empty_like_layout(step, skeleton, sizes)
    regions = out.regions()
    for region in regions:
        dist.broadcast(region, src, group=group)
    if snap is None and checksum(skeleton, regions) != expected:
        raise Unrecoverable(f"shard broadcast by rank {src} for step {step} fails its checksum")
    return out


def recv_snapshot(src: int, group: dist.ProcessGroup | None = None, tag: int = 0) -> Snapshot:
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src, group=group, tag=tag)
    meta = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(meta, src, group=group, tag=tag)
    step, skeleton, sizes, expected = pickle.loads(meta.numpy().tobytes())
    snap = empty_like_layout(step, skeleton, sizes)
    regions = snap.regions()
    for region in regions:
        dist.recv(region, src, group=group, tag=tag)
    if checksum(skeleton, regions) != expected:
        raise Unrecoverable(f"state received from rank {src} for step {step} fails its checksum")
    return snap


class BuddyReplicator:
    """Sends this rank's shard to its buddies after each commit, on a background thread.

    Uses its own process group, so that its traffic never interleaves with the training
    collectives of the main thread. At most one round is in flight: :meth:`wait` is called
    before the next commit reuses buffers.
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        rank: int,
        world: int,
        procs_per_node: int,
        factor: int,
        replicas: dict[int, SnapshotRing],
        twins: int = 0,
        sending: Callable[[int], None] | None = None,
        tag: int = 0,
    ) -> None:
        """``sending(step)`` runs half-way through each copy sent (fault injection's hook);
        ``tag`` sets this replicator's rounds apart from another's on the same group."""
        self.group = group
        self.tag = tag
        self.sending = sending
        self.targets = buddies(rank, world, procs_per_node, factor, twins)
        self.sources = [s for s in range(world) if rank in buddies(s, world, procs_per_node, factor, twins)]
        self.replicas = replicas
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.bytes_sent = 0

    def start(self, snap: Snapshot) -> None:
        self.wait()
        if not self.targets and not self.sources:
            return
        self._thread = threading.Thread(target=self._round, args=(snap,), name="sres-replicate", daemon=True)
        self._thread.start()

    @property
    def in_flight(self) -> threading.Thread | None:
        return self._thread

    def abandon(self) -> None:
        """Forget the round in flight (the generation ended under it); it never reports back."""
        self._thread, self._error = None, None

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _round(self, snap: Snapshot) -> None:
        try:
            # Pairs are ordered by rank so that two buddies never both wait to receive first.
            peers = sorted(set(self.targets) | set(self.sources))
            me = dist.get_rank()
            midway = (lambda: self.sending(snap.step)) if self.sending is not None else None
            for peer in peers:
                sending, receiving = peer in self.targets, peer in self.sources
                if me < peer:
                    if sending:
                        self.bytes_sent += send_snapshot(snap, peer, self.group, midway, self.tag)
                    if receiving:
                        self._store(peer, recv_snapshot(peer, self.group, self.tag))
                else:
                    if receiving:
                        self._store(peer, recv_snapshot(peer, self.group, self.tag))
                    if sending:
                        self.bytes_sent += send_snapshot(snap, peer, self.group, midway, self.tag)
        except BaseException as err:  # noqa: BLE001 - re-raised on the main thread by wait()
            if threading.current_thread() is self._thread:  # not a round that was abandoned
                self._error = err

    def _store(self, owner: int, snap: Snapshot) -> None:
        self.replicas.setdefault(owner, SnapshotRing()).put(snap)
