"""Buddy copies received into the buffers of the oldest kept copy: two real ranks over gloo,
one round per commit. Each received copy is bitwise the sender's state of that step, the ring
always holds the newest complete copy while a round writes, and once the ring is full no round
allocates: the same two sets of buffers take turns."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from resilience.state import snapshot
from resilience.state.replication import KEEP, BuddyReplicator, SnapshotRing
from resilience.state.transfer import CHUNK_BYTES

ROUNDS = 8


def _state(rank: int, step: int) -> dict:
    g = torch.Generator().manual_seed(1000 * rank + step)
    return {"opt": {"m": torch.randn(4096, generator=g), "count": torch.tensor([step])}, "step": step}


def _rank(rank: int, init: str, out: dict) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    replicas: dict[int, SnapshotRing] = {}
    replicator = BuddyReplicator(dist.group.WORLD, rank, 2, 1, 2, replicas)
    pointers, steps_while_writing, digests = [], [], []
    for step in range(ROUNDS):
        replicator.start(snapshot.capture(_state(rank, step), step))
        ring = replicas.get(1 - rank)
        if ring is not None:  # while the round may be writing: the newest complete copy is kept
            steps_while_writing.append((step, ring.steps()))  # the ring comes with round 0 or 1
        replicator.wait()
        got = replicas[1 - rank].get(step)
        digests.append(got.digest() == snapshot.capture(_state(1 - rank, step), step).digest())
        pointers.append(got.buffers["float32"].data_ptr())
    out[rank] = (pointers, steps_while_writing, digests, replicas[1 - rank].steps())
    dist.destroy_process_group()


def test_buddy_copies_reuse_the_oldest_copys_buffers_and_stay_exact(tmp_path):
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(f"file://{tmp_path / 'store'}", out), nprocs=2, join=True)
    for rank in (0, 1):
        pointers, steps_while_writing, digests, steps = out[rank]
        assert all(digests), digests
        assert steps == (ROUNDS - 2, ROUNDS - 1)
        assert len(set(pointers[KEEP:])) == KEEP and set(pointers[KEEP:]) <= set(pointers[:KEEP])
        # round i writes into step i - 2's buffers: step i - 1, the newest complete copy, stays
        assert all(step - 1 in s for step, s in steps_while_writing if step), steps_while_writing


RING = 4
BIG = CHUNK_BYTES + 1000
"""float32 elements of a tensor: 4 MiB and 4 KB, so it leaves in five chunks."""
BUDGET_S = 0.6


def _big(rank: int, step: int) -> dict:
    return {"opt": {"m": torch.randn(BIG, generator=torch.Generator().manual_seed(rank * 10 + step))}}


def _ring_rank(rank: int, init: str, out: dict) -> None:
    """Every rank sends to the next and receives from the one before, all in one round, once at
    full speed and once paced over ``BUDGET_S``."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=RING)
    replicas: dict[int, SnapshotRing] = {}
    replicator = BuddyReplicator(dist.group.WORLD, rank, RING, 1, 2, replicas)
    before = (rank - 1) % RING
    results = []
    for step, budget in ((0, 0.0), (1, BUDGET_S)):
        state = _big(rank, step)
        dist.barrier()
        started = time.monotonic()
        replicator.start(snapshot.capture(state, step), budget)
        replicator.wait()
        took = time.monotonic() - started
        exact = replicas[before].get(step).digest() == snapshot.capture(_big(before, step), step).digest()
        results.append((exact, took))
    out[rank] = (results, sorted(replicas))
    dist.destroy_process_group()


def test_a_round_around_a_ring_moves_chunked_state_exactly_and_paces_its_sends(tmp_path):
    """Four ranks, each the buddy of the one before: every copy arrives whole though it leaves in
    chunks, and a round given a budget spreads its sends over it (asserted as a lower bound, which
    a loaded machine cannot break)."""
    out = mp.Manager().dict()
    mp.spawn(_ring_rank, args=(f"file://{tmp_path / 'store'}", out), nprocs=RING, join=True)
    for rank in range(RING):
        (exact_fast, _), (exact_paced, paced_s) = out[rank][0]
        assert exact_fast and exact_paced
        assert out[rank][1] == [(rank - 1) % RING]
        assert paced_s >= 0.8 * BUDGET_S, out[rank]
