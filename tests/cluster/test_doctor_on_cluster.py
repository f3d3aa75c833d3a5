import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster


def test_doctor_reports_cluster_and_backend(cluster):
    result = subprocess.run(
        [sys.executable, "-m", "launcher.cli", "doctor", "--slurm"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "client 22." in result.stdout
    assert "is UP" in result.stdout
    assert "cli (" in result.stdout
