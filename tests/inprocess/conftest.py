"""Fault-free references of the example MLP, made once per session."""

from __future__ import annotations

import pytest

from tests.support.sres_runs import Run, sres_run


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory) -> Run:
    """A fault-free 4-rank run of the example MLP."""
    run = sres_run(tmp_path_factory.mktemp("reference"))
    assert run.returncode == 0, run.stderr
    return run


@pytest.fixture(scope="session")
def reference(reference_run) -> dict[int, str]:
    """Final state digests of a fault-free 4-rank run: what every faulty run must end with."""
    digests = reference_run.digests()
    assert len(digests) == 4 and len(set(digests.values())) == 1  # data-parallel replicas agree
    return digests


@pytest.fixture(scope="session")
def sharded_reference(tmp_path_factory) -> dict[int, str]:
    run = sres_run(tmp_path_factory.mktemp("sharded-reference"), train_args=("--sharded",))
    assert run.returncode == 0, run.stderr
    digests = run.digests()
    assert len(digests) == 4 and len(set(digests.values())) == 4  # each rank holds its own shard
    return digests
