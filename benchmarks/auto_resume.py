"""From a node kill to training resumed on the replacement, on a real local Slurm cluster.

Starts its own 5-node cluster (tests/support/slurm_cluster.py; root and slurm-wlm needed) and runs a
3-node training job under ``sres srun`` three times per round: once with a warm spare node held
by the job, and twice with none: a satellite job takes the lost ranks (the default), or the
job grows into an idle node by expansion (``--grow-by expansion``). Each run kills one
training node's slurmd and every process on it mid-run, then splits the time from the kill
to the first step on the replacement into:

  detection    kill -> the supervisor's fault event (its own watch: liveness socket + slurmd probe)
  drain        the drain of the dead node (scontrol), and the shrink of the job
  replacement  spare: nothing to do; satellite: sbatch until it runs; expansion: allocating and
               merging a new node
  re-form      from the fault to the new generation's process group (includes the new node's
               start for a satellite or an expansion: its fork server's, then a fork; ``sat.
               cold``, the baseline in the same run: the rank started cold)
  transfer     state to the replaced ranks from peers
  first step   the first training step of the new generation

Baseline, measured in the same run: how long Slurm itself takes to declare the killed node
dead (not responding / DOWN), i.e. what any recovery that waits for Slurm starts with.

    python benchmarks/auto_resume.py [--rounds 3] [--slurmd-timeout 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.slurm_cluster import SlurmCluster  # noqa: E402
from tests.support.training_jobs import sres_srun, submit_training  # noqa: E402

PHASES = ("detection", "drain", "replacement", "re-form", "transfer", "first step", "kill -> resumed")


KINDS = {
    "spare": ("-N4", ()),
    "satellite": ("-N3", ()),
    "expansion": ("-N3", ("--grow-by", "expansion")),
    "sat. cold": ("-N3", ("--no-fork-server",)),
}
"""``sat. cold``: the baseline for the new node's start-up, a satellite whose rank starts cold
(``--no-fork-server``), where the others fork theirs from the node's own fork server."""


def one_run(cluster: SlurmCluster, tmp: Path, kind: str) -> tuple[dict[str, float], float]:
    """Kill a node mid-run; return the phase split and Slurm's own time to see the node dead."""
    cluster.reset()
    nodes, flags = KINDS[kind]
    job = submit_training(
        cluster,
        tmp,
        [nodes, "--no-kill", "--requeue"],
        sres_srun(tmp / "run", "--auto-resume=1", *flags, "-N", "3"),
    )
    job.wait_step(6)
    victim = job.hosts()[1]
    slurm_saw: list[float] = []

    def watch_slurm() -> None:
        while time.time() - kill_t < 60:
            node = job.client.node(victim)
            if not node.responding:
                slurm_saw.append(time.time() - kill_t)
                return
            time.sleep(0.1)

    kill_t = time.time()
    cluster.kill_node(victim)
    watcher = threading.Thread(target=watch_slurm, daemon=True)
    watcher.start()
    done = job.wait_done()
    watcher.join(timeout=60)
    if done.state != "COMPLETED":
        raise SystemExit(f"job {job.job_id} ended {done.state}:\n{job.output}")
    (fault,) = job.of("fault")
    (drained,) = job.of("drained")
    (replaced,) = job.of("replaced")
    (recovered,) = job.of("recovered")
    added = job.of("node-added")
    if kind in ("satellite", "expansion") and (added[0].get("forked") != 1 or job.of("fork-fallback")):
        raise SystemExit(f"{kind}: the new node's rank was not forked:\n{job.output}")
    split = {
        "detection": fault["t"] - kill_t,
        "drain": drained["seconds"],
        "replacement": added[0]["seconds"] if added else replaced["t"] - fault["t"],
        "re-form": recovered["reform_s"],
        "transfer": recovered["transfer_s"],
        "first step": recovered["first_step_s"],
        "kill -> resumed": fault["t"] - kill_t + recovered["seconds"],
    }
    return split, slurm_saw[0] if slurm_saw else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slurmd-timeout", type=int, default=10)
    args = parser.parse_args()
    results: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    slurm: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="sres-bench-") as tmp,
        SlurmCluster(Path(tmp) / "cluster", node_count=5, slurmd_timeout=args.slurmd_timeout) as cluster,
    ):
        for r in range(args.rounds):
            for kind in results:
                run_dir = Path(tmp) / f"{kind}-{r}"
                run_dir.mkdir()
                split, seen = one_run(cluster, run_dir, kind)
                results[kind].append(split)
                slurm.append(seen)
                print(
                    f"round {r + 1} {kind:9}: resumed {split['kill -> resumed']:.2f} s after the kill; "
                    f"Slurm saw the node dead after {seen:.1f} s",
                    file=sys.stderr,
                )
    print(
        f"\nnode kill -> training resumed, 3-node job, local cluster, SlurmdTimeout={args.slurmd_timeout}, "
        f"median of {args.rounds}"
    )
    print(f"{'phase':18}" + "".join(f" {kind + ' (s)':>15}" for kind in results))
    for phase in PHASES:
        print(
            f"{phase:18}"
            + "".join(f" {statistics.median(run[phase] for run in results[k]):15.3f}" for k in results)
        )
    baseline = statistics.median(slurm)
    print(
        f"{'Slurm sees it dead':18} {baseline:10.1f}   (baseline: the earliest any Slurm-driven recovery "
        "can start)"
    )
    for kind in results:
        resumed = statistics.median(run["kill -> resumed"] for run in results[kind])
        print(
            f"{kind}: resumed {resumed:.2f} s after the kill = {baseline / resumed:.1f}x before Slurm even "
            f"declares the node dead"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
