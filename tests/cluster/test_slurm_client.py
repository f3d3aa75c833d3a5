"""SlurmClient against the real local cluster: jobs, drains, shrink/grow, node death."""

from __future__ import annotations

import subprocess
import time

import pytest

from launcher.errors import ConfigError, SlurmError
from launcher.slurm.discovery import discover
from launcher.slurm.types import REASON_PREFIX
from tests.support.training_jobs import wait_job
from tests.support.slurm_cluster import pid_alive, processes_with_env

pytestmark = pytest.mark.cluster


def test_cluster_has_idle_nodes(cluster, client):
    assert sorted(n.name for n in client.nodes()) == cluster.nodes
    assert len(cluster.nodes) >= 5
    assert client.idle_nodes("gpu") == cluster.nodes
    assert client.version().startswith("22.") or client.version()


def test_four_node_batch_job_runs_one_task_per_node(cluster, client, tmp_path):
    out = tmp_path / "out.txt"
    job_id = client.submit(["-N4", f"--output={out}", "--wrap", "srun -l printenv SLURMD_NODENAME"])
    job = wait_job(client, job_id, lambda j: j.finished)
    assert job.state == "COMPLETED", out.read_text() if out.exists() else job
    lines = sorted(out.read_text().split("\n")[:-1])
    ranks = [line.split(":")[0].strip() for line in lines]
    nodes = [line.split(":")[1].strip() for line in lines]
    assert sorted(ranks) == ["0", "1", "2", "3"]
    assert len(set(nodes)) == 4 and set(nodes) == set(job.nodes)


def test_drain_with_our_prefix_then_resume(cluster, client):
    client.drain("n2", "xid 79 on gpu 3")
    node = client.node("n2")
    assert node.drained and node.reason == f"{REASON_PREFIX} xid 79 on gpu 3"
    assert "n2" not in client.idle_nodes()
    sinfo = subprocess.run(
        ["sinfo", "-R", "-h", "-o", "%N|%E"], env=cluster.env(), capture_output=True, text=True, check=True
    ).stdout
    assert "n2|sres: xid 79 on gpu 3" in sinfo
    assert client.resume(["n2"]) == ["n2"]
    cluster.wait_state("n2", lambda s: s == "IDLE", 30)
    assert not client.node("n2").drained


def test_admin_drain_is_never_resumed(cluster, client):
    cluster.drain("n3", "admin: replacing DIMM")
    client.drain("n4", "ecc errors")
    assert client.resume("n[3-4]") == ["n4"]
    node = client.node("n3")
    assert node.drained and node.reason == "admin: replacing DIMM"
    assert not client.node("n4").drained


def test_drain_needs_a_reason(cluster, client):
    with pytest.raises(ConfigError, match="reason"):
        client.drain("n1", "  ")


def test_shrink_then_grow_back_by_expansion(cluster, client):
    job_id = client.submit(["-N2", "--output=/dev/null", "--wrap", "sleep 300"])
    job = wait_job(client, job_id, lambda j: j.running)
    assert len(job.nodes) == 2
    kept = job.nodes[0]
    assert client.shrink(job_id, [kept]).nodes == (kept,)
    added = client.grow(job_id, 1)
    after = client.job(job_id)
    assert len(added) == 1 and added[0] != kept
    assert len(set(after.nodes)) == 2 and set(after.nodes) == {kept, added[0]}
    # No expansion job is left holding nodes.
    leftover = [j for j in _queue(cluster) if j != job_id]
    assert leftover == []


def test_grow_fails_clearly_without_idle_nodes(cluster, client):
    job_id = client.submit(["-N1", "--output=/dev/null", "--wrap", "sleep 300"])
    wait_job(client, job_id, lambda j: j.running)
    others = [n for n in cluster.nodes if n not in client.job(job_id).nodes]
    client.drain(others, "test: keep busy")
    with pytest.raises(SlurmError, match="could not allocate 1 more node"):
        client.grow(job_id, 1, timeout_s=2)
    assert client.job(job_id).nodes == client.job(job_id).nodes[:1]


def test_shrink_refuses_nodes_outside_the_job(cluster, client):
    job_id = client.submit(["-N1", "--output=/dev/null", "--wrap", "sleep 300"])
    job = wait_job(client, job_id, lambda j: j.running)
    outside = next(n for n in cluster.nodes if n not in job.nodes)
    with pytest.raises(ConfigError, match="not in its nodes"):
        client.shrink(job_id, [outside])


def test_requeue_job_and_array_task(cluster, client):
    job_id = client.submit(["-N1", "--requeue", "--output=/dev/null", "--wrap", "sleep 300"])
    wait_job(client, job_id, lambda j: j.running)
    client.requeue(job_id)
    job = wait_job(client, job_id, lambda j: j.restart_count == 1)
    assert job.state in ("PENDING", "REQUEUED", "COMPLETING", "RUNNING", "CONFIGURING")

    array = client.submit(["-N1", "--array=0-1", "--requeue", "--output=/dev/null", "--wrap", "sleep 300"])
    task = f"{array}_1"
    wait_job(client, task, lambda j: j.running)
    client.requeue(task)
    assert wait_job(client, task, lambda j: j.restart_count == 1).array_task_id == "1"
    assert client.job(f"{array}_0").restart_count == 0


def test_unknown_job_is_a_slurm_error(cluster, client):
    with pytest.raises(SlurmError):
        client.job("999999")


def test_killed_slurmd_is_reported_down_within_slurmd_timeout(cluster, client, tmp_path):
    marker = tmp_path / "started"
    job_id = client.submit(
        [
            "-N1",
            "-w",
            "n5",
            "--no-kill",
            "--output=/dev/null",
            "--wrap",
            f"srun sh -c 'touch {marker}; sleep 300'",
        ]
    )
    wait_job(client, job_id, lambda j: j.running)
    _wait(lambda: marker.exists(), 30, "the job step never started on n5")
    task_pids = [p for p in processes_with_env("SLURMD_NODENAME=n5")]
    assert task_pids, "no process of the job found on n5"

    killed_at = time.monotonic()
    cluster.kill_node("n5")
    assert not any(pid_alive(p) for p in task_pids), "processes of n5 survived its death"
    seen = None
    while time.monotonic() - killed_at < cluster.slurmd_timeout + 20:
        node = client.node("n5")
        if not node.responding:
            seen = time.monotonic() - killed_at
            break
        time.sleep(0.5)
    assert seen is not None, (
        f"n5 still {client.node('n5').long_state} {cluster.slurmd_timeout + 20} s after its slurmd died"
    )
    # Slurm pings every SlurmdTimeout/3 s, so "not responding" may lag the timeout by one ping.
    assert seen <= cluster.slurmd_timeout * 4 / 3 + 2, f"took {seen:.1f} s"
    cluster.restart_node("n5")


def test_discover_sees_current_nodes_and_health(cluster, client):
    job_id = client.submit(["-N3", "--output=/dev/null", "--wrap", "sleep 300"])
    job = wait_job(client, job_id, lambda j: j.running)
    assert job.batch_host == job.nodes[0]
    bad = job.nodes[1]
    client.drain(bad, "test: bad node")
    alloc = discover(client, env={"SLURM_JOB_ID": job_id})
    assert alloc.nodes == job.nodes
    assert bad in alloc.unhealthy and alloc.unhealthy[bad].startswith("drained: sres:")
    assert alloc.healthy == (job.nodes[0], job.nodes[2])
    assert alloc.master_node == job.nodes[0] and alloc.master_addr == "127.0.0.1"
    assert alloc.spares(in_use=[job.nodes[0]]) == (job.nodes[2],)
    # After a shrink, discovery follows Slurm, not the stale SLURM_JOB_NODELIST.
    client.shrink(job_id, alloc.healthy)
    assert discover(client, job_id).nodes == alloc.healthy


def test_second_shrink_without_accounting_db_is_explained(cluster, client):
    job_id = client.submit(["-N3", "--output=/dev/null", "--wrap", "sleep 300"])
    job = wait_job(client, job_id, lambda j: j.running)
    client.shrink(job_id, job.nodes[:2])
    with pytest.raises(SlurmError, match="resizes a job's node list only once"):
        client.shrink(job_id, job.nodes[:1])
    assert client.job(job_id).nodes == job.nodes[:2]


def test_shrink_refuses_to_drop_the_batch_host(cluster, client):
    job_id = client.submit(["-N2", "--output=/dev/null", "--wrap", "sleep 300"])
    job = wait_job(client, job_id, lambda j: j.running)
    with pytest.raises(SlurmError, match=f"without its batch host {job.batch_host}"):
        client.shrink(job_id, [n for n in job.nodes if n != job.batch_host])


def _queue(cluster) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=cluster.env(), capture_output=True, text=True, check=True
    )
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def _wait(predicate, timeout, message):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(message)
        time.sleep(0.2)


def test_jobs_by_name_config_comment_and_a_step_in_another_job(cluster, client, tmp_path):
    """What satellites and `--job J` are built from: jobs found by name, slurmctld's config, a
    job's Comment, and a step started in one running job of ours from outside it."""
    first = client.submit(
        ["-N1", "--job-name=sres-satellite-test", "--output=/dev/null", "--wrap", "sleep 60"]
    )
    other = client.submit(["-N1", "--job-name=other", "--output=/dev/null", "--wrap", "sleep 60"])
    wait_job(client, first, lambda j: j.running)
    assert [j.job_id for j in client.jobs_named("sres-satellite-test")] == [first]
    assert {"gpu", "lend", "urgent"} <= client.partitions()
    assert client.growth_methods() == (True, "preempt/partition_prio")
    client.set_comment(first, "sres-run=/tmp/x")
    assert client.job(first).extra["Comment"] == "sres-run=/tmp/x"
    node = client.job(first).nodes[0]
    assert client.run_step(first, node, ["printenv", "SLURMD_NODENAME"]).strip() == node
    client.cancel(first)
    client.cancel(other)
    wait_job(client, first, lambda j: j.finished)
    assert client.jobs_named("sres-satellite-test") == []
