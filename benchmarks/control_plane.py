"""The control plane as the run grows: the real supervisor and store driving thousands of rank
stubs, one node fault, and what each part of the recovery's control path costs.

Rank stubs (``benchmarks/control_plane_stubs.py``, a few processes hosting hundreds of simulated
ranks each, threads running the project's own rank-side code without training) are started by
a placement of this script's (:class:`StubPlacement`) under the real ``Supervisor`` with its real
store and liveness server. Once every rank trains, the script measures the steady state (the
supervisor process's CPU, store requests a second counted in every process), kills one node
(its ranks stop, their connections close), and reads the control path from the stubs' records
and ``events.jsonl``: detection (kill to fault decided), release (kill to every survivor
released from the new generation's join barrier), the barrier (last arrival to last release).
The stubs' own records are checked: each rank released exactly once per generation, no rank in
two generations at once, every survivor in the new one.

    python benchmarks/control_plane.py --ranks 256 --json       # one run; last line: JSON
    python benchmarks/control_plane.py --ranks 256 --fault slow # a straggler node, replaced
    python benchmarks/control_plane.py --sweep 64,256,1024,4096 [--base REV]  # a table (+ REV's)

``--json``'s object (a contract: checks outside the project read it) has at least ``ranks``,
``nodes``, ``detect_s``, ``released_s``, ``barrier_s``, ``steady_supervisor_cpu`` (a fraction of
one core) and ``steady_store_rps``; also ``notified_s``, ``published_s``, ``start_s``,
``recovery_stubs_cpu_s``, ``recovery_supervisor_cpu_s``, ``recovery_requests_per_rank`` and
``problems`` (docs/explanation/scale.md says what each means).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CODE = Path(os.environ.get("SRES_CODE", ROOT))
"""The tree whose ``launcher`` and ``resilience`` run (another commit's, to compare)."""
sys.path.insert(0, str(CODE))
if CODE != ROOT:
    sys.path.insert(1, str(ROOT))

from benchmarks.control_plane_run import Harness, Shape  # noqa: E402


def one_run(shape: Shape) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sres-cp-") as tmp:
        return Harness(shape, Path(tmp)).run()


def run_sweep(a: argparse.Namespace) -> None:
    from benchmarks import control_plane_sweep as sweep
    from benchmarks.trees import worktree

    sizes = [int(n) for n in a.sweep.split(",")]
    if a.base:
        with (
            tempfile.TemporaryDirectory(prefix="sres-cp-base-") as tmp,
            worktree(a.base, Path(tmp) / "tree") as base,
        ):
            rows = sweep.sweep(sizes, base)
    else:
        rows = sweep.sweep(sizes, None)
    print(sweep.table(rows, a.base))
    for problem in sweep.problems(rows):
        print(f"  {problem}")
    print(json.dumps({"rows": [{"ranks": r, "this": o, "base": b} for r, o, b in rows]}))
    if a.plot:
        sweep.plot(rows, a.base, a.plot)
    if a.write_curve:
        a.write_curve.write_text(json.dumps(sweep.curve(rows, a.machine), indent=1) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=256, help="simulated ranks (default 256)")
    p.add_argument("--procs-per-node", type=int, default=8)
    p.add_argument("--hosts", type=int, default=0, help="stub processes (default: one per 256 ranks, 2-16)")
    p.add_argument("--steady-s", type=float, default=4.0, help="the steady window measured (default 4 s)")
    p.add_argument("--heartbeat-s", type=float, default=0.5)
    p.add_argument(
        "--fault",
        choices=("node", "hang", "slow"),
        default="node",
        help="what is injected: a node lost, a rank hung, a node's steps slowed (default node)",
    )
    p.add_argument("--slow-factor", type=float, default=3.0, help="with --fault slow: how much slower")
    p.add_argument(
        "--hang-timeout-s", type=float, help="the run's hang timeout (default 60 s; 5 s with --fault hang)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--sweep", help="sizes to run one after another (64,256,1024,4096): a table")
    p.add_argument("--base", help="with --sweep: also run this commit's code at each size, interleaved")
    p.add_argument("--write-curve", type=Path, help="with --sweep: write the curve sres simulate reads")
    p.add_argument("--machine", default="2-core CPU VM (this project's development machine)")
    p.add_argument("--plot", type=Path, help="with --sweep: draw the curves into this PNG")
    a = p.parse_args()
    if a.sweep:
        run_sweep(a)
        return
    hang_timeout = a.hang_timeout_s or (5.0 if a.fault == "hang" else 60.0)
    shape = Shape(
        a.ranks, a.procs_per_node, a.hosts, a.steady_s, a.heartbeat_s, a.fault, hang_timeout, a.slow_factor
    )
    result = one_run(shape)
    if a.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:24} {value}")
    if not result["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    t0 = time.monotonic()
    main()
    print(f"# {time.monotonic() - t0:.1f} s", file=sys.stderr)
