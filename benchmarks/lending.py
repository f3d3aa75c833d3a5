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
  growth      the last node back: idle again -> its satellite running (Slurm: sbatch + scheduling)
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


def one_round(cluster: SlurmCluster, tmp: Path, cold: bool = False) -> dict[str, float]:
    """``cold``: every rank starts cold (``--no-fork-server``), the baseline for the new ranks'
    start-up; otherwise each satellite's ranks are forked from its own fork server."""
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
            *(["--no-fork-server"] if cold else []),
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
    freed = _nodes_idle_at(cluster, lent, job)
    _until(job, lambda: len(job.of("resize")) >= 3, "growth back")
    done = job.wait_done(timeout=300)
    if done.state != "COMPLETED":
        raise SystemExit(f"job {job.job_id} ended {done.state}:\n{job.output}")
    signal_t = min(e["t"] for e in job.of("reclaim-signal"))
    shrink = job.of("resize")[1]
    regrowth = job.of("resize")[2:]  # one resize for both nodes, or one each
    added = job.of("node-added")[2:]
    if not cold and (any(e.get("forked") != 1 for e in added) or job.of("fork-fallback")):
        raise SystemExit(f"the regrown nodes' ranks were not forked:\n{job.output}")
    times = {
        "preemption: Slurm": signal_t - submitted,
        "preemption: ours": shrink["t"] - signal_t,
    }
    return times | _growth(added[-1], regrowth[-1], freed)


def _growth(added: dict, resize: dict, freed: float) -> dict[str, float]:
    """The last node back, from idle to the first step with it. A satellite sbatch'ed before the
    node was idle (Slurm started it when it was) noticed nothing: its queue time is Slurm's."""
    submitted = added["t"] - added["seconds"]
    paused = resize["t"] - resize["seconds"]  # every new rank warm: the pause begins
    split = {
        "  noticing idle": max(0.0, submitted - freed),
        "  rank start-up": paused - added["t"],
        "  pause to 1st step": resize["seconds"],
    }
    return {
        "growth: Slurm": added["t"] - max(submitted, freed),
        "growth: ours": sum(split.values()),
        **split,
    }


def _nodes_idle_at(cluster: SlurmCluster, nodes: list[str], job: TrainingJob) -> float:
    """When every node is idle again (polled at 20 Hz): the moment they can be lent. Where the run
    took one back before this saw them all idle, the first satellite's sbatch bounds it."""
    while not all(cluster.node_states()[n] == "IDLE" for n in nodes):
        regrown = job.of("node-added")[2:]
        if regrown:
            return regrown[0]["t"] - regrown[0]["seconds"]
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
    parser.add_argument(
        "--cold-rounds", type=int, default=1, help="rounds with --no-fork-server: the start-up's baseline"
    )
    args = parser.parse_args()
    runs: list[dict[str, float]] = []
    colds: list[dict[str, float]] = []
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
        for r in range(args.cold_rounds):
            run_dir = Path(tmp) / f"cold-{r}"
            run_dir.mkdir()
            colds.append(one_round(cluster, run_dir, cold=True))
            print(
                f"cold {r + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in colds[-1].items()), file=sys.stderr
            )
    print(
        "\nlent nodes taken back and lent again, 2 -> 4 -> 2 -> 4 nodes, local cluster, "
        f"GraceTime={args.grace} s, "
        f"{args.rounds} round(s)"
    )
    print(f"{'seconds':22} {'median':>8} {'min':>8} {'max':>8} {'cold (median)':>14}")
    for row in ROWS:
        values = [run[row] for run in runs]
        cold = f"{statistics.median(run[row] for run in colds):14.2f}" if colds else ""
        print(f"{row:22} {statistics.median(values):8.2f} {min(values):8.2f} {max(values):8.2f} {cold}")
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
