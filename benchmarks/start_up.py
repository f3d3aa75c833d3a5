"""A run's start with its ranks forked from one warm server per machine versus each started cold,
in one run of this script, interleaved. Prints a table and ratios; every number comes from this run.

Each run is ``sres run`` of the MLP example, 4 simulated nodes of 1 rank and a spare (5 rank
processes on this machine, as 8 ranks share a GPU node), 30 steps, no fault:
  start-up   the run's ``startup`` seconds (its goodput account: from the start to the first
             step, imports and formation included)
  wall       the whole ``sres run``, start to exit
  CPU        user + system seconds of every process of the run (the supervisor, the ranks, the
             fork server), from this script's children's resource usage
"forked" is the default; "cold" is ``--no-fork-server``.

    python benchmarks/start_up.py [--repeat 3] [--nodes 4]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.interleaved import interleave, table  # noqa: E402
from launcher.observability.events import read_events  # noqa: E402

TRAIN = ("--steps", "30", "--dataset", "200", "--global-batch", "24", "--micro-batch", "4")


def one_run(work: Path, mode: str, nodes: int) -> dict[str, float]:
    log_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=work))
    cmd = [
        *(sys.executable, "-m", "launcher.cli", "run", "--nodes", str(nodes), "--spares", "1"),
        *("--log-dir", str(log_dir)),
        *(("--no-fork-server",) if mode == "cold" else ()),
        *("--", sys.executable, "-m", "resilience.examples.train_mlp", *TRAIN),
        *("--out", str(log_dir / "out")),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed ({log_dir}):\n{done.stderr[-2000:]}")
    (finished,) = read_events(log_dir / "events.jsonl").of("finished")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"start-up": finished["goodput_by_cause"]["startup"], "wall": wall, "CPU": cpu}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--nodes", type=int, default=4)
    args = p.parse_args()
    runs = interleave(("forked", "cold"), args.repeat, lambda work, mode: one_run(work, mode, args.nodes),
                      "sres-start-bench-")  # fmt: skip
    print()
    print(table(runs, ("start-up", "wall", "CPU")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
