"""The requeue signal is held from the job process's first moment (launcher.run.signal_latch)."""

import os
import subprocess
import sys

import pytest

from launcher import cli
from launcher.run import signal_latch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_signal_name_comes_from_our_options_only():
    assert signal_latch.signal_name([], {}) == "SIGUSR2"
    assert signal_latch.signal_name(["--nodes", "2", "--preempt-signal", "term"], {}) == "SIGTERM"
    assert signal_latch.signal_name(["--preempt-signal=SIGTERM"], {}) == "SIGTERM"
    assert signal_latch.signal_name(["--", "python", "train.py", "--preempt-signal", "TERM"], {}) == "SIGUSR2"


def test_the_environment_names_the_signal_when_the_command_line_does_not():
    """sbatch scripts export SRES_PREEMPT_SIGNAL; srun --auto-resume passes no sres option."""
    env = {"SRES_PREEMPT_SIGNAL": "term"}
    assert signal_latch.signal_name([], env) == "SIGTERM"
    assert signal_latch.signal_name(["--nodes", "2"], env) == "SIGTERM"
    assert signal_latch.signal_name(["--", "python", "train.py", "--preempt-signal", "HUP"], env) == "SIGTERM"


def test_the_command_line_wins_over_the_environment():
    env = {"SRES_PREEMPT_SIGNAL": "TERM"}
    assert signal_latch.signal_name(["--preempt-signal", "USR2"], env) == "SIGUSR2"
    assert signal_latch.signal_name(["--preempt-signal=HUP", "--", "x"], env) == "SIGHUP"


def test_signal_name_without_an_environment_reads_the_process_one(monkeypatch):
    monkeypatch.setenv("SRES_PREEMPT_SIGNAL", "TERM")
    assert signal_latch.signal_name([]) == "SIGTERM"
    monkeypatch.delenv("SRES_PREEMPT_SIGNAL")
    assert signal_latch.signal_name([]) == "SIGUSR2"


def test_the_latch_and_the_parser_read_the_same_variable(monkeypatch):
    monkeypatch.setenv("SRES_PREEMPT_SIGNAL", "TERM")
    for argv, expected in (([], "TERM"), (["--preempt-signal", "USR2"], "USR2")):
        args = cli.build_parser().parse_args(["run", "--nodes", "1", *argv, "--", "train"])
        assert args.preempt_signal == expected
        assert signal_latch.signal_name(argv) == f"SIG{expected}"


@pytest.mark.local  # spawns: a fresh interpreter
def test_a_signal_before_the_supervisor_starts_is_kept_not_fatal():
    """USR2 at once, while the CLI still imports torch: the process lives and remembers it."""
    code = (
        "import os, signal, sys\n"
        "from launcher.run import signal_latch\n"
        "signal_latch.latch(sys.argv[1:])\n"
        "os.kill(os.getpid(), signal.SIGUSR2)\n"
        "import launcher.cli\n"  # the heavy import the signal may interrupt
        "print(signal_latch.caught())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SRES_PREEMPT_SIGNAL"}
    done = subprocess.run(
        [sys.executable, "-c", code, "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SIGUSR2"


@pytest.mark.local  # spawns: a fresh interpreter
def test_a_signal_named_by_the_environment_during_start_up_is_kept_not_fatal():
    """SRES_PREEMPT_SIGNAL=TERM and no --preempt-signal (as under srun --auto-resume): TERM is held too."""
    code = (
        "import os, signal, sys\n"
        "from launcher.run import signal_latch\n"
        "signal_latch.latch(sys.argv[1:])\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "import launcher.cli\n"
        "print(signal_latch.caught())\n"
    )
    env = {**os.environ, "SRES_PREEMPT_SIGNAL": "TERM"}
    done = subprocess.run(
        [sys.executable, "-c", code, "--nodes", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SIGTERM"


@pytest.mark.local  # spawns: a fresh interpreter
def test_the_latch_imports_only_the_standard_library():
    """It runs before torch: anything heavier would widen the window it exists to close."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import launcher.run.signal_latch\n"
        "new = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(new - set(sys.stdlib_module_names)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['launcher']"
