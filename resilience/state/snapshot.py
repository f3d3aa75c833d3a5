"""Committed training state as flat, reusable CPU buffers.

A snapshot is what a rank keeps of each commit: the state dicts of every registered object,
with tensors packed into one contiguous buffer per dtype and everything else (structure,
Python values, step counters) written as a small data-only skeleton
(:mod:`resilience.state.skeleton`). Flat buffers make a snapshot
cheap to keep (one allocation, reused at every commit), to send to a peer (one message per
dtype) and to checksum.

The checksum of every transfer and checkpoint file is here: xxHash3 over the skeleton and every
tensor's bytes, in order (manifests written with the older sum are still read, by ``matches``);
SHA-256 digests are for comparing runs (the tests' and the demo's bitwise checks).
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import xxhash

from resilience.state import skeleton as skel


@dataclass
class Snapshot:
    """State of one rank at one committed step."""

    step: int
    skeleton: bytes
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return len(self.skeleton) + sum(b.numel() * b.element_size() for b in self.buffers.values())

    def regions(self) -> list[torch.Tensor]:
        """One flat view per tensor, in the order the skeleton refers to them."""
        return _regions(self.buffers, skel.loads(self.skeleton)[1])

    def checksum(self) -> str:
        return checksum(self.skeleton, self.regions())

    def digest(self) -> str:
        """SHA-256 of the state: used by tests and the demo to compare runs bitwise."""
        h = hashlib.sha256(self.skeleton)
        for name in sorted(self.buffers):
            h.update(name.encode())
            h.update(as_bytes(self.buffers[name]))
        return h.hexdigest()


def describe(states: Mapping[str, Any]) -> tuple[bytes, list[torch.Tensor], dict[str, int]]:
    """The skeleton, tensors (in buffer order) and per-dtype sizes of ``states``, without
    copying anything: what a sender needs to stream live state to a peer."""
    tensors: list[torch.Tensor] = []
    skeleton, _, sizes = skel.dumps(dict(states), tensors)
    return skeleton, tensors, sizes


def capture(
    states: Mapping[str, Any],
    step: int,
    reuse: Snapshot | None = None,
    midway: Callable[[int], None] | None = None,
) -> Snapshot:
    """Copy ``states`` (name -> state dict or plain value) into a snapshot.

    ``reuse`` lends its buffers when their sizes match, so that steady-state commits
    allocate nothing. ``midway(step)`` runs half-way through the copy (fault injection).
    """
    tensors: list[torch.Tensor] = []
    skeleton, refs, sizes = skel.dumps(dict(states), tensors)  # the places at hand: no parse back
    buffers: dict[str, torch.Tensor] = {}
    for key, size in sizes.items():
        old = reuse.buffers.get(key) if reuse is not None else None
        buffers[key] = (
            old if old is not None and old.numel() == size else torch.empty(size, dtype=skel.dtype_named(key))
        )
    half = len(tensors) // 2
    for i, (t, region) in enumerate(zip(tensors, _regions(buffers, refs))):
        if i == half and midway is not None:
            midway(step)
        region.copy_(t.detach().reshape(-1))
    return Snapshot(step=step, skeleton=skeleton, buffers=buffers)


def _regions(buffers: Mapping[str, torch.Tensor], refs: list[skel.TensorRef]) -> list[torch.Tensor]:
    return [buffers[r.dtype].narrow(0, r.offset, math.prod(r.shape)) for r in refs]


CHECKSUM_KIND = "xxh3"


def checksum(skeleton: bytes, tensors: list[torch.Tensor]) -> str:
    """xxHash3 (64-bit, ``xxhash``) of the skeleton and of every tensor's bytes, in order.

    Any changed, swapped, zeroed or shifted byte changes it. Streaming is independent of
    how the bytes are cut into tensors, so a sender of live tensors and a receiver holding
    flat per-dtype buffers agree. ``Snapshot.digest`` (SHA-256) stays the comparison of runs.
    """
    return f"{CHECKSUM_KIND}:{_stream(xxhash.xxh3_64(skeleton), tensors).hexdigest()}"


class RunningChecksum:
    """:func:`checksum` fed one piece at a time, in order: the same value, since the stream does
    not see where the bytes were cut. A receiver hashes each piece as it lands, beside the rest."""

    def __init__(self, skeleton: bytes) -> None:
        self._hash = xxhash.xxh3_64(skeleton)

    def update(self, tensor: torch.Tensor) -> None:
        _stream(self._hash, [tensor])

    def value(self) -> str:
        return f"{CHECKSUM_KIND}:{self._hash.hexdigest()}"


def fingerprint(states: Mapping[str, Any]) -> str:
    """xxHash3-128 of ``states`` read in place (no copy): a run's final state, cheap enough to
    take at the end of every run (SHA-256 of a copy, ``Snapshot.digest``, costs seconds per GiB)."""
    skeleton, tensors, _ = describe(states)
    return f"xxh3-128:{_stream(xxhash.xxh3_128(skeleton), tensors).hexdigest()}"


def _stream(h: Any, tensors: list[torch.Tensor]) -> Any:
    for t in tensors:
        if t.numel():
            h.update(as_bytes(t.detach().cpu().contiguous().reshape(-1)))
    return h


def matches(expected: str, skeleton: bytes, tensors: list[torch.Tensor]) -> bool:
    """Whether the data has checksum ``expected``, which a manifest of an older version may
    have written with :func:`sum_checksum` (no ``xxh3:`` prefix): still readable, with that
    checksum's weaker guarantee."""
    if expected.startswith(CHECKSUM_KIND + ":"):
        return checksum(skeleton, tensors) == expected
    return sum_checksum(skeleton, tensors) == expected


def sum_checksum(skeleton: bytes, tensors: list[torch.Tensor]) -> str:
    """The checksum of versions before xxHash: Adler-32 of the skeleton and a wrapping sum
    per tensor. Blind to reordering (two swapped elements sum the same): kept only to read
    manifests written with it."""
    value = zlib.adler32(skeleton)
    for t in tensors:
        flat = t.detach().contiguous().reshape(-1)
        words = flat.view(_INT_OF_SIZE.get(flat.element_size(), torch.int64))
        total = int(words.sum(dtype=words.dtype)) if words.numel() else 0
        value = zlib.adler32((total & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "little"), value)
    return f"{value:08x}"


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def materialize(snapshot: Snapshot, copy: bool = True) -> dict[str, Any]:
    """Rebuild name -> state dict.

    With ``copy`` (the default) the tensors are fresh: a snapshot that is kept (for a
    rollback) must not be changed by the optimizer that loads it. ``copy=False`` hands out
    views of the buffers, for a snapshot that is used once and dropped (saves a full copy).
    """
    tree, refs = skel.loads(snapshot.skeleton)
    tensors = [snapshot.buffers[r.dtype].narrow(0, r.offset, math.prod(r.shape)).view(r.shape) for r in refs]
    return skel.fill(tree, [t.clone() for t in tensors] if copy else tensors)


def layout(snapshot: Snapshot) -> dict[str, int]:
    """dtype -> element count: what a receiver must allocate before the buffers arrive."""
    return {k: v.numel() for k, v in snapshot.buffers.items()}


def empty_like_layout(
    step: int, skeleton: bytes, sizes: Mapping[str, int], reuse: Snapshot | None = None
) -> Snapshot:
    """A snapshot to receive into: ``reuse``'s buffers where their dtype and size match (a
    buddy's copy every commit would otherwise fault in fresh pages each time), new ones elsewhere."""
    old = reuse.buffers if reuse is not None else {}
    return Snapshot(
        step,
        skeleton,
        {
            k: old[k] if k in old and old[k].numel() == n else torch.empty(n, dtype=skel.dtype_named(k))
            for k, n in sizes.items()
        },
    )


def as_bytes(t: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes, without a copy when it is contiguous: what is hashed, and written."""
    return memoryview(t.contiguous().view(torch.uint8).numpy())
