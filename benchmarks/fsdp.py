"""FSDP2 recovery after a node kill versus the classic path, and the cost of buddy copies.
Prints tables and ratios; every number comes from this run.

A small transformer (``resilience/examples/train_fsdp.py``, ``fully_shard`` per block) on
4 ranks, sized to --mib of parameters + AdamW state in all (256 by default):
  ours      sres run, 4 nodes + 1 warm spare, --no-tiers, node 1 SIGKILLed mid-run: seconds
            from the fault to the first step completed after it (release, re-form, transfer of
            the lost rank's shards from its buddy, first step). Median of N.
  classic   what a job restart does: start 4 new processes, import torch, init the process
            group, build and shard the model, ``dcp.load`` the checkpoint from a local directory
            (just written: in the page cache, its best case), ``set_state_dict``, one step.
            Median of N. It also loses every step since its last save; ours loses none.
  overhead  median step time of rank 0 under sres (every commit snapshot and copied to a
            buddy in the background) against the same loop in plain torch.distributed
            (resilience.run in pass-through mode), runs interleaved, median of N each; and the
            peak resident memory of a rank in both (the snapshots and the buddy's replica).
            Twice: with CPU compute only, and with --compute-s of simulated accelerator time
            (the host idle during compute, as on a GPU, where the copies run).

    python benchmarks/fsdp.py [--mib 256] [--repeat 3] [--steady-only] [--nodes 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.recovery import spawn_world  # noqa: E402
from launcher.observability.events import read_events  # noqa: E402
from resilience.examples.train_fsdp import state_mib  # noqa: E402
from resilience.state.replication import KEEP, KEEP_OWN  # noqa: E402

NODES = 4
VARIANTS: dict[str, tuple[str, ...] | None] = {"plain": None, "sres": (), "unpaced": ("--copy-pace", "0")}
"""The steady-state runs, interleaved: plain torch.distributed, sres, sres sending its copies at once."""
KILL_AT, STEPS, STEADY_STEPS = 8, 14, 20

CLASSIC_RANK = r"""
import datetime, sys, time
import torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
sys.path.insert(0, sys.argv[1])
mode, ckpt = sys.argv[2], sys.argv[3]
sys.argv = [sys.argv[0], *sys.argv[4:]]
from resilience.examples.train_fsdp import batch_for, build, parse_args
args = parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
rank, world = dist.get_rank(), dist.get_world_size()
model = build(args, world)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

def step(s):
    tokens, targets = batch_for(s, rank, args)
    logits = model(tokens)
    torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1)).backward()
    opt.step(); opt.zero_grad()

if mode == "save":
    step(0)
    model_sd, optim_sd = get_state_dict(model, opt)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt)
else:
    model_sd, optim_sd = get_state_dict(model, opt)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    dist.barrier()
    if rank == 0:
        print("LOADED", time.time(), flush=True)
    step(1)
dist.barrier()
if rank == 0:
    print("DONE", time.time(), flush=True)
"""


def shape(mib: float) -> list[str]:
    """Model flags for about ``mib`` MiB of state: depth grows at a fixed width of 512."""
    per_block = state_mib(argparse.Namespace(vocab=128, dim=512, depth=1, heads=8)) - state_mib(
        argparse.Namespace(vocab=128, dim=512, depth=0, heads=8)
    )
    depth = max(1, round(mib / per_block))
    return ["--dim", "512", "--depth", str(depth), "--heads", "8", "--progress-every", "100000"]


def ours(model: list[str], work: Path) -> dict:
    log_dir = work / f"ours-{time.monotonic_ns()}"
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
        f"node:1:step={KILL_AT}",
        "--log-dir",
        str(log_dir),
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_fsdp",
        *model,
        "--steps",
        str(STEPS),
    ]
    subprocess.run(cmd, check=True, capture_output=True, timeout=900, cwd=ROOT)
    (rec,) = [e for e in read_events(log_dir / "events.jsonl") if e["event"] == "recovered"]
    return rec


def classic(model: list[str], work: Path, mode: str) -> tuple[float, float]:
    """Seconds from starting 4 new processes to the state loaded (``dcp.load``), and to the
    first step done after it."""
    script = work / "classic_rank.py"
    script.write_text(CLASSIC_RANK)
    start = time.time()
    procs = spawn_world(
        [sys.executable, str(script), str(ROOT), mode, str(work / "dcp"), *model], stdout=subprocess.PIPE
    )
    out = procs[0].communicate(timeout=900)[0]
    if any(p.wait(timeout=900) for p in procs):
        raise SystemExit(f"the classic path's ranks failed ({mode})")
    marks = {
        line.split()[0]: float(line.split()[1]) - start
        for line in out.splitlines()
        if line.startswith(("LOADED", "DONE"))
    }
    return marks.get("LOADED", 0.0), marks["DONE"]


def steady(
    model: list[str], work: Path, sres: tuple[str, ...] | None, compute_s: float, nodes: int
) -> tuple[float, float]:
    """Rank 0's median step time and peak resident MiB on ``nodes`` ranks: under ``sres run``
    with these extra options, or plain (None)."""
    out = work / f"steady-{'plain' if sres is None else 'sres'}-{time.monotonic_ns()}"
    train = [
        sys.executable,
        "-m",
        "resilience.examples.train_fsdp",
        *model,
        "--steps",
        str(STEADY_STEPS),
        "--compute-s",
        str(compute_s),
        "--out",
        str(out),
    ]
    if sres is not None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "launcher.cli",
                "run",
                "--nodes",
                str(nodes),
                "--no-tiers",
                *sres,
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
    elif any(p.wait(timeout=900) for p in spawn_world(train, nodes)):
        raise SystemExit("the plain run failed")
    rank0 = json.loads((out / "rank0.json").read_text())
    return rank0["median_step_s"], rank0["peak_rss_mib"]


def print_recovery(recs: list[dict], bases: list[tuple[float, float]]) -> None:
    def med(key):
        return statistics.median(r[key] for r in recs)

    total_s, restored_s = med("seconds"), statistics.median(r["seconds"] - r["first_step_s"] for r in recs)
    base_loaded, base = statistics.median(b[0] for b in bases), statistics.median(b[1] for b in bases)
    print(f"\nRecovery after a node kill, median of {len(recs)} (2-core machine, gloo, CPU)")
    print(
        f"{'':>9} {'release':>8} {'re-form':>8} {'transfer':>9} {'state in':>9} {'1st step':>9} {'total':>8} "
        f"{'steps lost':>11}"
    )
    print(
        f"{'ours':>9} {med('release_s'):>8.3f} {med('reform_s'):>8.3f} {med('transfer_s'):>9.3f} "
        f"{restored_s:>9.3f} {med('first_step_s'):>9.3f} {total_s:>8.3f} "
        f"{max(r['steps_lost'] for r in recs):>11}"
    )
    print(
        f"{'classic':>9} {'':>8} {'':>8} {'':>9} {base_loaded:>9.3f} {base - base_loaded:>9.3f} {base:>8.3f} "
        f"{'save int.':>11}"
    )
    print(
        f"  speed-up: {base / total_s:.1f}x to the first step done, {base_loaded / restored_s:.1f}x to the "
        "state "
        f"in memory (ours: in the survivors' and the spare's memory; classic: loaded into a built model)"
    )
    print(
        f"  spread: ours {min(r['seconds'] for r in recs):.3f}-{max(r['seconds'] for r in recs):.3f} s, "
        f"classic {min(b[1] for b in bases):.3f}-{max(b[1] for b in bases):.3f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=float, default=256, help="parameters + AdamW state, all ranks, MiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--compute-s",
        type=float,
        default=2.0,
        help="simulated accelerator time per step for the second steady-state row",
    )
    parser.add_argument("--steady-only", action="store_true", help="skip the recovery rows")
    parser.add_argument(
        "--nodes",
        type=int,
        default=NODES,
        help=f"ranks of the steady-state runs (default {NODES}; the recovery rows always use {NODES})",
    )
    args = parser.parse_args()
    model = shape(args.mib)
    depth = int(model[model.index("--depth") + 1])
    total = state_mib(argparse.Namespace(vocab=128, dim=512, depth=depth, heads=8))
    recovery = "" if args.steady_only else f"recovery on {NODES} ranks + 1 warm spare, "
    print(
        f"== FSDP2, depth {depth}, {total:.0f} MiB of state: {recovery}steady state on {args.nodes} ranks "
        f"({total / args.nodes:.0f} MiB per rank)",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="sres-bench-fsdp-") as tmp:
        work = Path(tmp)
        recs, bases = [], []
        for i in range(0 if args.steady_only else args.repeat):
            recs.append(ours(model, work))
            print(
                f"  ours    trial {i + 1}: {recs[-1]['seconds']:.3f} s (steps lost {recs[-1]['steps_lost']})",
                flush=True,
            )
        if not args.steady_only:
            classic(model, work, "save")
        for i in range(0 if args.steady_only else args.repeat):
            bases.append(classic(model, work, "load"))
            print(
                f"  classic trial {i + 1}: loaded {bases[-1][0]:.3f} s, first step {bases[-1][1]:.3f} s",
                flush=True,
            )
        steadies = {}
        for compute_s in (0.0, args.compute_s):
            trials = steadies[compute_s] = []
            for i in range(args.repeat):  # interleaved: this machine is shared and noisy
                trial = {}
                for variant, flags in VARIANTS.items():
                    trial[variant] = steady(model, work, flags, compute_s, args.nodes)
                trials.append(trial)
                times = ", ".join(f"{name} {t:.4f} s" for name, (t, _) in trials[-1].items())
                print(f"  steady  trial {i + 1}, compute {compute_s} s: {times}", flush=True)

    if recs:
        print_recovery(recs, bases)
    print(f"\nSteady state, rank 0 of {args.nodes}, median of {args.repeat} runs of {STEADY_STEPS} steps")
    print(
        f"{'compute':>8} {'plain s':>9} {'sres s':>9} {'overhead':>9} {'unpaced s':>10} {'overhead':>9} "
        f"{'plain RSS':>10} {'sres RSS':>9} {'extra':>8}"
    )
    for compute_s, trials in steadies.items():

        def median(name: str, i: int, trials=trials) -> float:
            return statistics.median(t[name][i] for t in trials)

        plain, protected, unpaced = (median(name, 0) for name in VARIANTS)
        rss_plain, rss_sres = median("plain", 1), median("sres", 1)
        print(
            f"{compute_s:>7.1f}s {plain:>9.4f} {protected:>9.4f} {protected / plain - 1:>8.1%} "
            f"{unpaced:>10.4f} {unpaced / plain - 1:>8.1%} {rss_plain:>7.0f}MiB "
            f"{rss_sres:>6.0f}MiB {rss_sres - rss_plain:>5.0f}MiB"
        )
    print(
        "  compute: simulated accelerator time per step (the host waits, as on a GPU); at 0 every step is CPU"
    )
    print("  unpaced: sres with --copy-pace 0, each buddy copy sent at once instead of over half a step")
    print(f"  work of {args.nodes} ranks on this machine's cores, which the snapshot and copies compete for")
    print(
        f"  host memory per rank for protection: its shard ({total / args.nodes:.0f} MiB) kept as its last "
        f"{KEEP_OWN} "
        f"commits, plus {KEEP} of its buddy's (replication factor 2): "
        f"{(KEEP_OWN + KEEP) * total / args.nodes:.0f} MiB "
        "by design"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
