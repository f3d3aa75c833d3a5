"""Shared fixtures: the real local Slurm cluster (session scope) and clients for it; the tier
markers, from each test's folder."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from tests.support.running_cluster import running
from tests.support.slurm_cluster import SlurmCluster

pytest_plugins = ("tests.support.tier_guard",)  # fails a unit test that spawns or sleeps

TIERS = {
    "unit": "unit",
    "inprocess": "local",
    "tiers": "local",
    "models": "local",
    "autoresume": "cluster",
    "hooks": "cluster",
    "cluster": "cluster",
    "security": "local",
    "submitit": "local",
}
"""tests/<folder> -> its tier marker: ``-m unit`` is the fast set, ``-m "not cluster"`` needs no
Slurm, ``-m "not slow"`` (tests/run.sh's default) is the CI set."""

LANES = {"local": "local", "cluster": "slurm"}
"""tier -> the xdist group its tests run in (tests/run.sh: ``-n 2 --dist loadgroup``). The Slurm
tests spend most of their time waiting on Slurm's timers, the local ones on the CPU: one lane
each, side by side. Every Slurm test shares one lane because the test clusters name their nodes
alike (n1, n2, ...) and a node kill finds its processes by that name."""


LIGHT_LOCAL = {"test_demo.py", "test_buddy_buffers.py", "test_straggler.py", "test_fork_server.py"}
"""Local tests run in the Slurm lane, which waits on Slurm's timers more than it computes (the
straggler test mostly waits for its slowed rank: 45 s of the local lane in CI). The fork server's
tests (55 s) balance the two lanes: the local one was the longer (29.5 min against 27.2 in CI)."""


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the lane into the test's group
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(Path(__file__).parent).parts[0]
        tier = TIERS.get(folder)
        marked = {name for name in set(TIERS.values()) if item.get_closest_marker(name) is not None}
        if tier is not None and not marked:  # a test may say its own tier (a unit test that spawns: local)
            item.add_marker(getattr(pytest.mark, tier))
            marked = {tier}
        lane = next((LANES[t] for t in marked if t in LANES), None)
        if folder == "security":
            # Their two users are the machine's (one /dev/shm/sres-<uid>, one mode of /root's):
            # every test of theirs in one lane, the one that has the Slurm cluster.
            lane = LANES["cluster"]
        if folder == "submitit":
            # submitit's own tests: those of its Slurm executor run on the test cluster; those of
            # its local executor are CPU-light, mostly waiting on job polls, and balance the
            # lanes there (CI, 2 cores: local 30.3 min and slurm 22.7 min before).
            lane = LANES["cluster"]
        if item.path.name in LIGHT_LOCAL:
            lane = LANES["cluster"]  # the local lane is the longer one (CI: 29 min of 30)
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(lane))


def pytest_terminal_summary(terminalreporter) -> None:
    """Each lane's total time: the suite takes as long as its longest lane (CI's budget is 30 min),
    so a test added or moved to ``slow`` is weighed where it runs."""
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                lane = report.nodeid.rpartition("@")[2] if "@" in report.nodeid else "unit (either)"
                totals[lane] = totals.get(lane, 0.0) + report.duration
    if totals:
        lanes = ", ".join(f"{lane} {seconds / 60:.1f} min" for lane, seconds in sorted(totals.items()))
        terminalreporter.write_line(f"time per lane: {lanes}")


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory):
    """Five real nodes (n1..n5) in partitions ``gpu`` (default, never preempted), ``lend`` (low
    priority, preempted with a 10 s grace time) and ``urgent`` (high priority); SlurmdTimeout=10 s.

    Fails every test that uses it with one line when the machine cannot run Slurm:
    a Slurm test never passes without Slurm.
    """
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), node_count=5, slurmd_timeout=10)
    with running(cluster, "Slurm test cluster"):
        yield cluster


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The shared cluster, returned to a clean state (no jobs, all nodes idle) first."""
    slurm_cluster.reset()
    return slurm_cluster


@pytest.fixture
def slurm_env(cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> SlurmCluster:
    """The shared cluster, seen by this process as a user's shell would see it (SLURM_CONF, ...):
    for submitit, which calls sbatch itself, and the jobs it submits."""
    for key, value in cluster.env().items():
        monkeypatch.setenv(key, value)
    return cluster


@pytest.fixture(scope="session", autouse=True)
def private_ram_tier():
    """Runs of this session keep their RAM tier (resilience.tiers) in a private /dev/shm folder,
    removed at the end: tests never touch a real job's files nor leave any behind."""
    root = Path("/dev/shm") / f"sres-tests-{uuid.uuid4().hex[:8]}"
    old = os.environ.get("SRES_RAM_ROOT")
    os.environ["SRES_RAM_ROOT"] = str(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)
    if old is None:
        os.environ.pop("SRES_RAM_ROOT", None)
    else:
        os.environ["SRES_RAM_ROOT"] = old
