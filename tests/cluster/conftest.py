"""Clients for the real local cluster, one per backend: every test that takes ``client`` is a
contract test that each backend must pass."""

from __future__ import annotations

import pytest

from launcher.errors import ConfigError
from launcher.slurm.client import SlurmClient
from tests.support.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(params=["cli", "pyslurm"])
def client(request: pytest.FixtureRequest, cluster: SlurmCluster) -> SlurmClient:
    try:
        return SlurmClient.create(request.param, env=cluster.env())
    except ConfigError as err:
        pytest.skip(reason=f"{request.param} backend not usable here: {err}")
