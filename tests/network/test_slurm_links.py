"""The network tests' cut, under Slurm: each slurmd in a network namespace of its own, at its own
address (``SlurmCluster(network=...)``), so that everything a job starts on a node -- the batch
script and the supervisor on the first, each rank's ``srun`` step on the others -- lives behind
that node's link. The test takes a link down from outside, as a switch port does; Slurm itself,
sres and the ranks see only what they would see on a cluster.

What a user checks: the job completes with the bits of the same run without the cut; the cut-off
node is drained as unreachable, not dead; its rank, alive but silent, fenced itself and wrote no
tier copy after it was replaced.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from launcher.run.leftovers import pid_alive
from launcher.supervisor.policy.classify import UNREACHABLE
from tests.support.fencing_checks import stale_copies
from tests.support.netns import DEV, Network, available
from tests.support.running_cluster import running
from tests.support.slurm_cluster import SlurmCluster
from tests.support.sres_runs import slot_pids
from tests.support.training_jobs import STEPS, sres_srun, submit_training

pytestmark = [pytest.mark.network, pytest.mark.cluster]  # cluster: the lane of the Slurm tests


@pytest.fixture(scope="module")
def netns_cluster(tmp_path_factory) -> Iterator[tuple[SlurmCluster, Network]]:
    """Four nodes in namespaces on one bridge; slurmctld on the bridge's address."""
    why = available()
    if why is not None:
        pytest.fail(f"the network tests need namespaces: {why}")
    net = Network(4)
    try:
        net.up()
        cluster = SlurmCluster(tmp_path_factory.mktemp("netns-slurm"), node_count=4, network=net)
        with running(cluster, "Slurm test cluster in namespaces"):
            yield cluster, net
    finally:
        net.down()


def test_under_slurm_a_node_cut_off_is_drained_as_unreachable_and_its_rank_fences_itself(
    netns_cluster, tmp_path, reference3
):
    """At step 6 the link of the node holding rank 1 goes down for good. Its liveness connection
    goes silent (no reset crosses a cut); after the hang timeout the supervisor finds the node's
    slurmd silent too (not refused, as a dead slurmd's port is): unreachable. The idle node takes
    the rank; the cut-off rank's lease runs out and it ends itself."""
    cluster, net = netns_cluster
    cluster.reset()
    srun = sres_srun(tmp_path / "run", "--auto-resume=1", "-N", "3")
    job = submit_training(
        cluster, tmp_path, ["-N4", "--no-kill", "--requeue"], f"export GLOO_SOCKET_IFNAME={DEV}\n{srun}"
    )
    job.wait_step(6)
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
