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
BASELINE_REF = "8b5e33d"
"""main before live metrics, the goodput account and straggler reporting."""


def step_time(repo: Path, work: Path, steps: int, extra: tuple[str, ...]) -> float:
    out = work / f"run-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "launcher.cli", "run", "--nodes", "4", "--no-tiers", "--log-dir", str(out), *extra,
           "--", sys.executable, "-m", "resilience.examples.train_mlp", "--width", "1024", "--depth", "4",
           "--steps", str(steps), "--progress-every", "100000", "--out", str(out / "out")]
    env = {**os.environ, "PYTHONPATH": str(repo)}  # each side imports its own tree
    subprocess.run(cmd, check=True, capture_output=True, timeout=900, cwd=repo, env=env)
    return json.loads((out / "out" / "rank0.json").read_text())["median_step_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--baseline-ref", default=BASELINE_REF)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sres-bench-observability-") as tmp:
        work = Path(tmp)
        baseline = work / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(baseline), args.baseline_ref], check=True,
                       capture_output=True, cwd=ROOT)
        try:
            times: dict[str, list[float]] = {"before (no metrics, no step timing)": [],
                                             "metrics + textfile + step timing": []}
            sides = [(baseline, ()), (ROOT, ("--metrics-port", "0", "--metrics-textfile", str(work / "m.prom")))]
            for trial in range(args.repeat):
                for name, (repo, extra) in zip(times, sides):
                    times[name].append(step_time(repo, work, args.steps, extra))
                    print(f"  trial {trial + 1} {name:38s} {times[name][-1] * 1000:7.1f} ms/step", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=ROOT, capture_output=True)
    (before, b), (after, a) = times.items()
    mb, ma = statistics.median(b), statistics.median(a)
    print(f"\n4 ranks, ~60 MiB of state per rank, median of {args.repeat} (ms/step, range)")
    print(f"  {before:38s} {mb * 1000:7.1f}  ({min(b) * 1000:.1f}-{max(b) * 1000:.1f})")
    print(f"  {after:38s} {ma * 1000:7.1f}  ({min(a) * 1000:.1f}-{max(a) * 1000:.1f})")
    print(f"  overhead {(ma / mb - 1) * 100:+.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
