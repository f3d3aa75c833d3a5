"""Recovery after a node kill versus the classic restart from a disk checkpoint, and the cost
of protection in steady state. Prints tables and ratios; every number comes from this run.

For each state size (parameters + AdamW state per rank):
  ours      sres run, 4 nodes + 1 warm spare, node 1 SIGKILLed mid-run; seconds from the
            fault to the first step completed after it, split into release of the
            survivors, re-formation, state transfer from a peer and first step. Median of N.
  baseline  what a job restart does: start 4 new processes, import torch, init the process
            group, torch.load the checkpoint from local disk (already in the page cache: a
            best case for it), build DDP, run one step. Median of N. It also loses every
            step since its last save (up to the save interval); ours loses none.
  overhead  median step time of the same training under sres (commits protected) and under
            plain torch.distributed with resilience.run in pass-through mode (median of N runs each).

Both sres runs pass --no-tiers: this measures recovery from peers and the cost of in-process
protection; the checkpoint tiers have their own benchmark (benchmarks/checkpoint.py).

    python benchmarks/recovery.py [--sizes 64,512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.observability.events import read_events  # noqa: E402
from resilience.examples.train_mlp import state_mb  # noqa: E402

NODES = 4

# (width, depth, batch, steps, kill step) per target size in MiB of parameters + AdamW state.
SHAPES = {64: (1024, 4, 16, 16, 8), 512: (2048, 10, 4, 8, 4)}


def model_args(size: int) -> list[str]:
    width, depth, batch, steps, _ = SHAPES[size]
    return ["--width", str(width), "--depth", str(depth), "--batch", str(batch), "--steps", str(steps)]


def ours(size: int, work: Path) -> dict:
    kill_step = SHAPES[size][4]
    log_dir = work / f"ours-{size}-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        str(NODES),
        "--spares",
        "1",
        "--no-tiers",
        "--inject",
        f"node:1:step={kill_step}",
        "--log-dir",
        str(log_dir),
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        *model_args(size),
        "--progress-every",
        "1000",
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900, cwd=ROOT)
    (rec,) = [e for e in read_events(log_dir / "events.jsonl") if e["event"] == "recovered"]
    return rec


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_world(argv: list[str], world: int = NODES, stdout=subprocess.DEVNULL) -> list[subprocess.Popen]:
    """``world`` plain torch.distributed processes of ``argv`` (torchrun's environment, no sres)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SRES_")}
    return [
        subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=stdout,
            text=True,
            env={
                **env,
                "RANK": str(r),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            },
        )
        for r in range(world)
    ]


BASELINE_RANK = r"""
import os, sys, time, datetime
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
from resilience.examples.train_mlp import build_model, batch_for
import resilience
torch.set_num_threads(1)
width, depth, batch, ckpt = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
rank = dist.get_rank()
model = build_model(width, depth, 0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
state = torch.load(ckpt)
model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"])
ddp = resilience.ddp(model)
x, y = batch_for(0, rank, width, batch, 0)
torch.nn.functional.mse_loss(ddp(x), y).backward(); opt.step(); opt.zero_grad()
dist.barrier()
if rank == 0:
    print("FIRST_STEP_DONE", time.time(), flush=True)
"""


def baseline(size: int, work: Path) -> float:
    """Seconds from starting new processes to the first step done, restoring from disk."""
    width, depth, batch, _, _ = SHAPES[size]
    return restart_from_disk(width, depth, batch, work, NODES)


def restart_from_disk(width: int, depth: int, batch: int, work: Path, world: int) -> float:
    """What a job restart does at best: ``world`` new processes, torch.distributed, ``torch.load``
    of a checkpoint already in the page cache, one step; seconds from their start to that step."""
    ckpt = work / f"ckpt-{width}x{depth}.pt"
    if not ckpt.exists():
        import torch

        from resilience.examples.train_mlp import build_model

        model = build_model(width, depth, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        model(torch.randn(2, width)).sum().backward()
        opt.step()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, ckpt)
    ckpt.read_bytes()  # into the page cache: the baseline's best case
    script = work / "baseline_rank.py"
    script.write_text(BASELINE_RANK)
    start = time.time()
    procs = spawn_world(
        [sys.executable, str(script), str(ROOT), str(width), str(depth), str(batch), str(ckpt)],
        world=world,
        stdout=subprocess.PIPE,
    )
    out = procs[0].communicate(timeout=900)[0]
    for p in procs[1:]:
        p.wait(timeout=900)
    done = float(next(line.split()[1] for line in out.splitlines() if line.startswith("FIRST_STEP_DONE")))
    return done - start


def step_time(size: int, work: Path, protected: bool) -> float:
    """Median steady-state step time of rank 0, with or without sres protecting commits."""
    out = work / f"steps-{size}-{'sres' if protected else 'plain'}-{time.monotonic_ns()}"
    train = [
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        *model_args(size),
        "--progress-every",
        "1000",
        "--out",
        str(out),
    ]
    # More steps than a recovery trial: the median needs a steady state.
    train[train.index("--steps") + 1] = str(max(12, SHAPES[size][3]))
    if protected:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "launcher.cli",
                "run",
                "--nodes",
                str(NODES),
                "--no-tiers",
                "--log-dir",
                str(out),
                "--",
                *train,
            ],
            check=True,
            capture_output=True,
            timeout=900,
            cwd=ROOT,
        )
    else:
        procs = spawn_world(train)
        for p in procs:
            assert p.wait(timeout=900) == 0
    return json.loads((out / "rank0.json").read_text())["median_step_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64,512", help="state sizes in MiB (64 and/or 512)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="sres-bench-") as tmp:
        work = Path(tmp)
        for size in sizes:
            width, depth = SHAPES[size][:2]
            print(
                f"\n== {state_mb(width, depth):.0f} MiB of state per rank ({NODES} nodes + 1 warm spare)",
                flush=True,
            )
            recs = []
            for i in range(args.repeat):
                recs.append(ours(size, work))
                print(f"  ours     trial {i + 1}: {recs[-1]['seconds']:.3f} s", flush=True)
            bases = []
            for i in range(args.repeat):
                bases.append(baseline(size, work))
                print(f"  baseline trial {i + 1}: {bases[-1]:.3f} s", flush=True)
            # Interleaved, median of the repeats: this machine is shared and noisy.
            pairs = [(step_time(size, work, False), step_time(size, work, True)) for _ in range(args.repeat)]
            plain = statistics.median(p for p, _ in pairs)
            protected = statistics.median(q for _, q in pairs)
            print(f"  step time plain {plain:.4f} s, sres {protected:.4f} s", flush=True)
            rows.append((size, state_mb(width, depth), recs, bases, plain, protected))

    def med(recs, key):
        return statistics.median(r[key] for r in recs)

    print(f"\nRecovery after a node kill, median of {args.repeat} (2-core machine, gloo, CPU)")
    print(
        f"{'state':>8} {'ours s':>8} {'release':>8} {'re-form':>8} {'transfer':>9} {'1st step':>9} "
        f"{'baseline s':>11} {'speed-up':>9} {'steps lost':>11}"
    )
    for size, mb, recs, bases, _, _ in rows:
        total, base = med(recs, "seconds"), statistics.median(bases)
        print(
            f"{mb:>6.0f}MB {total:>8.3f} {med(recs, 'release_s'):>8.3f} {med(recs, 'reform_s'):>8.3f} "
            f"{med(recs, 'transfer_s'):>9.3f} {med(recs, 'first_step_s'):>9.3f} {base:>11.3f} "
            f"{base / total:>8.1f}x {max(r['steps_lost'] for r in recs):>6} (baseline: up to its save "
            "interval)"
        )
    print("\nSteady-state step time (rank 0, median)")
    print(f"{'state':>8} {'plain s':>9} {'sres s':>9} {'overhead':>9}")
    for size, mb, _, _, plain, protected in rows:
        print(f"{mb:>6.0f}MB {plain:>9.4f} {protected:>9.4f} {protected / plain - 1:>8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
