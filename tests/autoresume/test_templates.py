"""The sbatch templates: accepted by the real cluster's sbatch, and train.sbatch runs to the end."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest

from launcher.slurm import templates
from launcher.slurm.client import SlurmClient
from tests.support.training_jobs import REPO, wait_job

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("name", templates.names())
def test_template_passes_sbatch_test_only(cluster, tmp_path, name):
    script = tmp_path / name
    script.write_text(templates.load(name).fill({"partition": "gpu"}))
    result = subprocess.run(
        ["sbatch", "--test-only", str(script)],
        env=cluster.env(),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "to start at" in result.stderr


def test_sres_template_prints_a_filled_script():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "launcher.cli",
            "template",
            "train.sbatch",
            "--set",
            "nodes=6",
            "--set",
            "spares=2",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "#SBATCH --nodes=8\n" in result.stdout and "--nodes=6 " in result.stdout and "{{" not in result.stdout
    )
    bad = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "template", "train", "--set", "nodes=two"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 1 and bad.stderr.strip() == "sres: error: nodes='two': a whole number is needed"


def test_train_sbatch_runs_to_completion(cluster, plugin, tmp_path):
    out = tmp_path / "out"
    command = " ".join(
        shlex.quote(a)
        for a in (sys.executable, "-m", "resilience.examples.train_mlp", "--steps", "8", "--out", str(out))
    )
    script = tmp_path / "train.sbatch"
    script.write_text(
        templates.load("train").fill({"nodes": "2", "spares": "1", "command": command, "time": "00:10:00"})
    )
    client = SlurmClient.create("cli", env=cluster.env())
    job_id = client.submit(
        [
            f"--chdir={tmp_path}",
            f"--output={tmp_path / 'job.out'}",
            f"--export=ALL,SRES_LOG_DIR={tmp_path / 'run'},PYTHONPATH={REPO}",
            str(script),
        ]
    )
    job = wait_job(client, job_id, lambda j: j.finished, timeout=120)
    log = (tmp_path / "job.out").read_text()
    assert job.state == "COMPLETED", log
    assert "run finished: 8 steps" in log
    assert sorted(p.name for p in out.glob("rank*.json")) == ["rank0.json", "rank1.json"]
