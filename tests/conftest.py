"""Shared fixtures: the real local Slurm cluster (session scope) and clients for it; the tier
markers, from each test's folder."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest
from _pytest.mark import deselect_by_mark  # pytest's -m, which has no public form

from tests.support import lanes
from tests.support.running_cluster import running
from tests.support.slurm_cluster import SlurmCluster
from tests.support.sres_runs import sres_run
from tests.support.training_jobs import STEPS

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
    "network": "local",
    "gpu": "local",  # skipped without CUDA (tests/gpu/conftest.py)
}
"""tests/<folder> -> its tier marker: ``-m unit`` is the fast set, ``-m "not cluster"`` needs no
Slurm, ``-m "not slow"`` (tests/run.sh's default) is the CI set."""

LANES = {"local": "local", "cluster": "slurm"}
"""tier -> the xdist group its pinned tests run in (tests/run.sh: ``-n 2 --dist loadgroup``).
Every Slurm test shares one lane because the test clusters name their nodes alike (n1, n2, ...)
and a node kill finds its processes by that name; the other lane has the CPU to itself. Every
other test goes where it balances the two (:func:`tests.support.lanes.balance`)."""

PINNED_FOLDERS = {
    # Their two users are the machine's (one /dev/shm/sres-<uid>, one mode of /root's): every
    # test of theirs in the lane that has the Slurm cluster.
    "security": "cluster",
    # submitit's own tests: those of its Slurm executor run on the test cluster.
    "submitit": "cluster",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"record each test's time into {lanes.DURATIONS.name}, which the lanes are balanced from",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the lane into the test's group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiers: dict[str, set[str]] = {}  # nodeid -> its tier markers
    for item in items:
        folder = item.path.relative_to(Path(__file__).parent).parts[0]
        tier = TIERS.get(folder)
        marked = {name for name in set(TIERS.values()) if item.get_closest_marker(name) is not None}
        if tier is not None and not marked:  # a test may say its own tier (a unit test that spawns: local)
            item.add_marker(getattr(pytest.mark, tier))
            marked = {tier}
        tiers[item.nodeid] = marked
    # ``-m`` now, as pytest's own hook would after this one: the lanes are balanced over the tests
    # that run. Balanced over the slow ones too, one lane had 9 min more than the other in CI.
    deselect_by_mark(items, config)
    pinned: dict[str, str] = {}  # nodeid -> lane
    movable: list[tuple[str, str]] = []  # (nodeid, file): a local test, either lane
    for item in items:
        folder = item.path.relative_to(Path(__file__).parent).parts[0]
        if folder in PINNED_FOLDERS:
            pinned[item.nodeid] = LANES[PINNED_FOLDERS[folder]]
        elif "cluster" in tiers[item.nodeid]:
            pinned[item.nodeid] = LANES["cluster"]
        elif "local" in tiers[item.nodeid]:
            movable.append((item.nodeid, item.nodeid.partition("::")[0]))
    plan = lanes.balance(pinned, movable, lanes.load(), tuple(sorted(set(LANES.values()))))
    config.stash[PLAN] = plan
    for item in items:
        lane = plan.lane_of.get(item.nodeid)
        if lane is not None:
            item.add_marker(pytest.mark.xdist_group(lane))


PLAN = pytest.StashKey[lanes.Plan]()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    nodeid, at, _lane = report.nodeid.rpartition("@")
    if at:  # a test that ran in a lane (xdist names it nodeid@lane)
        lanes.RECORDED[nodeid] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("--store-durations") and not hasattr(config, "workerinput"):  # xdist's controller
        lanes.store(lanes.RECORDED)


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """Each lane's total time against its plan: the suite takes as long as its longest lane (CI's
    budget is 25 min), so a test added or moved to ``slow`` is weighed where it runs."""
    totals: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                lane = report.nodeid.rpartition("@")[2] if "@" in report.nodeid else "unit (either)"
                totals[lane] = totals.get(lane, 0.0) + report.duration
    if totals:
        planned = config.stash[PLAN].seconds if PLAN in config.stash else {}
        lines = ", ".join(
            f"{lane} {seconds / 60:.1f} min"
            + (f" (planned {planned[lane] / 60:.1f})" if lane in planned else "")
            for lane, seconds in sorted(totals.items())
        )
        terminalreporter.write_line(f"time per lane: {lines}")


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


@pytest.fixture(scope="session")
def reference3(tmp_path_factory) -> dict[int, str]:
    """Final digests of a fault-free 3-rank run (local launcher; placement does not change the math)."""
    run = sres_run(tmp_path_factory.mktemp("reference3"), nodes=3, steps=STEPS)
    assert run.returncode == 0, run.stderr
    digests = run.digests()
    assert len(digests) == 3 and len(set(digests.values())) == 1
    return digests
