"""``sres demo``, the first thing a newcomer runs: the fault run ends bitwise like the reference,
and both runs' goodput accounts add up (no negative part, the parts sum to the wall time, no
straggler time in runs without a slow node)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support.goodput_checks import assert_account_adds_up


def test_the_demo_is_identical_and_its_goodput_accounts_add_up(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_"))}
    cmd = [sys.executable, "-m", "launcher.cli", "demo", "--steps", "40", "--width", "512"]
    done = subprocess.run(
        [*cmd, "--log-dir", str(tmp_path)], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "bitwise identical on all 4 ranks: YES" in done.stdout, done.stdout
    (demo,) = tmp_path.glob("demo-*")
    reference = assert_account_adds_up(demo / "reference")
    with_fault = assert_account_adds_up(demo / "with-fault")
    assert reference["detection"] == 0 and with_fault["transfer"] > 0
    assert "other -" not in done.stdout, done.stdout  # the printed account has no negative part
