"""A RAM root per test and a fault-free reference of the tier runs (tests.support.tier_runs)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from tests.support.sres_runs import Run
from tests.support.tier_runs import NODES, sres_tiers


@pytest.fixture
def ram_root():
    """A private RAM-tier root in /dev/shm; the test must leave nothing behind in it."""
    root = Path("/dev/shm") / f"sres-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def tiers_reference_run(tmp_path_factory) -> Run:
    """A fault-free 2-node run of the tier runs' training."""
    tmp = tmp_path_factory.mktemp("tiers-reference")
    ram = Path("/dev/shm") / f"sres-test-{uuid.uuid4().hex[:8]}"
    try:
        run = sres_tiers(tmp, ram, job="reference")
        assert run.returncode == 0, run.stderr
    finally:
        shutil.rmtree(ram, ignore_errors=True)
    return run


@pytest.fixture(scope="session")
def tiers_reference(tiers_reference_run: Run) -> dict[int, str]:
    """Final digests of a fault-free 2-node run."""
    digests = tiers_reference_run.digests()
    assert len(digests) == NODES and len(set(digests.values())) == 1
    return digests
