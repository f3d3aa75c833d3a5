"""Checkpoint cost: how long a save blocks the training loop, and how long a restore takes,
for the tiers against torch.save, dcp.save and dcp.async_save. Every number comes from this
run, on this machine; the floor (one plain memory copy of the state) is measured in it too.

For each state size (float32 tensors shaped like a model: parameters + AdamW's two moments):
  blocking per save (median of N saves, each after the previous one finished in the background):
    memory copy    copy every tensor into a preallocated flat buffer: the physical floor
                   (measured interleaved with the tiered saves, so both see the same machine)
    torch.save     to a file in --dir (the page cache; no fsync: its best case)
    dcp.save       FileSystemWriter into --dir
    dcp.async_save until the call returns (its staging copy); the write is waited for after
    tiered save    TierSaver.save: the copy into reused buffers; the RAM-tier write (/dev/shm)
                   and the persistent copy (into --dir, fsync) run in the background
  restore (median of N):
    RAM tier       manifest, checksums verified, tensors mapped from /dev/shm (no copy)
    RAM tier+copy  the same, read into fresh memory
    neighbour      the node's files pushed over TCP (loopback here) into this node's RAM tier, then loaded
    persistent     read from --dir into fresh memory, checksums verified (page cache warm, then cold)
    torch.load     of the torch.save file in --dir (page cache warm, then cold: the file's pages
                   dropped with posix_fadvise, as on a node that did not write it)

  checksum: GB/s of the checksum every transfer and file carries (xxh3), and of the wrapping
  sum it replaced

  persistent tier of W data-parallel ranks (--dp-ranks W, one TierSaver per rank in this
  process): bytes written to --dir per save and the time until every rank's copy is complete,
  each rank writing its full state (the baseline) vs ranks > 0 leaving their replicated
  state to rank 0's copy (``persist_replicated_once``, the default)

    python benchmarks/checkpoint.py [--sizes 512,2048] [--repeat 5] [--dp-ranks 4] \
        [--dir /tmp/sres-ckpt-bench]
"""

from __future__ import annotations

import argparse
import warnings
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from resilience.tiers import manifest as mf  # noqa: E402
from resilience.state import snapshot  # noqa: E402
from resilience.tiers.saver import TierPlace, TierSaver  # noqa: E402
from resilience.contract import run_secret  # noqa: E402
from resilience.tiers.transport import NeighbourServer, push_checkpoint  # noqa: E402
from resilience.tiers import TierConfig, own_root  # noqa: E402


def make_state(mib: int) -> dict:
    """Parameters and AdamW moments of a stack of square layers: about ``mib`` MiB in total."""
    per_tensor = 16 * 2**20 // 4  # 16 MiB tensors: a large model's layer, a few dozen of them
    count = max(1, round(mib * 2**20 / 4 / per_tensor / 3))
    side = int(per_tensor**0.5)
    g = torch.Generator().manual_seed(0)
    params = {f"layer{i}.weight": torch.randn(side, side, generator=g) for i in range(count)}
    moments = {
        f"layer{i}.weight": {
            "step": torch.tensor(10.0),
            "exp_avg": torch.randn(side, side, generator=g),
            "exp_avg_sq": torch.rand(side, side, generator=g),
        }
        for i in range(count)
    }
    return {"model": params, "optimizer": {"state": moments, "param_groups": [{"lr": 1e-3}]}}


def nbytes(state: dict) -> int:
    _, tensors, _ = snapshot.describe(state)
    return sum(t.numel() * t.element_size() for t in tensors)


def evict(path: Path) -> None:
    """Drop one file's (or directory's files') pages from the page cache, nothing else's."""
    for f in [path] if path.is_file() else sorted(path.iterdir()):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def median_time(fn, repeat: int, after=None) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
        if after is not None:
            after()
    return statistics.median(times)


def bench(mib: int, repeat: int, work: Path) -> dict[str, float]:
    state = make_state(mib)
    size = nbytes(state)
    _, tensors, _ = snapshot.describe(state)
    out: dict[str, float] = {"bytes": size}

    disk = work / f"torch-save-{mib}.pt"
    out["torch.save"] = median_time(lambda: torch.save(state, disk), repeat)

    dcp_dir = work / f"dcp-{mib}"
    out["dcp.save"] = median_time(
        lambda: dcp.save(state, storage_writer=dcp.FileSystemWriter(dcp_dir)), repeat
    )
    pending = []
    out["dcp.async_save"] = median_time(
        lambda: pending.append(dcp.async_save(state, storage_writer=dcp.FileSystemWriter(dcp_dir))),
        repeat,
        after=lambda: pending.pop().result(),
    )
    shutil.rmtree(dcp_dir, ignore_errors=True)
    gc.collect()

    ram_base = Path(tempfile.mkdtemp(prefix="sres-bench-", dir="/dev/shm"))
    persistent = work / f"persistent-{mib}"
    config = TierConfig(
        job_id="bench",
        neighbour=False,
        persistent_dir=str(persistent),
        persist_every=1,
        keep_ram=1,
        keep_persistent=1,
    )
    saver = TierSaver(config, TierPlace(0, 1, 0), lambda *a, **k: None, node_root=ram_base)
    steps = iter(range(10**6))
    saver.save(next(steps), {"replicated": state})  # the first save allocates its buffers
    saver.wait_idle()
    floor = torch.empty(size // 4, dtype=torch.float32)

    def plain_copy() -> None:
        offset = 0
        for t in tensors:
            n = t.numel()
            floor[offset : offset + n].copy_(t.reshape(-1))
            offset += n

    plain_copy()  # fault the pages in: the floor is a copy, not page faults
    # Interleaved, so that both see the same machine (other jobs share these 2 cores).
    copies, saves = [], []
    for _ in range(repeat):
        copies.append(median_time(plain_copy, 1))
        saves.append(
            median_time(lambda: saver.save(next(steps), {"replicated": state}), 1, after=saver.wait_idle)
        )
    out["memory copy"], out["tiered save"] = statistics.median(copies), statistics.median(saves)
    floor = None  # 2 GiB back before the restores
    saver.close()
    step = saver.last_written
    gc.collect()

    ram_path = mf.rank_dir(own_root("bench", 0, ram_base), step, 0)

    def restore(path: Path, copy: bool) -> None:
        m = mf.read_manifest(path, "bench", 1)
        loaded = mf.load(path, m, verify=True, copy=copy)
        snapshot.materialize(loaded["replicated"], copy=False)

    out["restore RAM tier"] = median_time(lambda: restore(ram_path, False), repeat)
    out["restore RAM tier+copy"] = median_time(lambda: restore(ram_path, True), repeat)

    neighbour = Path(tempfile.mkdtemp(prefix="sres-bench-nb-", dir="/dev/shm"))
    server = NeighbourServer(neighbour, "bench", keep=1, secret=run_secret.new_secret()).start()

    def from_neighbour() -> None:
        push_checkpoint(server.link, ram_path, "bench", 0, step)
        restore(mf.rank_dir(neighbour, step, 0), False)

    out["restore neighbour"] = median_time(from_neighbour, repeat)
    server.stop()
    shutil.rmtree(neighbour, ignore_errors=True)
    out["restore persistent"] = median_time(lambda: restore(mf.rank_dir(persistent, step, 0), True), repeat)
    out["torch.load"] = median_time(lambda: torch.load(disk, weights_only=True), repeat)
    # Cold: a restarted job on another node finds none of the file in its page cache.
    p_dir = mf.rank_dir(persistent, step, 0)
    out["restore persistent, cold"] = median_time(lambda: (evict(p_dir), restore(p_dir, True)), repeat)
    out["torch.load, cold"] = median_time(lambda: (evict(disk), torch.load(disk, weights_only=True)), repeat)

    shutil.rmtree(ram_base, ignore_errors=True)
    shutil.rmtree(persistent, ignore_errors=True)
    disk.unlink(missing_ok=True)
    gc.collect()
    return out


SAVES = ["memory copy", "torch.save", "dcp.save", "dcp.async_save", "tiered save"]
RESTORES = [
    "restore RAM tier",
    "restore RAM tier+copy",
    "restore neighbour",
    "restore persistent",
    "restore persistent, cold",
    "torch.load",
    "torch.load, cold",
]


def bench_dp_persistent(mib: int, ranks: int, repeat: int, work: Path) -> dict[bool, tuple[int, float]]:
    """once -> (bytes in the persistent dir per save, median seconds until all ranks' copies
    are complete) for ``ranks`` data-parallel ranks holding the same ``mib`` MiB state."""
    state = make_state(mib)
    out = {}
    for once in (False, True):
        ram, root = Path(tempfile.mkdtemp(prefix="sres-bench-dp-", dir="/dev/shm")), work / f"dp-{once}"
        config = TierConfig(
            job_id="bench",
            neighbour=False,
            persistent_dir=str(root),
            persist_every=1,
            keep_ram=1,
            keep_persistent=1,
            persist_replicated_once=once,
        )
        savers = [
            TierSaver(config, TierPlace(r, ranks, r), lambda e, **f: None, node_root=ram)
            for r in range(ranks)
        ]
        times, sizes = [], []
        try:
            for step in range(repeat):
                for saver in savers:
                    saver.save(step, {"replicated": state, "sharded": {}})
                for saver in savers:
                    saver.wait_ram()
                started = time.perf_counter()
                for saver in savers:
                    saver.wait_idle()
                times.append(time.perf_counter() - started)
                sizes.append(sum(f.stat().st_size for f in mf.step_dir(root, step).rglob("*") if f.is_file()))
        finally:
            for saver in savers:
                saver.close()
            shutil.rmtree(ram, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
        out[once] = (statistics.median(sizes), statistics.median(times))
    return out


def checksum_speed(mib: int, repeat: int) -> dict[str, float]:
    """GB/s of the checkpoint checksum (xxh3, order-sensitive) and of the wrapping sum it
    replaced, over the same float32 buffer; median of ``repeat``."""
    from resilience.state.snapshot import checksum, sum_checksum

    data = torch.randn(mib * 2**20 // 4)
    out = {}
    for name, fn in (("xxh3 (order-sensitive)", checksum), ("wrapping sum (before)", sum_checksum)):
        fn(b"", [data])
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn(b"", [data])
            times.append(time.perf_counter() - t0)
        out[name] = mib / 1024 * 2**30 / 1e9 / statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="512,2048", help="state sizes in MiB (default 512,2048)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--dir", type=Path, default=Path("/tmp/sres-ckpt-bench"), help="the 'persistent' disk"
    )
    parser.add_argument(
        "--dp-ranks", type=int, default=4, help="data-parallel ranks of the persistent-tier measure"
    )
    parser.add_argument("--dp-mib", type=int, default=256, help="state per rank of that measure, MiB")
    parser.add_argument(
        "--only-dp", action="store_true", help="only the data-parallel persistent-tier measure"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")  # DCP warns about single-process use and overwrites
    torch.set_num_threads(1)  # like a rank of the tests: one thread per process on this 2-core machine
    args.dir.mkdir(parents=True, exist_ok=True)
    results = {}
    try:
        dp = bench_dp_persistent(args.dp_mib, args.dp_ranks, args.repeat, args.dir)
        for mib in (int(s) for s in args.sizes.split(",")) if not args.only_dp else ():
            results[mib] = bench(mib, args.repeat, args.dir)
            print(f"measured {mib} MiB", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    print(
        f"| persistent tier, {args.dp_ranks} data-parallel ranks x {args.dp_mib} MiB | MiB written per save "
        "| s until all copies complete |"
    )
    print("|---|---|---|")
    for once, name in (
        (False, "every rank writes its full state"),
        (True, "replicated state once (default)"),
    ):
        print(f"| {name} | {dp[once][0] / 2**20:.0f} | {dp[once][1]:.2f} |")
    print(
        f"\nreplicated state once: {dp[False][0] / dp[True][0]:.1f}x fewer bytes, "
        f"{dp[False][1] / dp[True][1]:.1f}x faster to a complete persistent checkpoint\n"
    )
    speeds = checksum_speed(512, args.repeat)
    print(
        "checksum of every transfer and checkpoint file, 512 MiB, one thread: "
        + ", ".join(f"{name} {gbs:.1f} GB/s" for name, gbs in speeds.items())
        + "\n"
    )
    if not results:
        return
    sizes = list(results)
    header = "| | " + " | ".join(f"{results[m]['bytes'] / 2**20:.0f} MiB s" for m in sizes) + " |"
    print(header)
    print("|---|" + "---|" * len(sizes))
    print("| **blocking per save** |" + " |" * len(sizes))
    for name in SAVES:
        print(f"| {name} | " + " | ".join(f"{results[m][name]:.3f}" for m in sizes) + " |")
    print("| **restore** |" + " |" * len(sizes))
    for name in RESTORES:
        print(
            f"| {name.replace('restore ', '')} | "
            + " | ".join(f"{results[m][name]:.3f}" for m in sizes)
            + " |"
        )
    print()
    for m in sizes:
        r = results[m]
        print(
            f"{r['bytes'] / 2**20:.0f} MiB: tiered blocking = {r['tiered save'] / r['memory copy']:.2f}x "
            "one memory copy "
            f"(target <= 1.2x); dcp.async_save blocks {r['dcp.async_save'] / r['tiered save']:.1f}x longer "
            f"(target >= 3x); torch.save {r['torch.save'] / r['tiered save']:.1f}x; "
            f"RAM-tier restore {r['torch.load, cold'] / r['restore RAM tier']:.1f}x faster than a cold "
            "torch.load "
            f"from the persistent dir (target >= 5x), {r['torch.load'] / r['restore RAM tier']:.1f}x than "
            "one "
            f"from the page cache"
        )


if __name__ == "__main__":
    main()
