"""A long soak: hundreds of seeded random faults in one training run, judged by ``sres chaos``.

The run and its fault-free reference train the example MLP at about 60 MiB of parameters +
AdamW state per rank on 4 simulated nodes + 1 warm spare, tiers on (RAM and neighbour), and
the chaos run gets ``--faults`` random faults of every in-process kind (``--kinds``), one per
``--every`` steps on average. Drained nodes come back repaired (``--repair-after``), as the
health hooks' resume brings them back on a cluster. It prints progress every 25 faults and
ends with ``sres chaos``'s table: faults by kind, recovery-time percentiles by kind (p50 /
p90 / p99), steps lost, goodput against the reference, bad copies refused, and the verdict:
the final state of every rank bit for bit the reference's, nothing of either run left.

    python benchmarks/chaos_soak.py [--faults 500] [--seed 1] [--every 4] [--mib 64]

Exit status: ``sres chaos``'s (0 only when identical and clean). A fault costs about 5 s on
a 2-core machine (most recoveries start a process: torch's import), so 500 faults take about
45 minutes at ``--mib 2`` (the example's own size) and longer at 64 MiB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.recovery import SHAPES  # noqa: E402
from resilience.agent.fault_schedule import KINDS  # noqa: E402
from resilience.examples.train_mlp import state_mb  # noqa: E402

IN_PROCESS_KINDS = tuple(k for k in KINDS if k not in ("kill-during-copy", "fill-disk"))
"""Every kind a data-parallel run with RAM and neighbour tiers meets (``kill-during-copy``
needs sharded state, ``fill-disk`` a persistent tier on a small filesystem: see
tests/inprocess/test_chaos.py)."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=int, default=500)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--every", type=float, default=4.0)
    p.add_argument("--kinds", default=",".join(IN_PROCESS_KINDS))
    p.add_argument(
        "--mib", type=int, choices=(2, *SHAPES), default=64, help="state per rank (2: the example's own)"
    )
    p.add_argument("--log-dir", type=Path, default=None)
    args = p.parse_args()
    steps = int(args.faults * args.every * 1.3) + 40  # the schedule ends well before the run
    model = (
        []
        if args.mib == 2
        else [
            "--width",
            str(SHAPES[args.mib][0]),
            "--depth",
            str(SHAPES[args.mib][1]),
            "--batch",
            str(SHAPES[args.mib][2]),
        ]
    )
    if model:
        print(f"state per rank: {state_mb(SHAPES[args.mib][0], SHAPES[args.mib][1]):.0f} MiB", flush=True)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="sres-soak-"))
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "chaos",
        "--faults",
        str(args.faults),
        "--seed",
        str(args.seed),
        "--every",
        str(args.every),
        "--kinds",
        args.kinds,
        "--log-dir",
        str(log_dir),
        "--progress-every",
        "25",
        "--",
        "--nodes",
        "4",
        "--spares",
        "1",
        "--hang-timeout",
        "3",
        "--reform-timeout",
        "30",
        "--",
        sys.executable,
        "-m",
        "resilience.examples.train_mlp",
        "--steps",
        str(steps),
        "--progress-every",
        "100000",
        *model,
    ]
    print(
        f"soak: {args.faults} faults (seed {args.seed}, one per {args.every:g} steps), {steps} steps; logs "
        f"{log_dir}",
        flush=True,
    )
    return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main())
