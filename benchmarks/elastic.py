"""How long a resize takes and what it does to throughput. Prints tables; every number comes
from this run.

For one state size (parameters + AdamW state per rank, ~256 MiB by default), 4 simulated nodes:
  spare     a node SIGKILLed with a warm spare (the world stays 4): seconds from the fault to
            the first step after it (the baseline a shrink is held to).
  shrink    the same kill with no spare and --min-nodes 3: the world re-forms at 3.
  grow      `sres grow --by 1` on that run: seconds from the pause (asked once the new node
            was started and warmed up, while training went on) to the first step at 4 ranks,
            split into the wait for the step boundary (training goes on meanwhile: ranks finish
            the step they are in and one more), re-form, state transfer and first step. Also
            the time from the request, which includes starting the node.
  release   `sres shrink --by 1` afterwards: the same, to the first step at 3 ranks.
Throughput is samples per second between consecutive committed steps (median), per world size.

    python benchmarks/elastic.py [--repeat 3] [--width 2048 --depth 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from launcher.observability.events import read_events  # noqa: E402
from resilience.examples.train_mlp import state_mb  # noqa: E402

GLOBAL_BATCH, MICRO = 24, 6


def sres(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def run(work: Path, name: str, width: int, depth: int, steps: int, *flags: str, control=None) -> Path:
    log_dir = work / f"{name}-{time.monotonic_ns()}"
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        "4",
        "--no-tiers",
        "--log-dir",
        str(log_dir),
        *flags,
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        "--width",
        str(width),
        "--depth",
        str(depth),
        "--steps",
        str(steps),
        "--dataset",
        "100000",
        "--global-batch",
        str(GLOBAL_BATCH),
        "--micro-batch",
        str(MICRO),
        "--progress-every",
        "1000",
    ]
    thread = None
    if control is not None:
        thread = threading.Thread(target=control, args=(log_dir,), daemon=True)
        thread.start()
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800, cwd=ROOT)
    if thread is not None:
        thread.join(timeout=5)
    return log_dir


def wait_for(log_dir: Path, predicate, timeout_s: float = 900) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = log_dir / "events.jsonl"
        for event in read_events(path) if path.exists() else []:
            if predicate(event):
                return event
        time.sleep(0.1)
    raise TimeoutError("the event did not come")


def resize_then_back(log_dir: Path) -> None:
    """After the shrink (fault): grow by one, then shrink by one again."""
    wait_for(log_dir, lambda e: e["event"] == "resize" and e["why"] == "fault")
    t0 = time.time()
    assert sres("grow", str(log_dir), "--by", "1").returncode == 0
    grown = wait_for(log_dir, lambda e: e["event"] == "resize" and e["to_world"] == 4)
    (log_dir / "grow-request-s").write_text(str(grown["t"] - t0))
    time.sleep(3)  # a few steps at 4
    assert sres("shrink", str(log_dir), "--by", "1").returncode == 0


def throughput(log_dir: Path) -> dict[int, float]:
    by_step: dict[int, dict] = {}
    for path in (log_dir / "samples").glob("rank-0.jsonl"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            by_step[rec["step"]] = rec
    rates: dict[int, list[float]] = {}
    steps = [by_step[s] for s in sorted(by_step)]
    for prev, rec in zip(steps, steps[1:]):
        if rec["world_size"] == prev["world_size"] and rec["generation"] == prev["generation"]:
            rates.setdefault(rec["world_size"], []).append(
                (rec["end"] - rec["start"]) / (rec["t"] - prev["t"])
            )
    return {w: statistics.median(r) for w, r in rates.items()}


SPLIT = ("seconds", "boundary_s", "reform_s", "transfer_s", "first_step_s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    mb = state_mb(args.width, args.depth)
    print(f"== {mb:.0f} MiB of state per rank, 4 simulated nodes, global batch {GLOBAL_BATCH}", flush=True)
    rows: dict[str, list[dict]] = {"spare": [], "shrink": [], "grow": [], "release": []}
    grow_req, tput = [], []
    with tempfile.TemporaryDirectory(prefix="sres-bench-elastic-") as tmp:
        work = Path(tmp)
        for i in range(args.repeat):
            d = run(work, "spare", args.width, args.depth, 14, "--spares", "1", "--inject", "node:1:step=6")
            rec = next(e for e in read_events(d / "events.jsonl") if e["event"] == "recovered")
            rows["spare"].append({**rec, "boundary_s": None})
            d = run(
                work,
                "elastic",
                args.width,
                args.depth,
                args.steps,
                "--min-nodes",
                "3",
                "--inject",
                "node:1:step=6",
                control=resize_then_back,
            )
            resizes = [e for e in read_events(d / "events.jsonl") if e["event"] == "resize"]
            rows["shrink"].append(next(e for e in resizes if e["why"] == "fault"))
            rows["grow"].append(next(e for e in resizes if e["to_world"] == 4))
            rows["release"].append(next(e for e in resizes if e["why"] == "request" and e["to_world"] == 3))
            grow_req.append(float((d / "grow-request-s").read_text()))
            tput.append(throughput(d))
            print(
                f"  trial {i + 1}: "
                + ", ".join(f"{k} {v[-1]['seconds']:.3f} s" for k, v in rows.items())
                + f", grow from the request {grow_req[-1]:.2f} s; samples/s "
                + ", ".join(f"{w} ranks {v:.1f}" for w, v in sorted(tput[-1].items())),
                flush=True,
            )
    med = statistics.median

    def cell(events: list[dict], key: str) -> str:
        values = [e[key] for e in events if e.get(key) is not None]
        return f"{med(values):.3f} ({min(values):.2f}-{max(values):.2f})" if values else "-"

    print(f"\nResize at {mb:.0f} MiB per rank, median of {args.repeat} (min-max), seconds")
    print("| | total | wait for the step boundary | re-form | transfer | first step |")
    print("|---|---|---|---|---|---|")
    labels = {
        "spare": "spare replacement after a node loss (baseline)",
        "shrink": "shrink 4->3 after a node loss",
        "grow": "grow 3->4 on request (from the pause)",
        "release": "shrink 4->3 on request (from the pause)",
    }
    for name, label in labels.items():
        print(f"| {label} | " + " | ".join(cell(rows[name], k) for k in SPLIT) + " |")
    print(
        f"\ngrow from the request (includes starting the node's processes): {med(grow_req):.2f} s "
        f"({min(grow_req):.2f}-{max(grow_req):.2f})"
    )
    shrink, spare = med(e["seconds"] for e in rows["shrink"]), med(e["seconds"] for e in rows["spare"])
    print(f"shrink after a loss vs spare replacement: {shrink / spare:.2f}x")
    print("\nThroughput (samples/s, median of steps between commits)")
    for world in (4, 3):
        values = [t[world] for t in tput if world in t]
        if values:
            print(f"  {world} ranks: {med(values):.1f}  ({min(values):.1f}-{max(values):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
