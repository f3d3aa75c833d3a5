"""A real Slurm cluster for the length of a pytest fixture, shared by the session fixtures."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.support.slurm_cluster import ClusterUnavailable, SlurmCluster, check_machine, pid_alive


@contextlib.contextmanager
def running(cluster: SlurmCluster, what: str) -> Iterator[SlurmCluster]:
    """Start ``cluster`` (built, not started), or fail the tests that need it with one line (a
    Slurm test never passes without Slurm); stop it after, and check that no daemon survived."""
    try:
        check_machine()
    except ClusterUnavailable as err:
        pytest.fail(f"Slurm test cluster unavailable: {err}", pytrace=False)
    try:
        cluster.up()
    except (ClusterUnavailable, TimeoutError) as err:
        cluster.down()
        pytest.fail(f"{what} did not start: {err}", pytrace=False)
    yield cluster
    pids = cluster.daemon_pids()
    cluster.down()
    alive = [p for p in pids if pid_alive(p)]
    assert not alive, f"{what} daemons still running after down(): {alive}"
