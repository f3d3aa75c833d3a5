"""What making a run safe on a shared cluster costs: this tree against an earlier commit,
interleaved, on the paths the authentication and the data-only format sit on.

The state is a model's: 24 Linear layers and AdamW's state after one step (--mib MiB in all,
float32; 48 parameters, int-keyed optimizer state, tuple betas).

  capture         a commit's copy of that state into a reused snapshot (after 70a6391...82e478b:
                  the skeleton written as JSON rather than pickled), ms.
  RAM write       the snapshot written as a RAM-tier checkpoint in /dev/shm (after 82e478b: a
                  safetensors file), ms.
  neighbour copy  that checkpoint pushed over loopback TCP into a neighbour server and
                  confirmed, GB/s (median of --repeat pushes per trial). After 70a6391: a
                  challenge, the header's HMAC over the manifest's SHA-256.
  checkpoint load the same checkpoint loaded from /dev/shm with checksums verified (after: the
                  file-owner check before the header is read; after 82e478b, read by safe_open), ms.

Each trial runs in a fresh interpreter of that side's tree; sides alternate trial by trial.
Recovery time, the other path, is benchmarks/recovery_path.py --base REF (same method).

    python benchmarks/shared_cluster_cost.py [--base 70a6391] [--mib 256] [--trials 5] [--repeat 5]
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

BASE = "70a6391"
"""main before issue 30's first commit."""

TRIAL = r"""
import inspect, json, shutil, statistics, sys, tempfile, time
from pathlib import Path
import torch
from resilience.state import snapshot
from resilience.tiers import manifest as mf
from resilience.tiers import transport

mib, repeat = int(sys.argv[1]), int(sys.argv[2])
base = Path(tempfile.mkdtemp(prefix="sres-bench-", dir="/dev/shm"))
width = int((mib * 2**20 / (12 * 24)) ** 0.5)
model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(24)])
opt = torch.optim.AdamW(model.parameters())
model(torch.randn(2, width)).sum().backward()
opt.step()
state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
snap = snapshot.capture(state, 1)
captures, writes = [], []
for _ in range(repeat):
    t = time.perf_counter()
    snap = snapshot.capture(state, 1, reuse=snap)
    captures.append(time.perf_counter() - t)
    t = time.perf_counter()
    src = mf.write(base / "own", "bench", 1, 1, 0, {"replicated": snap})
    writes.append(time.perf_counter() - t)
size = sum(p.stat().st_size for p in src.iterdir())
if "secret" in inspect.signature(transport.NeighbourServer).parameters:  # after
    from resilience.contract import run_secret
    server = transport.NeighbourServer(base / "nb", "bench", 1, run_secret.new_secret()).start()
    target = server.link
else:  # before
    server = transport.NeighbourServer(base / "nb", "bench", 1).start()
    target = server.address
pushes, loads = [], []
for _ in range(repeat):
    t = time.perf_counter()
    transport.push_checkpoint(target, src, "bench", 0, 1)
    pushes.append(time.perf_counter() - t)
    m = mf.read_manifest(src, "bench", 1)
    t = time.perf_counter()
    mf.load(src, m, verify=True)
    loads.append(time.perf_counter() - t)
server.stop()
shutil.rmtree(base, ignore_errors=True)
print(json.dumps({
    "capture_ms": statistics.median(captures) * 1e3,
    "write_ms": statistics.median(writes) * 1e3,
    "gbps": size / statistics.median(pushes) / 1e9,
    "load_ms": statistics.median(loads) * 1e3,
}))
"""


def trial(repo: Path, mib: int, repeat: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", TRIAL, str(mib), str(repeat)],
        cwd=repo,
        env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", default=BASE)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, worktree(args.base, Path(tmp) / "base") as before:
        results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
        for i in range(args.trials):
            for side, repo in (("before", before), ("after", ROOT)):
                results[side].append(trial(repo, args.mib, args.repeat))
                print(f"trial {i + 1} {side:6}: {results[side][-1]}", flush=True)
    print(f"\n{args.mib} MiB, {args.trials} trials x {args.repeat}, before = {args.base}, after = this tree")
    print(f"{'':16}{'before':>12}{'after':>12}{'after/before':>14}")
    for key, label in (
        ("capture_ms", "capture ms"),
        ("write_ms", "RAM write ms"),
        ("gbps", "neighbour GB/s"),
        ("load_ms", "load ms"),
    ):
        b = statistics.median(r[key] for r in results["before"])
        a = statistics.median(r[key] for r in results["after"])
        print(f"{label:16}{b:>12.3f}{a:>12.3f}{a / b:>13.3f}x")


if __name__ == "__main__":
    main()
