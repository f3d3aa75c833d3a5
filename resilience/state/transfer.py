"""State moved between ranks over a (gloo) process group: one snapshot streamed to a peer, or
broadcast to the group; every receiver verifies the checksum the sender computed.

A stream is its metadata (step, skeleton, layout, checksum) then each tensor in chunks of at
most ``CHUNK_BYTES``, so that live tensors go out without a copy into a snapshot first and no
single message holds a socket (and the cores that copy through it) for long. The metadata is a
JSON header and the skeleton's bytes, as they are: reading it runs nothing. A ``tag`` keeps two
streams between the same ranks apart (two background rounds sharing the state group).

:func:`exchange` is a buddy round: one snapshot to several ranks and one from each of several,
all in flight at once and paced (:mod:`resilience.state.pacing`).
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from resilience.errors import Unrecoverable
from resilience.state import prefault
from resilience.state import skeleton as skel
from resilience.state.pacing import Pace
from resilience.state.snapshot import RunningChecksum, Snapshot, checksum, empty_like_layout, layout

CHUNK_BYTES = 4 << 20
"""Largest message of a stream. Sender and receiver cut the same tensors alike."""

Stripe = tuple[int, int]
"""``(i, k)``: the i-th of k holders' share of one stream (every k-th piece from the i-th)."""


def _pieces(tensors: list[torch.Tensor]) -> Iterator[torch.Tensor]:
    """Each tensor flat, in views of at most ``CHUNK_BYTES`` (an empty tensor is one empty piece)."""
    for t in tensors:
        flat = t.detach().contiguous().reshape(-1)
        yield from flat.split(max(1, CHUNK_BYTES // flat.element_size()))


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
    stripe: Stripe = (0, 1),
) -> int:
    return send_state(snap.step, snap.skeleton, snap.regions(), layout(snap), dst, group, midway, tag, stripe)


def send_state(
    step: int,
    skeleton: bytes,
    tensors: list[torch.Tensor],
    sizes: dict[str, int],
    dst: int,
    group: dist.ProcessGroup | None = None,
    midway: Callable[[], None] | None = None,
    tag: int = 0,
    stripe: Stripe = (0, 1),
) -> int:
    """Stream state to ``dst``: metadata, then the tensors in pieces. The tensors may be live
    ones (no copy into a snapshot first); the caller must not change them until this returns.
    ``midway`` runs when the metadata and half the pieces are out (where faults are injected).
    ``tag`` keeps two streams between the same ranks apart (two background rounds at once).
    ``stripe`` ``(i, k)``: only every k-th piece from the i-th, the metadata with stripe 0 only
    (:func:`recv_striped` takes the k stripes from k holders of the same state at once)."""
    return _stream(step, skeleton, tensors, sizes, (dst,), group, tag, midway, stripe=stripe)


def exchange(
    snap: Snapshot,
    targets: Sequence[int],
    sources: Sequence[int],
    group: dist.ProcessGroup,
    deliver: Callable[[int, Snapshot], None],
    tag: int = 0,
    reuse: Callable[[int], Snapshot | None] = lambda src: None,
    midway: Callable[[], None] | None = None,
    pace: Callable[[int], Pace] | None = None,
) -> int:
    """``snap`` to every rank in ``targets``, and each of ``sources``' snapshots, checksum
    verified, to ``deliver(src, copy)`` as soon as it is whole; returns the bytes sent.

    Sends and receives run side by side (the receives on a thread of their own), so a round
    takes one transfer's time at any world size, where blocking pairs (ordered so that no two
    ranks wait on each other) chain around the ring of buddies, one transfer per rank in turn.
    And a copy received is kept at once, however long this rank's own (paced) sends take. ``reuse(src)``
    lends the buffers ``src``'s copy is received into; ``pace(total_bytes)`` spreads the sends;
    ``midway`` runs when half the pieces are out.
    """
    failed: list[BaseException] = []

    def receive() -> None:
        try:
            for src in sources:
                deliver(src, recv_snapshot(src, group, tag, reuse(src)))
        except BaseException as err:  # noqa: BLE001 - raised by the caller's thread below
            failed.append(err)

    receiver = threading.Thread(target=receive, name="sres-receive", daemon=True)
    receiver.start()
    try:
        regions = snap.regions()
        sent = _stream(snap.step, snap.skeleton, regions, layout(snap), targets, group, tag, midway, pace)
    finally:
        receiver.join()  # a round stuck on a peer is left behind by the agent (``_join``), as before
    if failed:
        raise failed[0]
    return sent


def _stream(
    step: int,
    skeleton: bytes,
    tensors: list[torch.Tensor],
    sizes: dict[str, int],
    targets: Sequence[int],
    group: dist.ProcessGroup | None,
    tag: int,
    midway: Callable[[], None] | None,
    pace: Callable[[int], Pace] | None = None,
    stripe: Stripe = (0, 1),
) -> int:
    """One stream to each of ``targets`` at once: each piece goes to all of them before the next."""
    if not targets:
        return 0
    index, stripes = stripe
    meta = _meta(step, skeleton, sizes, checksum(skeleton, tensors)) if index == 0 else b""
    for head in _head(meta) if meta else ():
        for work in [dist.isend(head, dst, group=group, tag=tag) for dst in targets]:
            work.wait()
    pieces = list(_pieces(tensors))[index::stripes]
    total = sum(p.numel() * p.element_size() for p in pieces)
    paced = pace(total) if pace is not None else None
    for i, piece in enumerate(pieces):
        if midway is not None and i == len(pieces) // 2:
            midway()
        for work in [dist.isend(piece, dst, group=group, tag=tag) for dst in targets]:
            work.wait()
        if paced is not None:
            paced.sent(piece.numel() * piece.element_size())
    return len(targets) * (len(meta) + total)


def _head(meta: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """The two messages that open a stream: the metadata's length, then the metadata."""
    return torch.tensor([len(meta)], dtype=torch.int64), torch.frombuffer(bytearray(meta), dtype=torch.uint8)


def _recv_meta(src: int, group: dist.ProcessGroup | None, tag: int) -> tuple[int, bytes, dict[str, int], str]:
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src, group=group, tag=tag)
    meta = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.recv(meta, src, group=group, tag=tag)
    return _unmeta(meta.numpy().tobytes())


def broadcast_snapshot(snap: Snapshot | None, src: int, group: dist.ProcessGroup | None = None) -> Snapshot:
    """``src``'s snapshot on every rank of ``group`` (``snap`` is given on ``src`` only),
    checksum verified."""
    regions = snap.regions() if snap is not None else []  # a receiver's, once it knows the layout
    if snap is not None:
        size, buf = _head(_meta(snap.step, snap.skeleton, layout(snap), checksum(snap.skeleton, regions)))
    else:
        size = torch.empty(1, dtype=torch.int64)
    dist.broadcast(size, src, group=group)
    if snap is None:
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
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


def recv_striped(sources: Sequence[int], group: dist.ProcessGroup | None = None, tag: int = 0) -> Snapshot:
    """One stream whose stripe i comes from ``sources[i]`` (:func:`send_state`'s ``stripe``), the
    holders sending side by side; checksum verified."""
    return _receive(sources, group, tag, None)


def recv_snapshot(
    src: int, group: dist.ProcessGroup | None = None, tag: int = 0, reuse: Snapshot | None = None
) -> Snapshot:
    """``src``'s snapshot, checksum verified; received into ``reuse``'s buffers where they fit
    (the caller gives up ``reuse``: it is overwritten)."""
    return _receive((src,), group, tag, reuse)


@dataclass
class Apart:
    """State received to be loaded once, each tensor in an allocation of its own.

    A snapshot packs every tensor of a dtype into one buffer, which suits what is kept and sent
    again. State that is loaded and then trained on must not be views of such a buffer: a model
    parameter or an optimizer moment that is a view keeps the whole buffer alive, and
    ``torch.save`` of a state dict then writes the whole buffer for it (torch saves storages
    whole): 3x the model for a model and AdamW. Received apart, the restored tensors can become
    the model's own without a copy (:mod:`resilience.state.adopt`).
    """

    step: int
    skeleton: bytes
    tensors: list[torch.Tensor]

    @property
    def nbytes(self) -> int:
        return len(self.skeleton) + sum(t.numel() * t.element_size() for t in self.tensors)

    def states(self) -> dict[str, Any]:
        """name -> state dict, holding the received tensors themselves (use once)."""
        tree, refs = skel.loads(self.skeleton)
        return skel.fill(tree, [t.view(r.shape) for t, r in zip(self.tensors, refs)])


def recv_apart(sources: Sequence[int], group: dist.ProcessGroup | None = None, tag: int = 0) -> Apart:
    """:func:`recv_striped`, into one allocation per tensor (:class:`Apart`)."""
    step, skeleton, sizes, expected = _recv_meta(sources[0], group, tag)
    refs = skel.loads(skeleton)[1]
    counts = {k: sum(math.prod(r.shape) for r in refs if r.dtype == k) for k in sizes}
    if counts != sizes or any(r.dtype not in sizes for r in refs):
        raise Unrecoverable(f"state from rank {sources[0]} for step {step}: its layout and skeleton disagree")
    tensors = [torch.empty(math.prod(r.shape), dtype=skel.dtype_named(r.dtype)) for r in refs]
    _fill(sources, group, tag, step, skeleton, expected, tensors, fresh=tensors)
    return Apart(step, skeleton, tensors)


def _receive(
    sources: Sequence[int], group: dist.ProcessGroup | None, tag: int, reuse: Snapshot | None
) -> Snapshot:
    step, skeleton, sizes, expected = _recv_meta(sources[0], group, tag)
    snap = empty_like_layout(step, skeleton, sizes, reuse)
    lent = reuse.buffers.values() if reuse is not None else ()
    fresh = [b for b in snap.buffers.values() if all(b is not r for r in lent)]
    _fill(sources, group, tag, step, skeleton, expected, snap.regions(), fresh)
    return snap


def _fill(
    sources: Sequence[int],
    group: dist.ProcessGroup | None,
    tag: int,
    step: int,
    skeleton: bytes,
    expected: str,
    regions: list[torch.Tensor],
    fresh: Sequence[torch.Tensor],
) -> None:
    """Every piece posted at once (piece i from ``sources[i % k]``); while they land, a thread maps
    ``fresh`` memory's pages ahead of them and this one hashes each piece as it is in."""
    filling = prefault.ahead(fresh)
    pieces = list(_pieces(regions))
    works = [dist.irecv(p, sources[i % len(sources)], group=group, tag=tag) for i, p in enumerate(pieces)]
    running = RunningChecksum(skeleton)
    for work, piece in zip(works, pieces):
        work.wait()
        running.update(piece)
    filling.join()
    if running.value() != expected:
        who = f"rank {sources[0]}" if len(sources) == 1 else f"ranks {list(sources)}"
        raise Unrecoverable(f"state received from {who} for step {step} fails its checksum")
