"""The command runner every Slurm command goes through: timeouts, exit codes, missing tools.

These use real processes (sleep, sh), not Slurm: what is tested is our handling of a
command that hangs, fails or is missing, whatever the command.
"""

import pytest

from launcher.errors import ConfigError, SlurmCommandError, SlurmUnavailable
from launcher.slurm.client import SlurmClient
from launcher.slurm.command_driver import CommandLine


@pytest.mark.local  # spawns: sleep
def test_timeout_raises_with_the_command():
    with pytest.raises(SlurmCommandError) as info:
        CommandLine(timeout_s=0.2)(["sleep", "5"])
    assert info.value.returncode is None
    assert info.value.argv == ["sleep", "5"]
    assert "timed out" in str(info.value)


@pytest.mark.local  # spawns: sh
def test_failure_carries_exit_code_and_stderr():
    with pytest.raises(SlurmCommandError) as info:
        CommandLine()(["sh", "-c", "echo 'Invalid job id specified' >&2; exit 3"])
    assert info.value.returncode == 3
    assert info.value.stderr == "Invalid job id specified"


@pytest.mark.local  # spawns: tries sinfo
def test_missing_scontrol_is_one_clear_line(tmp_path):
    client = SlurmClient.create("cli", env={"PATH": str(tmp_path)})
    with pytest.raises(SlurmUnavailable) as info:
        client.nodes()
    message = str(info.value)
    assert "'sinfo' not found on PATH" in message and "apt-get install slurm-client" in message
    assert "\n" not in message


def test_bad_backend_name_and_timeout_are_refused():
    with pytest.raises(ConfigError, match="unknown Slurm backend"):
        SlurmClient.create("rest")
    with pytest.raises(ConfigError, match="positive"):
        SlurmClient.create("cli", timeout_s=0)


def test_pyslurm_backend_refused_with_reason_when_unusable():
    try:
        import pyslurm  # noqa: F401

        why = "pyslurm is installed here; the refusal path needs a machine without a matching one"
        pytest.skip(reason=why)
    except ImportError:
        pass
    with pytest.raises(ConfigError, match="pyslurm is not installed"):
        SlurmClient.create("pyslurm")
