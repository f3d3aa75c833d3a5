"""Buddy copies received into the buffers of the oldest kept copy: two real ranks over gloo,
one round per commit. Each received copy is bitwise the sender's state of that step, the ring
always holds the newest complete copy while a round writes, and once the ring is full no round
allocates: the same two sets of buffers take turns."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from resilience.state import snapshot
from resilience.state.replication import KEEP, BuddyReplicator, SnapshotRing

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
            steps_while_writing.append(ring.steps())
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
        assert all(i - 1 in s for i, s in enumerate(steps_while_writing) if i), steps_while_writing
