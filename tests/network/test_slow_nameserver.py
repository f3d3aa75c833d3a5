"""A nameserver that answers late fences no healthy rank.

Torch's store client looks up the name of the address it connects to (``getnameinfo``, not
numeric), so each store connection of a rank waits for the machine's nameserver: 5 s when it drops
the query (glibc's timeout). Two CI-sized runs here lost their reference run to it: each rank's
heartbeat connection was made after the hello had granted the lease, the lease ran out during the
wait, and healthy ranks fenced themselves before their first step (``no word from the supervisor
for 5.0 s (lease 3 s; last line sent 0.0 s ago, last echo read never)``). Here every lookup of the
run is answered 4.5 s late, in namespaces of its own (``tests/support/slow_nameserver.py``), with
a lease of 3 s.
"""

from __future__ import annotations

import re
import shutil

import pytest

from tests.support.netns import available
from tests.support.sres_runs import clean_env, run_command, sres_command

pytestmark = pytest.mark.network

DELAY_S = 4.5


def test_a_nameserver_answering_later_than_the_lease_fences_no_rank(tmp_path):
    why = available() or (None if shutil.which("unshare") else "unshare (util-linux) is missing")
    if why is not None:
        pytest.fail(f"this test needs namespaces: {why}")
    log_dir = tmp_path / "run"
    # Formation may take its time: each of a rank's store connections waits for the nameserver.
    example, timeouts = "resilience.examples.train_mlp", {"hang_timeout": 4, "reform_timeout": 60}
    sres = sres_command(log_dir, 2, ("--no-tiers",), example, 4, (), **timeouts)
    cmd = ["unshare", "-m", "-n", *sres[:1], "-m", "tests.support.slow_nameserver", "--delay-s", str(DELAY_S)]
    run = run_command([*cmd, "--", *sres], clean_env(), log_dir, 120)
    assert f"a lookup took {DELAY_S}" in run.stderr, run.stderr  # the fault was in place
    assert run.returncode == 0, run.stderr[-3000:]
    assert "fenced" not in run.stderr, run.stderr[-3000:]
    assert not run.of("fault"), run.stderr[-3000:]
    assert len(run.digests()) == 2
    # ... and the run said why its start was slow, and what to do (launcher/supervisor/name_lookup.py)
    warned = r"warning: a reverse name lookup of ::ffff:127\.0\.0\.1 .*? took ([0-9.]+) s"
    said = re.search(warned, run.stderr)
    assert said is not None and float(said.group(1)) >= DELAY_S - 0.05, run.stderr[-3000:]
