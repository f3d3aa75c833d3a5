"""Copies of a rank's state kept in other processes: the rings of recent snapshots, and the
buddy copies of sharded state.

Every rank keeps its last committed snapshots (own memory). Data-parallel (replicated)
state is the same on every rank, so any live peer can serve it. Sharded state (e.g. a
ZeRO-1 optimizer shard) exists once per rank, so each rank also sends its shard to
``factor - 1`` buddy ranks on other nodes after each commit, in the background
(:class:`BuddyReplicator`). Which step a generation resumes at, and who sends what, is
:mod:`resilience.state.recovery_plan`'s (pure); the transfers are
:mod:`resilience.state.transfer`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch.distributed as dist

# The planning moved to recovery_plan: its names stay importable from here, where the tests
# take them.
from resilience.errors import Unrecoverable as Unrecoverable
from resilience.state.recovery_plan import Holdings as Holdings
from resilience.state.recovery_plan import RankPart as RankPart
from resilience.state.recovery_plan import Transfer as Transfer
from resilience.state.recovery_plan import plan_rank_parts as plan_rank_parts
from resilience.state.recovery_plan import plan_recovery as plan_recovery
from resilience.state.pacing import Pace
from resilience.state.snapshot import Snapshot
from resilience.state.transfer import exchange

KEEP = 2
"""Snapshots of a buddy's state kept: its last complete copy and the one before."""
KEEP_OWN = 3
"""Snapshots of a rank's own state kept. A rank killed while sending its copy of commit N
leaves its newest complete copy at N - 1, while the survivors may already have committed
N + 1 (their own copy rounds of N did not involve its cut transfer, and its main thread
took part in step N + 1's collectives before waiting for that transfer). All roll back to
N - 1, so each needs its last three commits; one more step is impossible, as nobody can do
step N + 2's collectives without the dead rank."""


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


class BuddyReplicator:
    """Sends this rank's shard to its buddies after each commit, on a background thread.

    Uses its own process group, so that its traffic never interleaves with the training
    collectives of the main thread. At most one round is in flight: :meth:`start` waits for the
    previous one (the agent has waited for it already, at the end of the step after its commit:
    a round reads a snapshot, never live state, so it may run through that step's optimizer
    update), and two rounds never write the same receive buffers.
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

    def start(self, snap: Snapshot, budget_s: float = 0.0) -> None:
        """A round of ``snap``, its sends spread over ``budget_s`` (0: at once)."""
        self.wait()
        if not self.targets and not self.sources:
            return
        self._thread = threading.Thread(
            target=self._round, args=(snap, budget_s), name="sres-replicate", daemon=True
        )
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

    def _round(self, snap: Snapshot, budget_s: float) -> None:
        try:
            self.bytes_sent += exchange(
                snap,
                self.targets,
                self.sources,
                self.group,
                lambda owner, copy: self.replicas[owner].put(copy),
                self.tag,
                reuse=self._lend,
                midway=(lambda: self.sending(snap.step)) if self.sending is not None else None,
                pace=lambda total: Pace(budget_s, total),
            )
        except BaseException as err:  # noqa: BLE001 - re-raised on the main thread by wait()
            if threading.current_thread() is self._thread:  # not a round that was abandoned
                self._error = err

    def _lend(self, owner: int) -> Snapshot | None:
        """Buffers for ``owner``'s copy of this round: its oldest kept copy's once the ring is
        full. That copy leaves the ring first, so the newest complete one is always there."""
        return self.replicas.setdefault(owner, SnapshotRing()).take_oldest()
