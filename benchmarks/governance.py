"""Task governance on a real local Slurm cluster with accounting (slurmdbd on MariaDB): what the
owner of borrowed nodes waits for, and how much idle capacity borrowing puts to work.

Starts its own 4-node cluster (tests/support/slurm_cluster.py with ``accounting=True``; root,
slurm-wlm, slurmdbd and mariadb-server needed) and applies a policy: teams ``vision`` (quota 2,
weight 3) and ``speech`` (quota 2, weight 1), classes ``high`` and ``low``, the borrow QOS
preempted with ``--grace`` seconds.

1. Claim: vision trains with sres on its 2 nodes and grows onto speech's 2 idle ones through
   ``vision_borrow``; speech submits a 1-node ``high`` job: submission -> it runs. Baseline in the
   same run: the same claim against a borrowed job that does not give nodes back (it ignores
   SIGTERM), which holds them to the end of the grace time (+ KillWait).
2. Mixed workload (``--minutes``; the issue's 30 is long, 5 is the default): vision's sres run
   trains through the whole window, speech submits short jobs now and then (seeded);
   once with borrowing (``--max-nodes 4 --lend-account vision_borrow``), once without
   (``--max-nodes 2``). From sacct, through ``sres governance report``'s own reader: the share of
   the idle capacity (node-seconds the owners' own work left free) that borrowers used, the
   cluster's utilization, and the vision job's goodput over its life (every run of it: a requeue
   starts another).

    python benchmarks/governance.py [--grace 30] [--minutes 5] [--rounds 2] [--arms with,without]

The issue's 30 minutes, both arms at once (each process starts a cluster of its own):

    python benchmarks/governance.py --rounds 0 --minutes 30 --arms with &
    python benchmarks/governance.py --rounds 0 --minutes 30 --arms without
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.governance import policy as gp  # noqa: E402
from launcher.governance.apply import apply  # noqa: E402
from launcher.governance.report import gather  # noqa: E402
from launcher.governance.slurm_objects import conf_lines  # noqa: E402
from launcher.observability import report  # noqa: E402
from launcher.observability.timeline import timeline  # noqa: E402
from launcher.slurm.accounting import Accounting  # noqa: E402
from launcher.slurm.client import SlurmClient  # noqa: E402
from launcher.slurm.command_driver import CommandLine  # noqa: E402
from tests.support.slurm_cluster import SlurmCluster  # noqa: E402
from tests.support.training_jobs import TrainingJob, sres_srun, submit_training, wait_job  # noqa: E402

EXACT = ("--dataset", "200", "--global-batch", "24", "--micro-batch", "2", "--ddp", "exact")


def policy(grace: int) -> dict:
    return {
        "grace_time_s": grace,
        "teams": {
            "vision": {"quota_nodes": 2, "weight": 3, "users": ["root"]},
            "speech": {"quota_nodes": 2, "weight": 1, "users": ["root"]},
        },
        "priority_classes": {"high": {"priority": 400}, "low": {"priority": 100}},
    }


def _until(job: TrainingJob, ready, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline or job.client.job(job.job_id).finished:
            raise SystemExit(f"no {what}:\n{job.output[-4000:]}")
        time.sleep(0.1)


def _vision(cluster: SlurmCluster, tmp: Path, steps: int, borrow: bool) -> TrainingJob:
    grow = ["--max-nodes", "4", "--lend-account", "vision_borrow"] if borrow else ["--max-nodes", "2"]
    return submit_training(
        cluster,
        tmp,
        ["-N2", "--no-kill", "--exclusive", "--account=vision", "--qos=low"],
        sres_srun(tmp / "run", "--auto-resume=2", "-N", "2", *grow, "--grow-snooze", "1", "--no-tiers"),
        sleep=0.15,
        train_args=("--steps", str(steps), *EXACT),
    )


def claim_with_sres(cluster: SlurmCluster, tmp: Path) -> float:
    cluster.reset()
    job = _vision(cluster, tmp, 400, borrow=True)
    _until(job, lambda: [e["to_world"] for e in job.of("resize")][:1] == [4], "growth to 4")
    t0 = time.monotonic()
    claim = job.client.submit(
        ["--account=speech", "--qos=high", "--exclusive", "-N1", "--output=/dev/null", "--wrap=sleep 3"]
    )
    wait_job(job.client, claim, lambda j: j.running or j.finished, timeout=120)
    took = time.monotonic() - t0
    job.client.cancel(job.job_id)
    wait_job(job.client, job.job_id, lambda j: j.finished, timeout=60)
    return took


def claim_against_a_holder(cluster: SlurmCluster, tmp: Path) -> float:
    """A borrowed 2-node job whose tasks ignore SIGTERM: Slurm ends it at the grace time."""
    cluster.reset()
    client = SlurmClient.create("cli", env=cluster.env())
    own = client.submit(
        ["--account=vision", "--qos=low", "--exclusive", "-N2", "--output=/dev/null", "--wrap=sleep 600"]
    )
    holder = client.submit(
        [
            "--account=vision_borrow",
            "--exclusive",
            "-N2",
            "--output=/dev/null",
            "--wrap=srun bash -c \"trap '' TERM; while true; do sleep 0.1; done\"",
        ]
    )
    wait_job(client, holder, lambda j: j.running, timeout=60)
    wait_job(client, own, lambda j: j.running, timeout=60)
    time.sleep(1)
    t0 = time.monotonic()
    claim = client.submit(
        ["--account=speech", "--qos=high", "--exclusive", "-N1", "--output=/dev/null", "--wrap=sleep 1"]
    )
    wait_job(client, claim, lambda j: j.running or j.finished, timeout=180)
    took = time.monotonic() - t0
    for job_id in (own, holder):
        client.cancel(job_id)
    return took


def workload(cluster: SlurmCluster, tmp: Path, minutes: float, borrow: bool, seed: int) -> dict[str, float]:
    """``minutes`` of speech's stream while vision trains (a run longer than the window, ended
    after it): what the window saw, from sacct, and the vision run's goodput over its life."""
    cluster.reset()
    rng = random.Random(seed)
    job = _vision(cluster, tmp, 1_000_000, borrow)
    job.wait_step(1, timeout=120)
    since = time.time()
    client = job.client
    while time.time() - since < minutes * 60:
        if client.job(job.job_id).finished:
            raise SystemExit(f"the vision run ended early:\n{job.output[-4000:]}")
        nodes, seconds = rng.choice((1, 2)), rng.uniform(10, 40)
        client.submit(
            [
                "--account=speech",
                f"--qos={rng.choice(('high', 'low'))}",
                "--exclusive",
                f"-N{nodes}",
                "--output=/dev/null",
                f"--wrap=sleep {seconds:.0f}",
            ]
        )
        time.sleep(rng.uniform(20, 60))
    until = time.time()
    goodput, runs = goodput_over_life(job.log_dir)
    for queued in client.driver.jobs():
        if not queued.finished:
            client.cancel(queued.job_id)
    time.sleep(3)  # the last records reach slurmdbd
    accounting = Accounting(CommandLine(env=cluster.env()))
    u = gather(client, accounting, (until - since) / 3600, now=until)
    own = sum(t.node_hours_own for t in u.teams) * 3600
    borrowed = sum(t.node_hours_borrowed for t in u.teams) * 3600
    idle = u.cluster_nodes * (until - since) - own
    return {
        "idle used by borrowers": borrowed / idle if idle else 0.0,
        "utilization": u.utilization,
        "vision goodput": goodput,
        "vision runs": float(runs),
        "resizes": float(len(job.of("resize"))),
        "window s": until - since,
    }


def goodput_over_life(log_dir: Path) -> tuple[float, int]:
    """The job's productive share from its first start to now, over every run of it (a requeue
    starts another; the time it waits in the queue between them counts as lost), and its runs."""
    data = report.load(log_dir)
    starts = [e["t"] for e in data.events if e["event"] == "start"]
    productive, end_t = 0.0, data.end_t
    for t0, t1 in zip(starts, [*starts[1:], math.inf]):
        run = report.RunData(
            timeline([e for e in data.events if t0 <= e["t"] < t1]),
            [s for s in data.steps if t0 <= s["t"] < t1],
        )
        productive += report.causes(run).get("productive", 0.0)
    return (productive / (end_t - starts[0]) if end_t > starts[0] else 0.0), len(starts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grace", type=int, default=30, help="the borrow QOS's GraceTime (seconds)")
    parser.add_argument("--rounds", type=int, default=2, help="claims of each kind")
    parser.add_argument("--minutes", type=float, default=5.0, help="each mixed workload's length")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--arms",
        default="with,without",
        help="which workloads: with borrowing, without, or both (two processes may run one each, on "
        "clusters of their own)",
    )
    parser.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (the runs' logs)")
    args = parser.parse_args()
    pol = policy(args.grace)
    extra = "\n".join(f"{k}={v}" for k, v in conf_lines(gp.from_data(pol)).items())
    with (
        _workdir(args.keep) as tmp,
        SlurmCluster(Path(tmp) / "cluster", node_count=4, accounting=True, extra_conf=extra) as cluster,
    ):
        client = SlurmClient.create("cli", env=cluster.env())
        apply(gp.from_data(pol), client, Accounting(CommandLine(env=cluster.env())), say=lambda line: None)
        sres_claims, held_claims = [], []
        for r in range(args.rounds):
            sres_claims.append(claim_with_sres(cluster, _dir(tmp, f"claim-{r}")))
            held_claims.append(claim_against_a_holder(cluster, _dir(tmp, f"held-{r}")))
            print(
                f"round {r + 1}: claim {sres_claims[-1]:.1f} s (sres), {held_claims[-1]:.1f} s (held)",
                file=sys.stderr,
            )
        arms = [a for a in (("with", True), ("without", False)) if a[0] in args.arms.split(",")]
        mixed = {
            f"{name} borrowing": workload(cluster, _dir(tmp, name), args.minutes, borrow, args.seed)
            for name, borrow in arms
        }
    if sres_claims:
        _print_claims(sres_claims, held_claims, args)
    if mixed:
        _print_mixed(mixed, args)
    print(
        json.dumps(
            {
                "claims_sres_s": sres_claims,
                "claims_held_s": held_claims,
                "grace_s": args.grace,
                "mixed": mixed,
            }
        )
    )
    return 0


def _print_claims(sres_claims: list[float], held_claims: list[float], args: argparse.Namespace) -> None:
    sres_s, held_s = statistics.median(sres_claims), statistics.median(held_claims)
    print(f"\n## An owner's claim on borrowed nodes (grace time {args.grace} s, median of {args.rounds})\n")
    print("| borrower | submission -> owner's job running | against the grace time |")
    print("|---|---|---|")
    elastic = "sres elastic job (gives the node back at a step boundary)"
    print(f"| {elastic} | {sres_s:.1f} s | {sres_s / args.grace:.2f}x |")
    print(f"| a job that holds on (baseline) | {held_s:.1f} s | {held_s / args.grace:.2f}x |")
    print(f"\nsres / baseline: {sres_s / held_s:.2f}x\n")


def _print_mixed(mixed: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    print(f"## A {args.minutes:g}-minute mixed workload (seed {args.seed})\n")
    keys = list(next(iter(mixed.values())))
    print("| | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for name, row in mixed.items():
        print(f"| {name} | " + " | ".join(f"{row[k]:.3f}" for k in keys) + " |")


@contextlib.contextmanager
def _workdir(keep: str | None) -> Iterator[str]:
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="sres-bench-") as tmp:
            yield tmp
    else:
        Path(keep).mkdir(parents=True)
        yield keep


def _dir(tmp: str, name: str) -> Path:
    path = Path(tmp) / name
    path.mkdir()
    return path


if __name__ == "__main__":
    raise SystemExit(main())
