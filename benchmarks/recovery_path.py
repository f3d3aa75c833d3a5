"""The recovery path and the supervisor's cost, this tree against an earlier commit, interleaved.

Every feature adds a little to the path every fault takes; this measures it. Both sides run
the same workload from their own tree (a git worktree of ``--base``), alternating trial by
trial:

  recovery    ``sres run``, 2 nodes + 1 warm spare, ~60 MiB of parameters + AdamW state per
              rank, node 1 SIGKILLed at step 20, no tiers: the ``recovered`` event's seconds
              and its parts (release of the survivors, re-formation, transfer, first step).
  supervisor  CPU seconds (user + system) of the supervisor process itself over a fault-free
              200-step run of 2 ranks (read from /proc while it runs, its children excluded).

    python benchmarks/recovery_path.py [--base 27e826b] [--repeat 5]
"""

from __future__ import annotations

import argparse
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
from launcher.observability.events import read_events  # noqa: E402

BASE = "27e826b"
"""main before issue 28's architecture step."""
PARTS = ("seconds", "release_s", "reform_s", "transfer_s", "first_step_s")
TICKS = os.sysconf("SC_CLK_TCK")


def _sres(repo: Path, log_dir: Path, sres: list[str], train: list[str]) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--no-tiers",
        "--log-dir",
        str(log_dir),
        *sres,
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        "--progress-every",
        "100000",
        *train,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo)}  # each side imports its own tree
    return subprocess.Popen(
        cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"a run failed ({proc.returncode}):\n{err[-2000:]}")


def recovery(repo: Path, work: Path) -> dict[str, float]:
    log_dir = work / f"recovery-{time.monotonic_ns()}"
    _finish(
        _sres(
            repo,
            log_dir,
            ["--nodes", "2", "--spares", "1", "--inject", "node:1:step=20"],
            ["--width", "1024", "--depth", "4", "--steps", "30"],
        )
    )
    (rec,) = [e for e in read_events(log_dir / "events.jsonl") if e["event"] == "recovered"]
    return {k: rec[k] for k in PARTS if rec.get(k) is not None}  # release_s: None if no report came


def supervisor_cpu(repo: Path, work: Path, steps: int) -> float:
    """The supervisor's own CPU seconds: /proc/<pid>/stat utime + stime (children excluded),
    read until it exits."""
    proc = _sres(
        repo,
        work / f"cpu-{time.monotonic_ns()}",
        ["--nodes", "2"],
        ["--width", "256", "--depth", "2", "--steps", str(steps)],
    )
    last = 0.0
    while proc.poll() is None:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            last = (int(fields[11]) + int(fields[12])) / TICKS
        except (OSError, IndexError):
            pass
        time.sleep(0.05)
    _finish(proc)
    return last


def _row(name: str, before: list[float], after: list[float], unit: float = 1.0) -> str:
    b, a = statistics.median(before), statistics.median(after)
    ratio = f"{a / b:5.2f}x" if b > 0 else "   -  "
    return (
        f"  {name:14s} {b * unit:9.3f} ({min(before) * unit:.3f}-{max(before) * unit:.3f})   "
        f"{a * unit:9.3f} ({min(after) * unit:.3f}-{max(after) * unit:.3f})   {ratio}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default=BASE, help=f"the earlier commit (default {BASE})")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="steps of the supervisor-CPU run")
    args = parser.parse_args()
    sides: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="sres-bench-path-") as tmp:
        work = Path(tmp)
        with worktree(args.base, work / "base") as base:
            for trial in range(args.repeat):
                for side, repo in (("before", base), ("after", ROOT)):
                    got = {**recovery(repo, work), "supervisor_cpu_s": supervisor_cpu(repo, work, args.steps)}
                    for key, value in got.items():
                        sides[side].setdefault(key, []).append(value)
                    print(
                        f"  trial {trial + 1} {side:6s} recovered in {got['seconds']:.3f} s "
                        f"(re-form {got['reform_s']:.3f} s), supervisor {got['supervisor_cpu_s']:.2f} CPU s",
                        flush=True,
                    )
    print(f"\nmedian of {args.repeat} (range): {args.base} vs this tree; seconds")
    print(f"  {'':14s} {'before':>26s}   {'after':>26s}   after/before")
    for key in (*PARTS, "supervisor_cpu_s"):
        if sides["before"].get(key) and sides["after"].get(key):
            print(_row(key, sides["before"][key], sides["after"][key]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
