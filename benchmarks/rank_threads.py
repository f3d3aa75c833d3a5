"""Threads per rank: the default ``sres run`` now gives ranks that share a machine (one each, as
torchrun does) against torch's own default (every core in every rank), in one run of this script,
interleaved. Prints a table and ratios; every number comes from this run.

Each run is ``sres run`` of the model zoo's GPT-2 loop (``tests/models/gpt2_ddp.py``: a
``transformers`` GPT-2, DDP, AdamW, a StatefulDataLoader; told to leave torch's threads alone, as
the user's own script did), 2 simulated nodes x 2 ranks on this machine, no fault:
  productive  the run's ``productive`` seconds (its goodput account: steps at the median useful step)
  median step the median of every rank's step times (``step_times.jsonl``)
  wall        the whole ``sres run``, start to exit
"one each" leaves ``OMP_NUM_THREADS`` unset (sres sets 1); "all cores" sets it to this machine's
cores, which is what torch does in every process when nothing is set (sres before issue 53).

    python benchmarks/rank_threads.py [--repeat 3] [--steps 30]
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

from benchmarks.interleaved import interleave, table  # noqa: E402
from launcher.observability.events import read_events  # noqa: E402
from tests.models.common import USER_THREADS  # noqa: E402

MODES = ("one each", "all cores")


def one_run(work: Path, mode: str, steps: int) -> dict[str, float]:
    log_dir = Path(tempfile.mkdtemp(prefix=mode.replace(" ", "-") + "-", dir=work))
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env[USER_THREADS] = "1"  # the script keeps the threads it was given, as the user's did
    if mode == "all cores":
        env["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    cmd = [
        *(sys.executable, "-m", "launcher.cli", "run", "--nodes", "2", "--procs-per-node", "2"),
        *("--log-dir", str(log_dir)),
        *("--", sys.executable, "-m", "tests.models.gpt2_ddp", "--steps", str(steps)),
        *("--out", str(log_dir / "out")),
    ]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, cwd=ROOT, env=env)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed ({log_dir}):\n{done.stderr[-2000:]}")
    (finished,) = read_events(log_dir / "events.jsonl").of("finished")
    records = [json.loads(line) for line in (log_dir / "step_times.jsonl").read_text().splitlines()]
    step = statistics.median(r["step_s"] for r in records)
    return {"productive": finished["goodput_by_cause"]["productive"], "median step": step, "wall": wall}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    args = p.parse_args()
    runs = interleave(MODES, args.repeat, lambda work, mode: one_run(work, mode, args.steps), "sres-threads-")
    print()
    print(f"GPT-2 (tests/models/gpt2_ddp.py), 4 ranks on {os.cpu_count()} cores, {args.steps} steps")
    print(table(runs, ("productive", "median step", "wall"), digits=3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
