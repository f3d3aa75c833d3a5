"""Submit -> result under ``ResilientExecutor(cluster="local")``: a trivial function against
submitit's own ``LocalExecutor``, and a 2-rank training job, this tree against an earlier commit.

  trivial     ``submit`` -> result of a function that returns at once: LocalExecutor (one Python,
              no torch), and ResilientExecutor on one node (the supervisor, then one rank that
              imports torch and forms its group). The function takes the context, so the
              earlier tree (which called every function as ``f(ctx, ...)``) runs it too; this
              tree also runs a plain ``add(1, 2)``.
  training    the example MLP (``resilience.examples.submit_mlp.train``), 2 nodes, 20 steps.

The clock stops when ``job.done()`` first says so (polled every 20 ms; ``job.result()`` itself
polls once a second), then the result is read. Each trial runs in a fresh interpreter of its
side's tree, sides alternating; where the time goes is read from the run's events (the
supervisor's ``start``, the ``finished`` event) against the submit time.

    python benchmarks/submitit_latency.py [--base d54cac0] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.trees import worktree  # noqa: E402

BASE = "d54cac0"
"""main before issue 32's first commit."""
TORCH_IMPORT = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"

TRIAL = r"""
import json, sys, tempfile, time
kind = sys.argv[1]

def trivial(ctx):
    return 3

def add(a, b):
    return a + b

folder = tempfile.mkdtemp(prefix="sres-latency-") + "/%j"
if kind == "local":
    from submitit import LocalExecutor
    ex = LocalExecutor(folder)
    ex.update_parameters(timeout_min=10)
    call = (add, 1, 2)
else:
    from launcher.submitit import ResilientExecutor
    ex = ResilientExecutor(folder, cluster="local")
    nodes = 2 if kind == "training" else 1
    ex.update_parameters(nodes=nodes, timeout_min=10, no_tiers=True)
    if kind == "training":
        from resilience.examples.submit_mlp import train
        call = (train, 20)
    else:
        call = (add, 1, 2) if kind == "plain" else (trivial,)
t0 = time.time()
job = ex.submit(*call)
while not job.done():
    time.sleep(0.02)
seconds = time.time() - t0
job.result()
parts = {}
for event in getattr(job, "events", lambda: [])():
    if event["event"] in ("start", "finished"):
        parts[event["event"]] = event["t"] - t0
print(json.dumps({"seconds": seconds, **parts}))
"""


def trial(repo: Path, kind: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", TRIAL, kind],
        cwd=repo,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} trial in {repo} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(rows: list[dict[str, float]], key: str) -> str:
    values = [r[key] for r in rows if key in r]
    return f"{statistics.median(values):.2f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch_s = statistics.median(
        float(subprocess.run([sys.executable, "-c", TORCH_IMPORT], capture_output=True, text=True).stdout)
        for _ in range(3)
    )
    rows: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, worktree(args.base, Path(tmp) / "base") as before:
        sides = {"before": before, "after": ROOT}
        runs = [("after", "local"), ("after", "plain")]
        runs += [(side, kind) for kind in ("trivial", "training") for side in ("before", "after")]
        for i in range(args.repeat):
            for side, kind in runs if i % 2 == 0 else list(reversed(runs)):
                rows.setdefault((side, kind), []).append(trial(sides[side], kind))
            print(f"trial {i + 1}/{args.repeat} done", file=sys.stderr, flush=True)
    print(f"\nsubmit -> done, median of {args.repeat} (s); torch's import alone: {torch_s:.2f} s")
    print("| job | tree | submit -> done | supervisor's start event | finished event |")
    print("|---|---|---|---|---|")
    names = {
        "local": "trivial, LocalExecutor",
        "plain": "add(1, 2), ResilientExecutor",
        "trivial": "trivial(ctx), ResilientExecutor",
        "training": "MLP, 2 ranks, 20 steps",
    }
    for (side, kind), found in rows.items():
        tree = args.base if side == "before" else "this tree"
        print(
            f"| {names[kind]} | {tree} | {_median(found, 'seconds')} | {_median(found, 'start')} "
            f"| {_median(found, 'finished')} |"
        )
    local = statistics.median(r["seconds"] for r in rows[("after", "local")])
    plain = statistics.median(r["seconds"] for r in rows[("after", "plain")])
    print(
        f"\nResilientExecutor - LocalExecutor - one torch import: {plain - local - torch_s:+.2f} s "
        f"(the issue's bound: +2 s)"
    )


if __name__ == "__main__":
    main()
