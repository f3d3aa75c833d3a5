"""What making a run safe on a shared cluster costs: this tree against an earlier commit,
interleaved, on the two paths the authentication sits on.

  neighbour copy  one rank's RAM-tier checkpoint (--mib MiB, float32) pushed over loopback TCP
                  into a neighbour server and confirmed, GB/s (median of --repeat pushes per
                  trial). After: a challenge, the header's HMAC over the manifest's SHA-256.
  checkpoint load the same checkpoint loaded from /dev/shm with checksums verified (after: the
                  file-owner check before the header is read), ms.

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
state = {"w": torch.randn(mib * 2**18)}
src = mf.write(base / "own", "bench", 1, 1, 0, {"replicated": snapshot.capture(state, 1)})
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
print(json.dumps({"gbps": size / statistics.median(pushes) / 1e9, "load_ms": statistics.median(loads) * 1e3}))
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
    for key, label in (("gbps", "neighbour GB/s"), ("load_ms", "load ms")):
        b = statistics.median(r[key] for r in results["before"])
        a = statistics.median(r[key] for r in results["after"])
        print(f"{label:16}{b:>12.3f}{a:>12.3f}{a / b:>13.3f}x")


if __name__ == "__main__":
    main()
