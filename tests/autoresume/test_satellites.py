"""Capacity from the scheduler on the real local cluster: satellite jobs replace lost nodes and
carry growth into idle nodes; Slurm's preemption takes lent nodes back without stopping
training; satellites never outlive their job; ``sres status|shrink|grow --job J``."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

import pytest

from launcher.slurm import job_control
from launcher.slurm import templates
from launcher.errors import ConfigError
from launcher.slurm.client import SlurmClient
from resilience.elastic import coverage
from tests.support.training_jobs import REPO, TRAIN, TrainingJob, sres_srun, submit_training, wait_job

pytestmark = pytest.mark.cluster

ELASTIC = ("--dataset", "320", "--global-batch", "32", "--micro-batch", "4")


def satellites(job: TrainingJob) -> list:
    return job.client.jobs_named(f"sres-satellite-{job.job_id}")


def until(what: str, ready, job: TrainingJob, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s:\n{job.output}"
        assert not job.client.job(job.job_id).finished, f"job ended before {what}:\n{job.output}"
        time.sleep(0.2)


def sres_cmd(cluster, *args: str) -> subprocess.CompletedProcess:
    env = {**cluster.env(), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )


def assert_every_sample_once(job: TrainingJob, steps: int) -> None:
    cov = coverage(job.log_dir)
    assert cov.steps == steps and not cov.gaps and not cov.overlaps, job.output
    for epoch, counts in cov.counts.items():
        assert set(counts.values()) == {1}, f"epoch {epoch}: a sample trained more than once"


def test_a_lost_node_is_replaced_by_a_satellite_without_job_expansion(cluster, tmp_path, reference3):
    job = submit_training(
        cluster,
        tmp_path,
        ["-N3", "--no-kill", "--requeue"],
        sres_srun(tmp_path / "run", "--auto-resume=1", "-N", "3"),
    )
    job.wait_step(6)
    victim = job.hosts()[2]
    cluster.kill_node(victim)

    done = job.wait_done()
    assert done.state == "COMPLETED" and done.restart_count == 0, job.output
    assert job.digests() == reference3, job.output
    (added,) = job.of("node-added")
    assert added["how"] == "satellite" and added["job"] != job.job_id and added["host"] != victim
    assert job.of("replaced")[0]["how"] == "satellite"
    # its rank was forked by the satellite's own fork server, a step in the satellite job
    assert added["forked"] == 1 and not job.of("fork-fallback"), job.output
    servers = [e for e in job.of("fork-server") if e["host"] == added["host"]]
    assert [e["how"] for e in servers] == ["started", "ready"], servers
    assert victim not in job.client.job(job.job_id).nodes  # the job itself never grew
    wait_job(job.client, added["job"], lambda j: j.finished, timeout=30)
    assert not satellites(job)


def test_lent_nodes_are_taken_back_by_preemption_and_lent_again(cluster, tmp_path):
    """A 2-node job with --max-nodes 4 grows by two satellites in the low-priority partition; a
    job in the high-priority one preempts them; training shrinks to 2 and goes on; it grows
    back once they are idle; every sample is trained once."""
    # 450: in CI the first try to grow back started no satellite, and a run of 300 steps ended
    # before the second try's resize (its nodes joined at steps 284 and 287).
    steps = 450
    cluster.drain(cluster.nodes[-1], "out of the way: n1-n4 are the whole partition for this test")
    job = submit_training(
        cluster,
        tmp_path,
        ["-N2", "--no-kill"],
        sres_srun(
            tmp_path / "run",
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
        train_args=("--steps", str(steps), *ELASTIC),
    )
    until("growth to 4", lambda: [e["to_world"] for e in job.of("resize")] == [4], job)
    lent = [e["host"] for e in job.of("node-added") if e["how"] == "satellite"]
    assert len(lent) == 2 and {s.nodes[0] for s in satellites(job)} == set(lent)

    urgent = job.client.submit(
        [
            "--partition=urgent",
            "--nodes=2",
            f"--nodelist={','.join(lent)}",
            f"--output={tmp_path / 'urgent.out'}",
            "--wrap=sleep 6",
        ]
    )
    until("the shrink", lambda: len(job.of("resize")) >= 2, job)
    wait_job(job.client, urgent, lambda j: j.finished, timeout=90)
    grown_back = lambda: len(job.of("resize")) >= 3 and job.of("resize")[-1]["to_world"] == 4  # noqa: E731
    until("growth back to 4", grown_back, job, timeout=90)

    done = job.wait_done(timeout=300)
    assert done.state == "COMPLETED", job.output
    assert wait_job(job.client, urgent, lambda j: j.finished).state == "COMPLETED"
    resizes = [(e["from_world"], e["to_world"], e["why"]) for e in job.of("resize")]
    assert resizes[:2] == [(2, 4, "idle"), (4, 2, "preempted")], job.output
    # the two come back idle when Slurm is done with them, together or one after the other
    regrowth = resizes[2:]
    assert regrowth in ([(2, 4, "idle")], [(2, 3, "idle"), (3, 4, "idle")]), job.output
    released = job.of("node-released")
    assert sorted(e["host"] for e in released if e["why"] == "preempted") == sorted(lent)
    assert not job.of("fault"), job.output  # taken back at a step boundary, not lost
    # growing back, after the first step: each new node's rank forked by its own fork server
    regrown = [e for e in job.of("node-added") if e["host"] in lent][2:]
    assert regrown and all(e["forked"] == 1 for e in regrown), regrown
    assert not job.of("fork-fallback"), job.output
    assert all(e["jobs"] for e in job.of("resize"))
    assert_every_sample_once(job, steps)
    assert not satellites(job)
    assert cluster.queue() == []


def test_sres_controls_a_slurm_job_by_its_id_and_satellites_end_with_it(cluster, tmp_path):
    job = submit_training(
        cluster,
        tmp_path,
        ["-N2", "--no-kill"],
        sres_srun(
            tmp_path / "run",
            "--auto-resume=1",
            "-N",
            "2",
            "--max-nodes",
            "4",
            "--lend-partition",
            "lend",
            "--grow-snooze",
            "0",
            "--no-tiers",
        ),
        sleep=0.15,
        train_args=("--steps", "2000", *ELASTIC),
    )
    until("growth to 4", lambda: [e["to_world"] for e in job.of("resize")] == [4], job)

    status = sres_cmd(cluster, "status", "--job", job.job_id)
    assert status.returncode == 0 and "satellites:" in status.stdout, status.stderr
    assert all(s.job_id in status.stdout for s in satellites(job)), status.stdout
    with pytest.raises(ConfigError) as refused:  # as user nobody (the test's python is root's alone)
        job_control.run_dir(job.client, job.job_id, uid=65534)
    assert str(refused.value) == (
        f"job {job.job_id} belongs to root(0); only its user or root may control it (you are nobody(65534))"
    )

    before = {s.job_id: s.nodes[0] for s in satellites(job)}
    shrink = sres_cmd(cluster, "shrink", "--job", job.job_id, "--by", "1")
    assert shrink.returncode == 0, shrink.stderr
    until("the shrink", lambda: len(job.of("resize")) >= 2, job)
    (released,) = job.of("node-released")
    assert released["why"] == "request" and released["job"] in before
    wait_job(job.client, released["job"], lambda j: j.finished, timeout=30)
    cluster.wait_state(before[released["job"]], lambda s: s == "IDLE", 30)
    assert len(satellites(job)) == 1  # no growth back above what was asked for

    job.client.cancel(job.job_id)  # the supervisor dies with its job: the satellite ends by itself
    t0 = time.monotonic()
    while satellites(job):
        assert time.monotonic() - t0 < 30, f"satellites outlived their job: {satellites(job)}"
        time.sleep(0.5)


def test_refusals_are_one_line(cluster, tmp_path):
    job = submit_training(
        cluster,
        tmp_path,
        ["-N2"],
        sres_srun(tmp_path / "run", "-N", "2", "--max-nodes", "3", "--lend-partition", "nope"),
    )
    done = job.wait_done(timeout=60)
    assert done.state == "FAILED"
    errors = [line for line in job.output.splitlines() if line.startswith("sres: error")]
    assert errors == [
        "sres: error: --lend-partition nope: no such partition (the cluster has gpu, lend, urgent)"
    ], job.output
    bad = sres_cmd(cluster, "run", "--nodes", "2", "--min-nodes", "3", "--max-nodes", "2", "--", "true")
    assert bad.returncode == 1 and bad.stderr == "sres: error: --max-nodes 2 is below --min-nodes 3\n"


def test_with_the_supervisor_apart_losing_rank_0s_node_loses_nothing(cluster, tmp_path, reference3):
    """train_supervisor_apart.sbatch: the job's one CPU runs the supervisor and the store; the
    three training nodes are satellites. Rank 0's node dies; a new satellite takes its rank."""
    train = shlex.join([sys.executable, *TRAIN, "--sleep-s", "0.25", "--out", str(tmp_path / "out")])
    script = tmp_path / "job.sbatch"
    script.write_text(
        templates.load("train_supervisor_apart").fill(
            {
                "nodes": "3",
                "spares": "0",
                "retries": "1",
                "time": "00:10:00",
                "command": train,
                "sres": f"{shlex.quote(sys.executable)} -m launcher.cli",
            }
        )
    )
    client = SlurmClient.create("cli", env=cluster.env())
    job = TrainingJob(
        client.submit(
            [
                f"--chdir={REPO}",
                f"--output={tmp_path / 'job.out'}",
                f"--export=ALL,SRES_LOG_DIR={tmp_path / 'run'},PYTHONPATH={REPO}",
                str(script),
            ]
        ),
        tmp_path,
        client,
    )
    job.wait_step(6)
    (supervisor_node,) = client.job(job.job_id).nodes
    hosts = job.hosts()
    assert supervisor_node not in hosts and len(satellites(job)) == 3
    cluster.kill_node(hosts[0])

    done = job.wait_done()
    assert done.state == "COMPLETED" and done.restart_count == 0, job.output
    assert job.digests() == reference3, job.output
    (replaced,) = job.of("replaced")
    assert (replaced["rank"], replaced["how"]) == (0, "satellite") and replaced["host"] not in hosts
    # From peers; or, when the node died within milliseconds of a commit (the test kills it as
    # soon as it sees that step's progress), before rank 0's own part of it reached its buddy:
    # from the tiers, at the same step, or one step earlier when the tiers' copy of that step
    # had not left the node either (the window recovery_plan.plan_rank_parts documents; the
    # digests above are the fault-free ones either way, as in test_node_replacement's twin).
    (recovered,) = job.of("recovered")
    assert recovered["source"] in ("peer", "neighbour") and recovered["steps_lost"] <= 1, recovered
    t0 = time.monotonic()
    while satellites(job):
        assert time.monotonic() - t0 < 30, f"satellites outlived their job: {satellites(job)}"
        time.sleep(0.5)
