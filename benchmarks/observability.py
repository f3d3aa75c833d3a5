"""What seeing a run costs: step time with live metrics and straggler reporting vs without them.

The per-step timing of every rank (straggler detection, step_times.jsonl) is always on, so the
baseline is the same workload on the code before it: a git worktree of ``--baseline-ref``
(default: the newest commit before the observability work). Both sides run the example MLP
(parameters + AdamW state ~60 MiB per rank) on 4 ranks under ``sres run --no-tiers``; the new
side also serves metrics (``--metrics-port 0``) and writes the textfile every second. Median
steady-state step time of rank 0, runs interleaved (this machine is shared and noisy).

    python benchmarks/observability.py [--repeat 5] [--steps 60] [--baseline-ref 8b5e33d]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.trees import worktree  # noqa: E402

BASELINE_REF = "8b5e33d"
"""main before live metrics, the goodput account and straggler reporting."""


def step_time(repo: Path, work: Path, steps: int, extra: tuple[str, ...]) -> float:
    out = work / f"run-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        "4",
        "--no-tiers",
        "--log-dir",
        str(out),
        *extra,
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        "--width",
        "1024",
        "--depth",
        "4",
        "--steps",
        str(steps),
        "--progress-every",
        "100000",
        "--out",
        str(out / "out"),
    ]
    env = {**os.environ, "PYTHONPATH": str(repo)}  # each side imports its own tree
    subprocess.run(cmd, check=True, capture_output=True, timeout=900, cwd=repo, env=env)
    return json.loads((out / "out" / "rank0.json").read_text())["median_step_s"]


def timer_cost_us(steps: int = 20_000) -> float:
    """Microseconds a rank spends per step on its step timing (a real in-process store)."""
    import torch.distributed as dist

    sys.path.insert(0, str(ROOT))
    from resilience.agent.step_timer import StepTimer, collective_started
    from resilience.contract.run_store import RunStore

    timer = StepTimer(RunStore(dist.HashStore()), "n0p0", 1)
    timer.activate()
    start = time.perf_counter()
    for step in range(steps):
        timer.step_started()
        for _ in range(10):  # one mark per parameter tensor's all-reduce (the example MLP's 10)
            collective_started()
        timer.blocked(0.0)
        timer.step_committed(step)
    timer.deactivate()
    return (time.perf_counter() - start) / steps * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    args = parser.parse_args()
    per_step_us = timer_cost_us()
    if args.repeat == 0:
        print(f"step timing: {per_step_us:.1f} us per step and rank (in one process, store included)")
        return 0
    with tempfile.TemporaryDirectory(prefix="sres-bench-observability-") as tmp:
        work = Path(tmp)
        with worktree(args.baseline_ref, work / "baseline") as baseline:
            times: dict[str, list[float]] = {
                "before (no metrics, no step timing)": [],
                "step timing (always on)": [],
                "metrics + textfile + step timing": [],
            }
            sides = [
                (baseline, ()),
                (ROOT, ()),
                (ROOT, ("--metrics-port", "0", "--metrics-textfile", str(work / "m.prom"))),
            ]
            for trial in range(args.repeat):
                for name, (repo, extra) in zip(times, sides):
                    times[name].append(step_time(repo, work, args.steps, extra))
                    print(f"  trial {trial + 1} {name:38s} {times[name][-1] * 1000:7.1f} ms/step", flush=True)
    mb = statistics.median(next(iter(times.values())))
    print(f"\n4 ranks, ~60 MiB of state per rank, median of {args.repeat} (ms/step, range; vs before)")
    for name, values in times.items():
        m = statistics.median(values)
        print(
            f"  {name:38s} {m * 1000:7.1f}  ({min(values) * 1000:.1f}-{max(values) * 1000:.1f})  "
            f"{(m / mb - 1) * 100:+.1f}%"
        )
    print(
        f"step timing alone: {per_step_us:.1f} us per step and rank (in one process, store included) = "
        f"{per_step_us / (mb * 1e6) * 100:.3f}% of a {mb * 1000:.0f} ms step; metrics are served by the "
        "supervisor, "
        f"off the ranks' path"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
