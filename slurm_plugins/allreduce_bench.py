"""All-reduce bus bandwidth through torch.distributed: the deep check's ``all_reduce_perf``.

Run as ``python -m slurm_plugins.allreduce_bench --world N --mib M --seconds S``: it starts N
local ranks (NCCL, one GPU each, where N GPUs exist; else gloo on CPU), times
all-reduces of an M MiB float32 tensor for about S seconds, checks the sum is right and
prints one JSON line from rank 0: ``{"backend", "world", "mib", "iters", "algbw_gbps",
"busbw_gbps"}``. Bus bandwidth is NCCL-tests' ``algbw * 2 (n-1) / n``.

The ranks meet through a file in a fresh 0700 directory, not a TCP port: a port chosen in
advance is on the command line (``ps``), and another user who took it first made the check
fail and a drained node never resume.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

from resilience.own_python import own_module


def bus_bandwidth(nbytes: int, seconds_per_op: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (pure)."""
    algbw = nbytes / seconds_per_op / 1e9
    return algbw, algbw * 2 * (world - 1) / world


def _rank(rank: int, world: int, store: str, mib: int, seconds: float, backend: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method="file://" + os.path.join(store, "rendezvous"),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    numel = mib * (1 << 20) // 4
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    dist.all_reduce(tensor)  # warm-up, and a correctness check
    if backend == "nccl":
        torch.cuda.synchronize(device)
    correct = bool((tensor == world).all().item())
    iters, start = 0, time.perf_counter()
    deadline = start + seconds
    while True:
        dist.all_reduce(tensor)
        iters += 1
        if backend == "nccl":
            torch.cuda.synchronize(device)
        flag = torch.tensor([1 if time.perf_counter() < deadline else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # everyone stops after the same iteration
        if not flag.item():
            break
    took = time.perf_counter() - start
    if rank == 0:
        algbw, busbw = bus_bandwidth(numel * 4, took / iters, world)
        print(
            json.dumps(
                {
                    "backend": backend,
                    "world": world,
                    "mib": mib,
                    "iters": iters,
                    "correct": correct,
                    "algbw_gbps": round(algbw, 3),
                    "busbw_gbps": round(busbw, 3),
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m slurm_plugins.allreduce_bench")
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--store", help="internal: the ranks' private rendezvous directory")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--rank", type=int, help="internal: run one rank")
    args = p.parse_args(argv)
    if args.rank is not None:
        _rank(args.rank, args.world, args.store, args.mib, args.seconds, args.backend)
        return 0
    store = tempfile.mkdtemp(prefix="sres-allreduce-")  # 0700, a fresh name
    try:
        return _run_ranks(args, store)
    finally:
        shutil.rmtree(store, ignore_errors=True)


def _run_ranks(args: argparse.Namespace, store: str) -> int:
    base = [
        *own_module("slurm_plugins.allreduce_bench"),
        "--world",
        str(args.world),
        "--store",
        store,
        "--mib",
        str(args.mib),
        "--seconds",
        str(args.seconds),
        "--backend",
        args.backend,
    ]
    procs = [
        subprocess.Popen(base + ["--rank", str(r)], stdout=subprocess.PIPE if r == 0 else subprocess.DEVNULL)
        for r in range(args.world)
    ]
    out = procs[0].communicate()[0]
    codes = [p.wait() for p in procs]
    sys.stdout.write(out.decode())
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
