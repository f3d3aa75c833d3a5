"""Where a replacement's state transfer from a peer spends its time (issue 52, deliverable 3).

The ``recovered`` event's ``transfer_s`` at 252 MiB was 0.68-0.88 s on this machine, for one stream
of 264 MB from the one survivor over loopback gloo. This runs that stream alone, between two
processes of a gloo group, with the project's own ``send_state`` and ``recv_snapshot``, the live
state of the example MLP with AdamW (width 1024) as the survivor holds it, and splits it:

  checksum   the sender's xxh3 of the live tensors before the header goes out
  stream     the sender's pieces, from the first isend to the last one's completion
  receive    the receiver's ``recv_snapshot`` whole: allocation, the pieces, its own checksum
  wire       the same bytes as pieces into buffers allocated and touched before (no checksum):
             what loopback gloo itself costs (one holder)

One arm receives without ``resilience.state.prefault`` (pages fault in under the data, as before
it). With ``--holders 1,2``, the same stream also comes from 2 holders of the same state at once (each
every other piece, ``recv_striped``), as a replaced rank's does when several survivors hold it.

    python benchmarks/peer_transfer.py [--depths 4,20] [--repeat 5] [--chunks-mib 4,16]
                                       [--holders 1,2] [--json]

Medians over repeats (the first, torch's warm-up, is dropped), the chunk sizes interleaved.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from resilience.examples.train_mlp import build_model  # noqa: E402
from resilience.state import snapshot, transfer  # noqa: E402


def live_state(depth: int) -> dict:
    """The model and AdamW state a survivor holds after a step (optimizer moments allocated)."""
    model = build_model(1024, depth, seed=0)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict()}


def rank_main(rank: int, world: int, path: str, depth: int, repeat: int, arms: list, out: mp.Queue) -> None:
    """Rank 0 receives; ranks 1.. hold the same live state and send (stripes when several)."""
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=world)
    states = live_state(depth) if rank else None
    skeleton, tensors, sizes = snapshot.describe(states) if states is not None else (b"", [], {})
    rows = []
    for i in range(repeat + 1):
        for chunk, holders, mapped in arms:
            transfer.CHUNK_BYTES = chunk << 20
            transfer.prefault.ahead = prefault_ahead if mapped else _no_prefault
            dist.barrier()
            row: dict[str, float] = {"chunk_mib": chunk, "holders": holders, "prefault": mapped}
            if rank == 0:
                t0 = time.perf_counter()
                snap = transfer.recv_striped(list(range(1, holders + 1)))
                row["receive"] = time.perf_counter() - t0
                tensors = snap.regions()  # the wire's buffers: the same pieces, touched already
            elif rank <= holders:
                t0 = time.perf_counter()
                transfer.send_state(1, skeleton, tensors, sizes, dst=0, stripe=(rank - 1, holders))
                row["stream"] = time.perf_counter() - t0  # its checksum first: taken off below
            dist.barrier()
            if rank == 1:
                t0 = time.perf_counter()
                snapshot.checksum(skeleton, tensors)
                row["checksum"] = time.perf_counter() - t0
                row["stream"] -= row["checksum"]
            if holders == 1 and rank <= 1:
                row["wire"] = _wire(rank, tensors)
            else:
                dist.barrier()
            if i:
                rows.append(row)
    out.put((rank, rows))
    dist.destroy_process_group()


prefault_ahead = transfer.prefault.ahead


def _no_prefault(tensors: list[torch.Tensor]) -> threading.Thread:
    """The receive as before ``resilience.state.prefault``: pages fault in under the data."""
    thread = threading.Thread(target=lambda: None)
    thread.start()
    return thread


def _wire(rank: int, tensors: list[torch.Tensor]) -> float:
    """The pieces alone, into buffers received into before: gloo over loopback, nothing of ours."""
    dist.barrier()
    t0 = time.perf_counter()
    for piece in transfer._pieces(tensors):
        (dist.send if rank == 1 else dist.recv)(piece, 1 - rank)
    return time.perf_counter() - t0


def run(depth: int, repeat: int, arms: list) -> list[dict]:
    world = 1 + max(h for _, h, _ in arms)
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    path = f"/tmp/peer-transfer-{os.getpid()}-{depth}"
    procs = [
        ctx.Process(target=rank_main, args=(r, world, path, depth, repeat, arms, out)) for r in range(world)
    ]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=900) for _ in procs)
    for p in procs:
        p.join()
    if os.path.exists(path):
        os.unlink(path)
    return [{**a, **b} for a, b in zip(got[0], got[1])]  # rank 0 receives, rank 1 sends the first stripe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="4,20", help="MLP depths (4: 60 MiB, 20: 252 MiB)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chunks-mib", default="4,16", help="CHUNK_BYTES to compare (one holder), in MiB")
    parser.add_argument("--holders", default="1,2", help="holders sending stripes at once (the first chunk)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks_mib.split(",")]
    arms = [(c, 1, True) for c in chunks] + [(chunks[0], 1, False)]
    arms += [(chunks[0], int(h), True) for h in args.holders.split(",") if int(h) > 1]
    results = []
    for depth in (int(d) for d in args.depths.split(",")):
        rows = run(depth, args.repeat, arms)
        mib = sum(t.numel() * t.element_size() for t in snapshot.describe(live_state(depth))[1]) / 2**20
        for chunk, holders, mapped in arms:
            mine = [
                r for r in rows if (r["chunk_mib"], r["holders"], r["prefault"]) == (chunk, holders, mapped)
            ]
            med = {k: statistics.median(r[k] for r in mine) for k in mine[0] if isinstance(mine[0][k], float)}
            results.append(
                {"state_mib": round(mib), "chunk_mib": chunk, "holders": holders, "prefault": mapped, **med}
            )
    print(
        f"{'state':>9} {'chunk':>6} {'holders':>7} {'prefault':>8} {'checksum':>9} {'stream':>8} "
        f"{'receive':>8} {'wire':>7} {'GB/s':>6}"
    )
    for r in results:
        rate = r["state_mib"] * 2**20 / r["receive"] / 1e9
        wire = f"{r['wire']:>6.3f}s" if "wire" in r else f"{'-':>7}"
        mapped = "yes" if r["prefault"] else "no"
        print(
            f"{r['state_mib']:>5} MiB {r['chunk_mib']:>4} M {r['holders']:>7} {mapped:>8} "
            f"{r['checksum']:>8.3f}s "
            f"{r['stream']:>7.3f}s {r['receive']:>7.3f}s {wire} {rate:>6.2f}"
        )
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
