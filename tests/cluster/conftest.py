"""Clients for the real local cluster, one per backend: every test that takes ``client`` is a
contract test that each backend must pass."""

from __future__ import annotations

import time

import pytest

from launcher.errors import ConfigError
from launcher.slurm import SlurmClient
from launcher.slurm_types import Job
from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(params=["cli", "pyslurm"])
def client(request: pytest.FixtureRequest, cluster: SlurmCluster) -> SlurmClient:
    try:
        return SlurmClient.create(request.param, env=cluster.env())
    except ConfigError as err:
        pytest.skip(reason=f"{request.param} backend not usable here: {err}")


def wait_job(client: SlurmClient, job_id: str, predicate, timeout: float = 60.0) -> Job:
    """Poll Slurm until the job satisfies ``predicate``; fail with its last state."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if predicate(job):
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} still {job.state} ({job.reason}) after {timeout:.0f} s")
        time.sleep(0.2)
