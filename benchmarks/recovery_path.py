"""The recovery path and the supervisor's cost, this tree against an earlier commit, interleaved.

Every feature adds a little to the path every fault takes; this measures it. Both sides run
the same workload from their own tree (a git worktree of ``--base``), alternating trial by
trial:

  recovery    ``sres run``, 2 nodes + 1 warm spare, ~60 MiB of parameters + AdamW state per
              rank, node 1 SIGKILLed at step 20, no tiers: the ``recovered`` event's seconds
              and its parts (release of the survivors, re-formation, transfer, first step).
  supervisor  CPU seconds (user + system) of the supervisor process itself over a fault-free
              200-step run of 2 ranks (read from /proc while it runs, its children excluded).

``--from-tiers``: the recovery run has the tiers on instead (its RAM root in /dev/shm, removed
after) and every rank process is killed at step 20 (``kill-all``), so the state comes back from
the RAM tier, not from a peer; ``--depth`` sizes the state (4: ~60 MiB, 20: ~252 MiB a rank).

    python benchmarks/recovery_path.py [--base 27e826b] [--repeat 5] [--from-tiers] [--depth 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
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


def _sres(
    repo: Path, log_dir: Path, sres: list[str], train: list[str], ram_root: Path | None = None
) -> subprocess.Popen:
    """``sres run`` from ``repo``'s tree: without tiers, or with them under ``ram_root``."""
    tiers = ["--job-id", log_dir.name] if ram_root is not None else ["--no-tiers"]
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        *tiers,
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
    if ram_root is not None:
        env["SRES_RAM_ROOT"] = str(ram_root)
    return subprocess.Popen(
        cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def _finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"a run failed ({proc.returncode}):\n{err[-2000:]}")


def recovery(repo: Path, work: Path, depth: int = 4, from_tiers: bool = False) -> dict[str, float]:
    log_dir = work / f"recovery-{time.monotonic_ns()}"
    fault = "kill-all:step=20" if from_tiers else "node:1:step=20"
    train = ["--width", "1024", "--depth", str(depth), "--steps", "30"]
    ram_root = Path(tempfile.mkdtemp(prefix="sres-bench-ram-", dir="/dev/shm")) if from_tiers else None
    try:
        _finish(_sres(repo, log_dir, ["--nodes", "2", "--spares", "1", "--inject", fault], train, ram_root))
    finally:
        if ram_root is not None:
            shutil.rmtree(ram_root, ignore_errors=True)
    # The first recovery (kill-all's kills may land in two observations, each recovered).
    rec = next(e for e in read_events(log_dir / "events.jsonl") if e["event"] == "recovered")
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
    parser.add_argument("--from-tiers", action="store_true", help="every rank killed: the RAM tier restores")
    parser.add_argument("--depth", type=int, default=4, help="the MLP's depth (4: ~60 MiB a rank)")
    args = parser.parse_args()
    sides: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="sres-bench-path-") as tmp:
        work = Path(tmp)
        with worktree(args.base, work / "base") as base:
            for trial in range(args.repeat):
                for side, repo in (("before", base), ("after", ROOT)):
                    got = {
                        **recovery(repo, work, args.depth, args.from_tiers),
                        "supervisor_cpu_s": supervisor_cpu(repo, work, args.steps),
                    }
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
