"""Nodes lent by the scheduler and taken back, on a real local Slurm cluster.

Starts its own 4-node cluster (tests/support/slurm_cluster.py; root and slurm-wlm needed) with a
low-priority partition ``lend`` (PreemptMode=CANCEL, GraceTime) and a high-priority one
``urgent``. Per round, a 2-node training job with ``--max-nodes 4 --lend-partition lend``
grows by two satellites; a 2-node job submitted to ``urgent`` preempts them; when it ends,
the training grows back. Each transition is split into Slurm's part (reported, not ours) and
ours:

  preemption  urgent submitted -> the satellites' ranks get SIGTERM   (Slurm: scheduling)
              SIGTERM -> training resumed on the smaller world        (ours: relay, pause at the
                                                                       step boundary, re-form,
                                                                       first step)
  growth      the nodes idle again -> the satellites running          (Slurm: sbatch + scheduling)
              the rest, to the first step on the larger world         (ours: noticing the idle nodes
                                                                       (sinfo every 3 s), the new
                                                                       ranks' start-up, pause,
                                                                       re-form, first step)

Baseline, measured in the same run: what a preempted job that does not shrink gracefully
has left before Slurm kills it (SIGTERM -> job ended: the partition's GraceTime + KillWait),
i.e. the time such a run loses before its recovery even starts.

    python benchmarks/lending.py [--rounds 3] [--grace 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from launcher.slurm.client import SlurmClient  # noqa: E402
from tests.support.slurm_cluster import SlurmCluster  # noqa: E402
from tests.support.training_jobs import TrainingJob, sres_srun, submit_training, wait_job  # noqa: E402

ELASTIC = ("--dataset", "320", "--global-batch", "32", "--micro-batch", "4")
ROWS = (
    "preemption: Slurm",
    "preemption: ours",
    "growth: Slurm",
    "growth: ours",
    "  noticing idle",
    "  rank start-up",
    "  pause to 1st step",
)


def _until(job: TrainingJob, ready, what: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline or job.client.job(job.job_id).finished:
            raise SystemExit(f"no {what}:\n{job.output}")
        time.sleep(0.05)


def one_round(cluster: SlurmCluster, tmp: Path) -> dict[str, float]:
    cluster.reset()
    job = submit_training(
        cluster,
        tmp,
        ["-N2", "--no-kill"],
        sres_srun(
            tmp / "run",
            "--auto-resume=2",
            "-N",
            "2",
            "--max-nodes",
            "4",
            "--lend-partition",
            "lend",
            "--grow-snooze",
            "1",
            "--no-tiers",
        ),
        sleep=0.15,
        train_args=("--steps", "400", *ELASTIC),
    )
    _until(job, lambda: len(job.of("resize")) >= 1, "growth to 4")
    lent = [e["host"] for e in job.of("node-added")]
    submitted = time.time()
    urgent = job.client.submit(
        [
            "--partition=urgent",
            "--nodes=2",
            f"--nodelist={','.join(lent)}",
            f"--output={tmp / 'urgent.out'}",
            "--wrap=sleep 5",
        ]
    )
    _until(job, lambda: len(job.of("resize")) >= 2, "shrink")
    wait_job(job.client, urgent, lambda j: j.finished, timeout=120)
    freed = _nodes_idle_at(cluster, lent)
    _until(job, lambda: len(job.of("resize")) >= 3, "growth back")
    done = job.wait_done(timeout=300)
    if done.state != "COMPLETED":
        raise SystemExit(f"job {job.job_id} ended {done.state}:\n{job.output}")
    signal_t = min(e["t"] for e in job.of("reclaim-signal"))
    shrink, regrow = job.of("resize")[1], job.of("resize")[2]
    added = job.of("node-added")[2:]
    scheduling = sum(e["seconds"] for e in added)
    decided = added[0]["t"] - added[0]["seconds"]  # the first satellite's sbatch
    paused = regrow["t"] - regrow["seconds"]  # every new rank warm: the pause begins
    return {
        "preemption: Slurm": signal_t - submitted,
        "preemption: ours": shrink["t"] - signal_t,
        "growth: Slurm": scheduling,
        "growth: ours": regrow["t"] - freed - scheduling,
        "  noticing idle": decided - freed,
        "  rank start-up": paused - added[-1]["t"],
        "  pause to 1st step": regrow["seconds"],
    }


def _nodes_idle_at(cluster: SlurmCluster, nodes: list[str]) -> float:
    """When every node is idle again (polled at 20 Hz): the moment they can be lent."""
    while not all(cluster.node_states()[n] == "IDLE" for n in nodes):
        time.sleep(0.05)
    return time.time()


def grace_baseline(cluster: SlurmCluster, tmp: Path) -> float:
    """SIGTERM -> a preempted lend job that ignores it is ended by Slurm."""
    cluster.reset()
    log = tmp / "grace.log"
    script = f"trap 'echo $(date +%s.%N) >> {log}' TERM; while true; do sleep 0.1; done"
    client = SlurmClient.create("cli", env=cluster.env())
    victim = client.submit(
        [
            "--partition=lend",
            "--nodes=1",
            "--exclusive",
            "--output=/dev/null",
            f'--wrap=srun bash -c "{script}"',
        ]
    )
    wait_job(client, victim, lambda j: j.running and bool(j.nodes))
    time.sleep(1)
    node = client.job(victim).nodes[0]
    client.submit(
        ["--partition=urgent", "--nodes=1", f"--nodelist={node}", "--output=/dev/null", "--wrap=true"]
    )
    wait_job(client, victim, lambda j: j.finished, timeout=120)
    return time.time() - float(log.read_text().split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grace", type=int, default=10, help="GraceTime of the lend partition (seconds)")
    args = parser.parse_args()
    runs: list[dict[str, float]] = []
    with (
        tempfile.TemporaryDirectory(prefix="sres-bench-") as tmp,
        SlurmCluster(Path(tmp) / "cluster", node_count=4, grace_time=args.grace) as cluster,
    ):
        baseline = grace_baseline(cluster, Path(tmp))
        for r in range(args.rounds):
            run_dir = Path(tmp) / f"round-{r}"
            run_dir.mkdir()
            runs.append(one_round(cluster, run_dir))
            print(
                f"round {r + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in runs[-1].items()), file=sys.stderr
            )
    print(
        "\nlent nodes taken back and lent again, 2 -> 4 -> 2 -> 4 nodes, local cluster, "
        f"GraceTime={args.grace} s, "
        f"{args.rounds} round(s)"
    )
    print(f"{'seconds':22} {'median':>8} {'min':>8} {'max':>8}")
    for row in ROWS:
        values = [run[row] for run in runs]
        print(f"{row:22} {statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f}")
    ours = statistics.median(run["preemption: ours"] for run in runs)
    print(
        f"{'baseline: grace -> kill':22} {baseline:8.2f}   (SIGTERM -> job ended: what a run that does not "
        "shrink has left, before its recovery starts)"
    )
    print(
        f"preempted lent nodes leave {ours:.2f} s after Slurm's signal: {baseline / ours:.1f}x inside the "
        "grace "
        "period; training never stops"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
