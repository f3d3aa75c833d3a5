"""A rank process forked from its machine's warm fork server versus started cold, in one run of
this script, interleaved. Prints a table and ratios; every number comes from this run.

Two measures, each from ``sres run`` of the MLP example on 3 simulated nodes:
  to ready   a new standby's start to warm (imports and first-use costs paid, waiting for a
             plan): the ``standby-ready`` seconds of the standbys started after a standby took
             over a killed rank (``--standby 1``, ranks 1 and 2 killed mid-run).
  recovery   a killed rank with no standby: the ``recovered`` seconds, from the fault to the
             first step after it (ranks 1 and 2 killed mid-run, one at a time).
"forked" is the default; "cold" is ``--no-fork-server``. The kills come at step 60 of 0.1 s
steps. (What forking saves at the run's start: ``benchmarks/start_up.py``.)

    python benchmarks/fork_server.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.observability.events import read_events  # noqa: E402

KILLS = ("--inject", "kill:rank=1:step=60", "--inject", "kill:rank=2:step=80")
TRAIN = ("--steps", "100", "--sleep-s", "0.1")


def one_run(work: Path, mode: str, standby: bool) -> list[dict]:
    log_dir = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=work))
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        "3",
        "--no-tiers",
        "--log-dir",
        str(log_dir),
        *(("--standby", "1") if standby else ()),
        *(("--no-fork-server",) if mode == "cold" else ()),
        *KILLS,
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        *TRAIN,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{mode} run failed ({log_dir}):\n{done.stderr[-2000:]}")
    return read_events(log_dir / "events.jsonl")


def to_ready(events: list[dict]) -> list[float]:
    """``standby-ready`` seconds of the standbys started after the first takeover."""
    first = next(i for i, e in enumerate(events) if e["event"] == "replaced")
    return [e["seconds"] for e in events[first:] if e["event"] == "standby-ready"]


def recoveries(events: list[dict]) -> list[float]:
    return [e["seconds"] for e in events if e["event"] == "recovered"]


def hows(events: list[dict]) -> list[str]:
    return [e["how"] for e in events if e["event"] == "replaced"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    ready: dict[str, list[float]] = {"forked": [], "cold": []}
    recovered: dict[str, list[float]] = {"forked": [], "cold": []}
    with tempfile.TemporaryDirectory(prefix="sres-fork-bench-") as tmp:
        work = Path(tmp)
        for i in range(args.repeat):
            for mode in ("forked", "cold"):
                ready[mode] += to_ready(one_run(work, mode, standby=True))
                events = one_run(work, mode, standby=False)
                recovered[mode] += recoveries(events)
                print(f"repeat {i + 1}/{args.repeat} {mode}: replaced how {hows(events)}", flush=True)

    def cell(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} (n={len(values)}, max {max(values):.3f})"

    print()
    print("| seconds, median | forked | cold | cold / forked |")
    print("|---|---|---|---|")
    for name, data in (("spawn to ready (standby-ready)", ready), ("kill, no standby: recovery", recovered)):
        ratio = statistics.median(data["cold"]) / statistics.median(data["forked"])
        print(f"| {name} | {cell(data['forked'])} | {cell(data['cold'])} | {ratio:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
