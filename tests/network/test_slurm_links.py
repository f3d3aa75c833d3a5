"""The network tests' cut, under Slurm: each slurmd in a network namespace of its own, at its own
address (``SlurmCluster(network=...)``), so that everything a job starts on a node -- the batch
script and the supervisor on the first, each rank's ``srun`` step on the others -- lives behind
that node's link. The test takes a link down from outside, as a switch port does; Slurm itself,
sres and the ranks see only what they would see on a cluster.

What a user checks: the job completes with the bits of the same run without the cut; the cut-off
node is drained as unreachable, not dead; its rank, alive but silent, fenced itself and wrote no
tier copy after it was replaced. When the cut is the supervisor's own (the batch host's link), no
node is blamed, every rank it cannot reach fences itself, and the job is requeued once the link is
back, then ends with the same bits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.run.leftovers import pid_alive
from launcher.supervisor.policy.classify import ISOLATED, UNREACHABLE
from tests.support.fencing_checks import stale_copies
from tests.support.netns import DEV, Network, available
from tests.support.running_cluster import running
from tests.support.slurm_cluster import SlurmCluster
from tests.support.sres_runs import slot_pids
from tests.support.training_jobs import STEPS, TrainingJob, sres_srun, submit_training

pytestmark = [pytest.mark.network, pytest.mark.cluster]  # cluster: the lane of the Slurm tests

SLURMD_TIMEOUT_S = 60
"""Slurm's own silence limit for a node, far above sres's (``--hang-timeout 5``), as on clusters
(often 300 s): sres acts on a cut first. Past it, Slurm kills a ``--no-kill`` job's batch step
on a node it sets down, and a supervisor cut off on that node can no longer requeue its job."""


@pytest.fixture(scope="module")
def netns_cluster(tmp_path_factory) -> Iterator[tuple[SlurmCluster, Network]]:
    """Four nodes in namespaces on one bridge; slurmctld on the bridge's address."""
    why = available()
    if why is not None:
        pytest.fail(f"the network tests need namespaces: {why}")
    net = Network(4)
    try:
        net.up()
        directory = tmp_path_factory.mktemp("netns-slurm")
        cluster = SlurmCluster(directory, node_count=4, slurmd_timeout=SLURMD_TIMEOUT_S, network=net)
        with running(cluster, "Slurm test cluster in namespaces"):
            yield cluster, net
    finally:
        net.down()


def training(cluster: SlurmCluster, tmp_path: Path, nodes: int, step: int) -> TrainingJob:
    """3 ranks under ``sres srun --auto-resume=1`` in a job of ``nodes`` nodes, at ``step``; gloo
    told the namespaces' interface (its own guess, the hostname, is this machine's loopback)."""
    cluster.reset()
    srun = sres_srun(tmp_path / "run", "--auto-resume=1", "-N", "3")
    script = f"export GLOO_SOCKET_IFNAME={DEV}\n{srun}"
    job = submit_training(cluster, tmp_path, [f"-N{nodes}", "--no-kill", "--requeue"], script)
    job.wait_step(step)
    return job


def test_under_slurm_a_node_cut_off_is_drained_as_unreachable_and_its_rank_fences_itself(
    netns_cluster, tmp_path, reference3
):
    """At step 6 the link of the node holding rank 1 goes down for good. Its liveness connection
    goes silent (no reset crosses a cut); after the hang timeout the supervisor finds the node's
    slurmd silent too (not refused, as a dead slurmd's port is): unreachable. The idle node takes
    the rank; the cut-off rank's lease runs out and it ends itself."""
    cluster, net = netns_cluster
    job = training(cluster, tmp_path, nodes=4, step=6)
    victim, spare = job.hosts()[1], job.hosts()[3]
    node = cluster.nodes.index(victim)
    rank = slot_pids(job.log_dir, "n1p0")  # rank 1: sres's node 1, its first process
    assert rank, "no process of rank 1 found"
    cut_t = time.time()
    net.cut(node)
    try:
        done = job.wait_done(timeout=240)
        assert done.state == "COMPLETED", job.output
        assert job.digests() == reference3, job.output
        assert job.of("finished")[-1]["steps"] == STEPS
        (fault,) = job.of("fault")
        assert (fault["kind"], fault["host"], fault["rank"], fault["why"]) == ("node", victim, 1, UNREACHABLE)
        assert job.client.node(victim).reason == f"sres: {UNREACHABLE}"
        (replaced,) = job.of("replaced")
        assert (replaced["host"], replaced["how"]) == (spare, "spare")
        assert fault["t"] - cut_t < 5 + 3, job.events  # --hang-timeout 5, the probe's second, a tick
        assert stale_copies(job.of, job.job_id) == []
        # Its node's fork server (no lease, no state, nothing to write) lives on until the link is
        # back and slurmd ends the job's processes; the rank must have ended itself.
        assert not [p for p in rank if pid_alive(p)], "the cut-off rank did not fence itself"
    finally:
        net.heal(node)


def test_under_slurm_the_supervisor_cut_off_requeues_once_its_link_is_back_and_ends_exact(
    netns_cluster, tmp_path, reference3
):
    """At step 8 the batch host's link goes down: the supervisor and rank 0 on one side, the other
    two ranks and slurmctld on the other. Slurm marks the batch host down but keeps a ``--no-kill``
    job running; the two ranks fence themselves; the supervisor finds every other node silent and
    slurmctld too, blames and drains no node, and asks for a requeue until Slurm answers. The link
    comes back; the job is requeued, resumes from the tiers, and ends with the uncut bits."""
    cluster, net = netns_cluster
    job = training(cluster, tmp_path, nodes=3, step=8)
    hosts = job.hosts()
    others = {p for slot in ("n1p0", "n2p0") for p in slot_pids(job.log_dir, slot)}
    node = cluster.nodes.index(hosts[0])
    net.cut(node)
    try:
        deadline = time.monotonic() + 120
        while not job.of("requeue"):
            assert time.monotonic() < deadline, job.events[-10:]
            time.sleep(0.5)
        assert ISOLATED.format(nodes=2) in job.of("requeue")[0]["why"]
        assert not job.of("drained") and not job.of("fault"), job.events  # no node blamed
        fenced = not [p for p in others if pid_alive(p)]
        assert fenced, "a rank cut off from the supervisor did not fence itself"
    finally:
        net.heal(node)
    done = job.wait_done(timeout=240)
    assert done.state == "COMPLETED" and done.restart_count == 1, job.output
    assert job.digests() == reference3, job.output
    reasons = {name: job.client.node(name).reason for name in cluster.nodes}
    assert not [r for r in reasons.values() if r.startswith("sres:")], reasons  # sres drained none
