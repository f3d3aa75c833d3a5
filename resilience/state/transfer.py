"""State moved between ranks over a (gloo) process group: one snapshot streamed to a peer, or
broadcast to the group; every receiver verifies the checksum the sender computed.

A stream is its metadata (step, skeleton, layout, checksum) then one message per tensor, so
that live tensors go out without a copy into a snapshot first. The metadata is a JSON header
and the skeleton's bytes, as they are: reading it runs nothing. A ``tag`` keeps two streams
between the same ranks apart (two background rounds sharing the state group).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import torch
import torch.distributed as dist

from resilience.errors import Unrecoverable
from resilience.state.snapshot import Snapshot, checksum, empty_like_layout, layout


def _meta(step: int, skeleton: bytes, sizes: dict[str, int], expected: str) -> bytes:
    header = json.dumps({"step": step, "sizes": sizes, "checksum": expected}).encode()
    return len(header).to_bytes(8, "little") + header + skeleton


def _unmeta(raw: bytes) -> tuple[int, bytes, dict[str, int], str]:
    """The metadata :func:`_meta` wrote; a peer's bytes that are not that raise Unrecoverable."""
    try:
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + n])
        step, sizes, expected = int(header["step"]), header["sizes"], str(header["checksum"])
        if not isinstance(sizes, dict) or not all(isinstance(v, int) for v in sizes.values()):
            raise TypeError("sizes")
    except (ValueError, KeyError, TypeError) as err:
        raise Unrecoverable(
            f"state metadata from a peer does not decode ({type(err).__name__}: {err})"
        ) from None
    return step, raw[8 + n :], {str(k): v for k, v in sizes.items()}, expected


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
    meta = _meta(step, skeleton, sizes, checksum(skeleton, tensors))
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
    """``src``'s snapshot on every rank of ``group`` (``snap`` is given on ``src`` only),
    checksum verified."""
    regions = snap.regions() if snap is not None else []  # a receiver's, once it knows the layout
    if snap is not None:
        meta = _meta(snap.step, snap.skeleton, layout(snap), checksum(snap.skeleton, regions))
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
    step, skeleton, sizes, expected = _unmeta(buf.numpy().tobytes())
    out = snap if snap is not None else empty_like_layout(step, skeleton, sizes)
    if snap is None:
        regions = out.regions()
    for region in regions:
        dist.broadcast(region, src, group=group)
    if snap is None and checksum(skeleton, regions) != expected:
        raise Unrecoverable(f"shard broadcast by rank {src} for step {step} fails its checksum")
    return out


def recv_snapshot(
    src: int, group: dist.ProcessGroup | None = None, tag: int = 0, reuse: Snapshot | None = None
) -> Snapshot:
    """``src``'s snapshot, checksum verified; received into ``reuse``'s buffers where they fit
    (the caller gives up ``reuse``: it is overwritten)."""
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src, group=group, tag=tag)
    meta = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(meta, src, group=group, tag=tag)
    step, skeleton, sizes, expected = _unmeta(meta.numpy().tobytes())
    snap = empty_like_layout(step, skeleton, sizes, reuse)
    regions = snap.regions()
    for region in regions:
        dist.recv(region, src, group=group, tag=tag)
    if checksum(skeleton, regions) != expected:
        raise Unrecoverable(f"state received from rank {src} for step {step} fails its checksum")
    return snap
