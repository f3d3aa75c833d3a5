"""The hooks under a real slurmd: prolog keeps a job off a sick node, the health-check program
brings the node back, the epilog cleans up, an admin's drain is never touched."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from launcher.slurm.client import SlurmClient
from tests.support.training_jobs import wait_job
from tests.support.hook_cluster import wait_for
from tests.support.slurm_cluster import pid_alive
from tests.support.users import opened_for_traverse, two_users

pytestmark = pytest.mark.cluster


def sinfo_reasons(hooked) -> dict[str, str]:
    out = subprocess.run(
        ["sinfo", "-R", "-h", "-N", "-o", "%N|%E"],
        env=hooked.cluster.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return dict(line.split("|", 1) for line in out.splitlines() if line)


def test_sick_node_drained_by_prolog_job_runs_elsewhere_then_health_check_resumes_it(hooked, tmp_path):
    client = SlurmClient.create("cli", env=hooked.cluster.env())
    hooked.cluster.drain("n3", "admin: fan replaced tomorrow")
    shutil.rmtree(hooked.mounts / "n1")  # n1's "mount" is gone: the first idle node is sick

    out = tmp_path / "out.txt"
    job_id = client.submit(["-N1", f"--output={out}", "--wrap", "echo ran on $SLURMD_NODENAME"])
    job = wait_job(client, job_id, lambda j: j.finished, timeout=90)
    assert job.state == "COMPLETED", job
    assert out.read_text().strip() == "ran on n2"
    assert job.restart_count >= 1, "the job never started on the sick node"

    reasons = sinfo_reasons(hooked)
    assert reasons["n1"].startswith("sres: mounts: ") and "n1 missing" in reasons["n1"], reasons
    assert reasons["n3"] == "admin: fan replaced tomorrow"
    failed = hooked.events(hook="prolog", node="n1", event="check", check="mounts", status="fail")
    assert failed and failed[0]["job"] == job_id and failed[0]["nodelist"] == "n1"
    assert hooked.events(hook="prolog", node="n1", event="action", action="drain")

    # While the condition holds, the health-check program keeps n1 drained...
    hooked.set_health_interval(5)
    wait_for(
        lambda: hooked.events(hook="health", node="n1", event="check", check="mounts", status="fail"),
        45,
        "slurmd never ran the health-check program on n1",
    )
    assert client.node("n1").drained_by_us
    # ...and once it clears, runs the deep checks and resumes n1 (only n1).
    (hooked.mounts / "n1").mkdir()
    hooked.cluster.wait_state("n1", lambda s: s == "IDLE", 90)
    assert hooked.events(hook="health", node="n1", event="deep_check", check="allreduce", status="ok")
    assert hooked.events(hook="health", node="n1", event="action", action="resume")
    since = time.time()
    wait_for(
        lambda: [e for e in hooked.events(hook="health", node="n3", event="action") if e["ts"] > since],
        30,
        "no health-check run on n3",
    )
    n3 = client.node("n3")
    assert n3.drained and n3.reason == "admin: fan replaced tomorrow"
    assert not hooked.events(hook="health", node="n3", action="resume")


def test_health_check_drains_an_idle_sick_node(hooked):
    client = SlurmClient.create("cli", env=hooked.cluster.env())
    os.chmod(hooked.mounts / "n2", 0o500)
    shutil.rmtree(hooked.mounts / "n2")
    hooked.set_health_interval(5)
    wait_for(lambda: client.node("n2").drained, 45, "the health-check program did not drain n2")
    assert client.node("n2").reason.startswith("sres: mounts: ")
    assert not client.node("n1").drained


def test_epilog_kills_leftover_processes_and_removes_the_ram_tier(hooked, tmp_path):
    client = SlurmClient.create("cli", env=hooked.cluster.env())
    pid_file = tmp_path / "escaped.pid"
    script = (
        f"mkdir -p {hooked.ram_root}/job-$SLURM_JOB_ID && echo state > "
        f"{hooked.ram_root}/job-$SLURM_JOB_ID/r0; "
        f"setsid sh -c 'sleep 300 & echo $! > {pid_file}' </dev/null >/dev/null 2>&1; sleep 1"
    )
    job_id = client.submit(["-N1", "-w", "n2", "--output=/dev/null", "--wrap", script])
    job = wait_job(client, job_id, lambda j: j.finished, timeout=60)
    assert job.state == "COMPLETED"
    escaped = int(pid_file.read_text())
    wait_for(lambda: hooked.events(hook="epilog", job=job_id, event="cleanup"), 30, "the epilog did not run")
    cleanup = hooked.events(hook="epilog", job=job_id, event="cleanup")[0]
    assert escaped in cleanup["killed"] and cleanup["ram_tier_removed"] is True
    wait_for(lambda: not pid_alive(escaped), 10, f"leftover process {escaped} still alive")
    assert not (hooked.ram_root / f"job-{job_id}").exists()
    assert not client.node("n2").drained


def test_reboot_action_requests_a_reboot_with_our_reason(hooked):
    client = SlurmClient.create("cli", env=hooked.cluster.env())
    job_id = client.submit(["-N1", "-w", "n2", "--output=/dev/null", "--wrap", "sleep 60"])
    wait_job(client, job_id, lambda j: j.running, timeout=30)
    client.reboot("n2", "gpu_count: 7 of 8 GPUs visible")  # ASAP: waits for the job to end
    node = client.node("n2")
    assert node.drained_by_us and "REBOOT_REQUESTED" in node.flags
    assert node.reason == "sres: gpu_count: 7 of 8 GPUs visible"
    subprocess.run(["scontrol", "cancel_reboot", "n2"], env=hooked.cluster.env(), check=True, timeout=30)


def _processes_check(hooked, node: str, hook: str = "check") -> dict:
    """The ``processes`` check's result as ``sres hooks check`` on ``node`` reports it."""
    env = {**hooked.cluster.env(), "SLURMD_NODENAME": node}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.entry",
            "hooks",
            "check",
            "--json",
            "--config",
            str(hooked.config_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return next(r for r in json.loads(result.stdout) if r["check"] == "processes")


def test_check_reports_a_process_left_over_from_a_finished_job(hooked):
    client = SlurmClient.create("cli", env=hooked.cluster.env())
    job_id = client.submit(["-N1", "-w", "n3", "--output=/dev/null", "--wrap", "true"])
    wait_job(client, job_id, lambda j: j.finished, timeout=60)
    job_env = {
        **hooked.cluster.env(),
        "SLURM_JOB_ID": job_id,
        "SLURMD_NODENAME": "n3",
        "SLURM_CLUSTER_NAME": hooked.cluster.cluster_name,
    }
    leftover = subprocess.Popen(["sleep", "120"], env=job_env)  # the job's user's (root's)
    try:
        processes = _processes_check(hooked, "n3")
        assert processes["status"] == "fail", processes
        assert f"{leftover.pid} (sleep, job {job_id})" in processes["detail"]
        # The same process is nobody's leftover on another node.
        assert _processes_check(hooked, "n1")["status"] == "ok"
    finally:
        leftover.kill()
        leftover.wait()


def test_a_job_claimed_in_an_environment_is_nobodys_leftover(hooked, tmp_path_factory):
    """A user's ``env SLURM_JOB_ID=...``: a job Slurm never had, another user's finished job,
    the user's own finished job from a process started after it ended, inside the user's own
    running job or outside any: no leftover, and the health-check program drains nothing."""
    client = SlurmClient.create("cli", env=hooked.cluster.env())
    finished = client.submit(["-N1", "-w", "n3", "--output=/dev/null", "--wrap", "true"])  # root's
    wait_job(client, finished, lambda j: j.finished, timeout=60)
    here = {"SLURMD_NODENAME": "n3", "SLURM_CLUSTER_NAME": hooked.cluster.cluster_name}
    spoofs = []
    with two_users(tmp_path_factory.mktemp("users")) as (_, attacker):
        # The batch script is under the cluster's spool, in pytest's 0700 tmp dir: without this the
        # user's job failed at its execve, and the test passed only when a poll caught it RUNNING.
        reopened = opened_for_traverse([hooked.cluster.directory / "spool"])
        try:
            theirs = client.submit(
                [f"--uid={attacker.name}", f"--gid={attacker.name}", f"--chdir={attacker.home}", "-N1",
                 "-w", "n3", "--output=/dev/null", "--wrap", "true"]
            )  # fmt: skip
            wait_job(client, theirs, lambda j: j.finished, timeout=60)
            time.sleep(3)  # past Slurm's whole-second end time
            # their own finished job, claimed by a process started after it ended (issue 48)
            for job in ("31337", finished, theirs):
                spoofs.append(attacker.popen(["sleep", "120"], env=attacker.env(SLURM_JOB_ID=job, **here)))
            own = client.submit(
                [f"--uid={attacker.name}", f"--gid={attacker.name}", f"--chdir={attacker.home}", "-N1",
                 "-w", "n3", "--output=/dev/null", "--wrap", f"env SLURM_JOB_ID={finished} sleep 120"]
            )  # fmt: skip
            wait_job(client, own, lambda j: j.running, timeout=60)
            processes = _processes_check(hooked, "n3")
            assert processes["status"] == "ok", processes
            hooked.set_health_interval(1)
            wait_for(
                lambda: hooked.events(hook="health", node="n3", check="processes"), 60, "no health check"
            )
            assert not client.node("n3").drained, client.node("n3").reason
        finally:
            for spoof in spoofs:
                spoof.kill()
                spoof.wait()
            for path, mode in reversed(reopened):
                os.chmod(path, mode)


def test_the_epilog_cleans_a_users_ram_tier_as_that_user(hooked, tmp_path_factory):
    """A job of another user leaves its RAM tier, with a link in it to a file only root may
    touch. The epilog removes the job's files as that user: the link goes, root's file stays."""
    client = SlurmClient.create("cli", env=hooked.cluster.env())
    with two_users(tmp_path_factory.mktemp("users")) as (user, _):
        opened = opened_for_traverse([hooked.ram_root_of(user.uid)])
        root = hooked.ram_root_of(user.uid)
        root.mkdir(mode=0o700, exist_ok=True)
        os.chown(root, user.uid, user.gid)
        precious = tmp_path_factory.mktemp("root-only") / "precious"
        precious.write_text("root's")
        script = f"mkdir -p {root}/job-$SLURM_JOB_ID && ln -s {precious} {root}/job-$SLURM_JOB_ID/link"
        job_id = client.submit(
            [f"--uid={user.name}", f"--gid={user.name}", f"--chdir={user.home}", "-N1", "-w", "n2",
             "--output=/dev/null", "--wrap", script]
        )  # fmt: skip
        job = wait_job(client, job_id, lambda j: j.finished, timeout=60)
        assert job.state == "COMPLETED"

        def cleaned() -> list:
            return hooked.events(hook="epilog", job=job_id, event="cleanup")

        wait_for(cleaned, 30, "the epilog did not run")
        cleanup = cleaned()[-1]
        assert cleanup["ram_tier_removed"] is True, cleanup
        assert not (root / f"job-{job_id}").exists()
        assert precious.read_text() == "root's"
        for path, mode in reversed(opened):
            path.chmod(mode)
