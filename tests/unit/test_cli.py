"""``sres`` as a user types it: real subprocesses of the installed console script."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.local  # each test runs `python -m launcher.cli` in a subprocess


def sres(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_doctor_outside_slurm_passes_and_reports_torch_and_shm():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = sres("doctor", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch" in result.stdout and "/dev/shm" in result.stdout
    assert "spank" in result.stdout


def test_doctor_with_slurm_needed_but_unreachable_fails_with_a_fix(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(tmp_path / "missing.conf")
    result = sres("doctor", "--slurm", "--timeout", "5", env=env)
    assert result.returncode == 1
    assert "FAIL" in result.stdout and "fix:" in result.stdout
    assert "Traceback" not in result.stderr


def test_doctor_without_slurm_tools_gives_install_line(tmp_path):
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path)}
    result = sres("doctor", "--slurm", env=env)
    assert result.returncode == 1
    assert "apt-get install slurm-client" in result.stdout


def test_unknown_command_is_a_usage_error():
    result = sres("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and "Traceback" not in result.stderr
