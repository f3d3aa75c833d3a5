"""``srun --auto-resume=N`` through the SPANK plugin, built here against the cluster's spank.h."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.training_jobs import REPO, submit_training

pytestmark = pytest.mark.cluster


def test_option_shows_in_srun_help(cluster, plugin):
    help_text = subprocess.run(["srun", "--help"], env=cluster.env(), capture_output=True, text=True).stdout
    assert "--auto-resume" in help_text


def test_srun_auto_resume_recovers_a_killed_node(cluster, plugin, tmp_path, reference3):
    job = submit_training(
        cluster,
        tmp_path,
        ["-N4", "--no-kill", "--requeue"],
        f"SRES_LOG_DIR={tmp_path / 'run'} srun --auto-resume=1 -N 3",
    )
    job.wait_step(6)
    victim = job.hosts()[1]
    cluster.kill_node(victim)
    done = job.wait_done()
    assert done.state == "COMPLETED", job.output
    assert job.digests() == reference3, job.output
    assert job.client.node(victim).reason == "sres: slurmd not responding"
    assert [e["how"] for e in job.of("replaced")] == ["spare"]


@pytest.mark.parametrize("via", ["sres srun", "srun --auto-resume"])
def test_outside_an_allocation_fails_with_one_clear_line(cluster, plugin, via):
    cmd = (
        [sys.executable, "-m", "launcher.cli", "srun", "-N", "1", "hostname"]
        if via == "sres srun"
        else ["srun", "--auto-resume=1", "-N", "1", "hostname"]
    )
    result = subprocess.run(cmd, env=cluster.env(), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode != 0
    assert "sres: error: sres srun runs inside a Slurm allocation (SLURM_JOB_ID is unset)" in result.stderr
    assert "Traceback" not in result.stderr
