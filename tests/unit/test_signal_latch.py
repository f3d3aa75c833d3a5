"""The requeue signal is held from the job process's first moment (launcher.signal_latch)."""

import os
import subprocess
import sys

from launcher import signal_latch
from launcher.supervisor.config import RunConfig
from resilience.contract import rank_env


def test_the_latch_and_the_config_agree_on_the_default_signal():
    assert signal_latch.DEFAULT_SIGNAL == RunConfig.__dataclass_fields__["preempt_signal"].default == rank_env.PREEMPT_SIGNAL


def test_signal_name_comes_from_our_options_only():
    assert signal_latch.signal_name([]) == "SIGUSR2"
    assert signal_latch.signal_name(["--nodes", "2", "--preempt-signal", "term"]) == "SIGTERM"
    assert signal_latch.signal_name(["--preempt-signal=SIGTERM"]) == "SIGTERM"
    assert signal_latch.signal_name(["--", "python", "train.py", "--preempt-signal", "TERM"]) == "SIGUSR2"


def test_a_signal_before_the_supervisor_starts_is_kept_not_fatal():
    """USR2 at once, while the CLI still imports torch: the process lives and remembers it."""
    code = ("import os, signal, sys\n"
            "from launcher import signal_latch\n"
            "signal_latch.latch(sys.argv[1:])\n"
            "os.kill(os.getpid(), signal.SIGUSR2)\n"
            "import launcher.cli\n"  # the heavy import the signal may interrupt
            "print(signal_latch.caught())\n")
    done = subprocess.run([sys.executable, "-c", code, "--nodes", "2"], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "SIGUSR2"
