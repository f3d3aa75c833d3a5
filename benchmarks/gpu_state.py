"""Device state through the tiers: what a commit blocks and what a restore to the device costs,
against the floor (one device-to-host copy into pinned memory) and what users do without sres
(``dcp.async_save``; ``torch.load`` then ``.cuda()``). Every number comes from this run.

For each size (float32 parameters + AdamW's two moments, made on the device):
  blocking per commit (median of --repeat, interleaved, each after the last one's writes):
    D2H floor        every tensor copied into one preallocated pinned buffer, then synchronized
    tiered save      TierSaver.save: the capture into its reused pinned buffers; the RAM-tier
                     write (/dev/shm) runs in the background and is waited for after
    dcp.async_save   until the call returns (its staging copy); the write is waited for after
  restore to the device (median of --repeat):
    RAM tier         manifest, checksums verified, tensors mapped from /dev/shm, copied to the device
    torch.load       of a torch.save file in --dir, then every tensor ``.to(device)`` (page cache
                     warm, then cold)
  and whether every restored tensor is bitwise the one saved.

On a machine without CUDA, ``--device cpu`` runs the same code (the floor is then a plain
memory copy): the GPU suite's CPU stand-in, and what tests/inprocess runs small in CI.

    python benchmarks/gpu_state.py [--device cuda] [--sizes 1024,8192] [--repeat 2] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

from benchmarks.checkpoint import evict  # noqa: E402
from resilience.state import snapshot  # noqa: E402
from resilience.tiers import TierConfig, own_root  # noqa: E402
from resilience.tiers import manifest as mf  # noqa: E402
from resilience.tiers.saver import TierPlace, TierSaver  # noqa: E402

TENSOR_MIB = 64
"""One tensor's size: a large model's layer (an 8 GiB state is 128 of them)."""

SAVES = ("D2H floor", "tiered save", "dcp.async_save")
RESTORES = ("RAM tier", "torch.load", "torch.load, cold")


def make_state(mib: int, device: torch.device) -> dict:
    """Parameters and AdamW moments, about ``mib`` MiB in all, drawn on ``device``."""
    numel = TENSOR_MIB * 2**20 // 4
    count = max(1, mib // (3 * TENSOR_MIB))  # at most mib: pinned buffers round up to a power of two
    side = int(numel**0.5)
    g = torch.Generator(device).manual_seed(0)

    def draw() -> torch.Tensor:
        return torch.randn(side, side, generator=g, device=device)

    params = {f"layer{i}.weight": draw() for i in range(count)}
    moments = {
        f"layer{i}.weight": {"step": torch.tensor(10.0), "exp_avg": draw(), "exp_avg_sq": draw().abs()}
        for i in range(count)
    }
    return {"model": params, "optimizer": {"state": moments, "param_groups": [{"lr": 1e-3}]}}


def tensors_of(state: dict) -> list[torch.Tensor]:
    return snapshot.describe(state)[1]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    sync(device)
    started = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - started


def floor_copy(tensors: list[torch.Tensor], device: torch.device) -> Callable[[], None]:
    """The physical floor: one copy of every tensor into a preallocated (pinned) host buffer."""
    total = sum(t.numel() for t in tensors)
    buffer = torch.empty(total, dtype=torch.float32, pin_memory=device.type == "cuda")

    def copy() -> None:
        offset = 0
        for t in tensors:
            n = t.numel()
            buffer[offset : offset + n].copy_(t.reshape(-1), non_blocking=True)
            offset += n
        sync(device)

    copy()  # fault the pages in: the floor is a copy, not page faults
    return copy


def bench(mib: int, repeat: int, work: Path, device: torch.device) -> dict[str, float]:
    state = make_state(mib, device)
    tensors = tensors_of(state)
    out: dict[str, float] = {"bytes": sum(t.numel() * t.element_size() for t in tensors)}
    free = shutil.disk_usage("/dev/shm").free
    if free < 2.2 * out["bytes"]:  # the RAM tier holds a step while it writes the next
        raise SystemExit(
            f"/dev/shm has {free / 2**30:.1f} GiB free: too little for a {mib} MiB state's RAM tier"
        )
    ram_base = Path(tempfile.mkdtemp(prefix="sres-bench-gpu-", dir="/dev/shm"))
    config = TierConfig(job_id="bench", neighbour=False, keep_ram=1)
    saver = TierSaver(config, TierPlace(0, 1, 0), lambda *a, **k: None, node_root=ram_base)
    steps = iter(range(10**6))
    for _ in range(2):  # the two buffer sets: allocated (and pinned) by the first two saves
        saver.save(next(steps), {"replicated": state})
        saver.wait_idle()
    floor = floor_copy(tensors, device)
    dcp_dir = work / f"dcp-{mib}"
    pending: list = []
    times: dict[str, list[float]] = {name: [] for name in SAVES}
    for _ in range(repeat):  # interleaved: the three see the same machine
        times["D2H floor"].append(timed(floor, device))
        times["tiered save"].append(timed(lambda: saver.save(next(steps), {"replicated": state}), device))
        saver.wait_idle()
        times["dcp.async_save"].append(
            timed(
                lambda: pending.append(dcp.async_save(state, storage_writer=dcp.FileSystemWriter(dcp_dir))),
                device,
            )
        )
        pending.pop().result()
    out.update({name: statistics.median(t) for name, t in times.items()})
    del floor
    shutil.rmtree(dcp_dir, ignore_errors=True)
    saver.close()
    step = saver.last_written
    ram_path = mf.rank_dir(own_root("bench", 0, ram_base), step, 0)
    disk = work / f"torch-save-{mib}.pt"
    torch.save(state, disk)
    gc.collect()

    def from_ram() -> list[torch.Tensor]:
        loaded = mf.load(ram_path, mf.read_manifest(ram_path, "bench", 1), verify=True, copy=False)
        return [t.to(device) for t in tensors_of(snapshot.materialize(loaded["replicated"], copy=False))]

    def from_disk() -> list[torch.Tensor]:
        return [t.to(device) for t in tensors_of(torch.load(disk, weights_only=True, map_location="cpu"))]

    out["exact"] = float(all(torch.equal(a, b.to(a.device)) for a, b in zip(from_ram(), tensors)))
    out["RAM tier"] = statistics.median(timed(from_ram, device) for _ in range(repeat))
    out["torch.load"] = statistics.median(timed(from_disk, device) for _ in range(repeat))
    out["torch.load, cold"] = statistics.median(
        timed(lambda: (evict(disk), from_disk()), device) for _ in range(repeat)
    )
    shutil.rmtree(ram_base, ignore_errors=True)
    disk.unlink(missing_ok=True)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def report(results: dict[int, dict[str, float]], device: torch.device) -> None:
    sizes = list(results)
    print(f"device: {device_name(device)}")
    print("| | " + " | ".join(f"{results[m]['bytes'] / 2**20:.0f} MiB s" for m in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    print("| **blocking per commit** |" + " |" * len(sizes))
    for name in SAVES:
        print(f"| {name} | " + " | ".join(f"{results[m][name]:.4f}" for m in sizes) + " |")
    print("| **restore to the device** |" + " |" * len(sizes))
    for name in RESTORES:
        print(f"| {name} | " + " | ".join(f"{results[m][name]:.4f}" for m in sizes) + " |")
    print()
    for m in sizes:
        r = ratios(results[m])
        print(
            f"{results[m]['bytes'] / 2**20:.0f} MiB: tiered blocking {r['tiered/floor']:.2f}x the D2H floor "
            f"(target <= 0.2x with an overlapped capture), dcp.async_save blocks {r['async/tiered']:.1f}x "
            f"as long (target >= 3x); RAM-tier restore {r['load/ram']:.1f}x faster than torch.load + .to() "
            f"(target >= 5x), {r['cold/ram']:.1f}x than a cold one; restored bitwise: "
            f"{'yes' if results[m]['exact'] else 'NO'}"
        )


def ratios(r: dict[str, float]) -> dict[str, float]:
    return {
        "tiered/floor": r["tiered save"] / r["D2H floor"],
        "async/tiered": r["dcp.async_save"] / r["tiered save"],
        "load/ram": r["torch.load"] / r["RAM tier"],
        "cold/ram": r["torch.load, cold"] / r["RAM tier"],
    }


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default="1024,8192", help="state sizes in MiB (default 1024,8192)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="where torch.save and dcp write (a temp dir)")
    parser.add_argument("--json", action="store_true", help="end with one JSON line of every figure")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (--device cpu runs the same code on the CPU)")
    sizes = [int(s) for s in args.sizes.split(",")]
    warnings.filterwarnings("ignore")  # DCP warns about single-process use and overwrites
    results: dict[int, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sres-bench-gpu-", dir=args.dir) as tmp:
        for mib in sizes:
            results[mib] = bench(mib, args.repeat, Path(tmp), device)
            print(f"measured {mib} MiB", file=sys.stderr, flush=True)
    report(results, device)
    summary = {
        "device": device_name(device),
        "sizes": {str(m): {**r, **ratios(r)} for m, r in results.items()},
    }
    if args.json:
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
