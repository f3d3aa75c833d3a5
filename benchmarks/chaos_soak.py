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
from launcher.observability.events import read_events  # noqa: E402
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
    code = subprocess.run(cmd, cwd=ROOT).returncode
    print(takeover_table(read_events(log_dir / "chaos" / "events.jsonl")))
    return code


TAKEOVERS = (
    ("forked", "a rank forked from its machine's fork server"),
    ("standby", "a standby (warm or still warming up)"),
    ("spare", "a spare or returned node"),
    ("respawn", "a cold start"),
    ("all", "every process lost (kill-all): cold or forked, state from the tiers"),
    ("none", "nobody: an exception, same processes"),
)


def takeover(replaced: list[dict], world: int) -> str:
    """What took over in one recovery: the slowest way any of its ranks came back."""
    if not replaced:
        return "none"
    if len(replaced) >= world:
        return "all"
    hows = {r["how"] for r in replaced}
    if "respawn" in hows:
        return "respawn"
    if hows - {"standby", "forked"}:  # a node's source: spare, idle, satellite, ...
        return "spare"
    return "standby" if "standby" in hows else "forked"


def takeover_table(events: list[dict]) -> str:
    """Recovery seconds by what took over the lost ranks (the ``replaced`` events published with
    that generation); a generation that logs several ``recovered`` counts once, its slowest."""
    taken: dict[int, str] = {}
    seconds: dict[int, float] = {}
    replaced: list[dict] = []
    for event in events:
        if event["event"] == "replaced":
            replaced.append(event)
        elif event["event"] == "generation":
            taken[event["generation"]] = takeover(replaced, event["world_size"])
            replaced = []
        elif event["event"] == "recovered":
            g = event["generation"]
            seconds[g] = max(seconds.get(g, 0.0), event["seconds"])
    by: dict[str, list[float]] = {}
    for g, s in seconds.items():
        by.setdefault(taken.get(g, "none"), []).append(s)
    lines = ["| taken over by | n | p50 | p90 | p99 | max |", "|---|---|---|---|---|---|"]
    for key, label in (*TAKEOVERS, ("total", "all recoveries")):
        values = sorted(list(seconds.values()) if key == "total" else by.get(key, []))
        if values:
            cells = " | ".join(f"{_percentile(values, q):.2f}" for q in (0.5, 0.9, 0.99))
            lines.append(f"| {label} | {len(values)} | {cells} | {values[-1]:.2f} |")
    return "\n".join(lines)


def _percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


if __name__ == "__main__":
    sys.exit(main())
