"""``srun --auto-resume=N`` through the SPANK plugin, built here against the cluster's spank.h."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from launcher.observability.events import read_events
from launcher.slurm.client import SlurmClient
from tests.support.training_jobs import REPO, submit_training, wait_job

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


def test_a_100_kib_command_line_runs_whole_and_the_programs_own_auto_resume_stays(cluster, plugin, tmp_path):
    """srun's line is read whole however long (it was cut at 64 KiB), and only srun's own
    ``--auto-resume`` is srun's: the program's, after the program's name, reaches the program."""
    words = [f"w{i:05d}-" + "x" * 44 for i in range(2048)]  # 2048 x 51 bytes: 102 KiB
    record = tmp_path / "argv.json"
    program = (  # records its arguments, then trains as a rank of the run
        f"import json, runpy, sys; json.dump(sys.argv[1:], open({str(record)!r}, 'w')); "
        "sys.argv = ['train_mlp', '--steps', '3']; "
        "runpy.run_module('resilience.examples.train_mlp', run_name='__main__')"
    )
    own = ["--auto-resume", "--x=1", *words]  # the program's arguments
    line = shlex.join(["srun", "--auto-resume=0", "-N", "1", sys.executable, "-c", program, *own])
    assert len(line) > 100 * 1024
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/bash\ncd {REPO}\nexport SRES_LOG_DIR={tmp_path / 'run'}\n{line}\n")
    client = SlurmClient.create("cli", env=cluster.env())
    job_id = client.submit(["-N1", f"--output={tmp_path / 'job.out'}", f"--chdir={tmp_path}", str(script)])
    done = wait_job(client, job_id, lambda j: j.finished, timeout=120)
    output = (tmp_path / "job.out").read_text()
    assert done.state == "COMPLETED", output
    assert json.loads(record.read_text()) == own
    assert read_events(tmp_path / "run" / "events.jsonl")[0]["event"] == "start", output
