"""The hook test cluster (tests.support.hook_cluster), started once per session."""

from __future__ import annotations

import sys

import pytest
import yaml

from slurm_plugins import wrappers
from tests.support.hook_cluster import NODES, REPO, HookCluster, hook_conf
from tests.support.running_cluster import running
from tests.support.slurm_cluster import SlurmCluster


@pytest.fixture(scope="session")
def hook_cluster(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("hooks")
    cluster = SlurmCluster(root / "cluster", node_count=NODES, slurmd_timeout=10, extra_conf="")
    hooks = HookCluster(cluster, root)
    cluster.extra_conf = hook_conf(hooks.prefix)
    for node in cluster.nodes:
        (hooks.mounts / node).mkdir(parents=True, exist_ok=True)
    sres = f"{sys.executable} -m launcher.entry"
    wrappers.write_local(
        str(hooks.prefix),
        sres,
        yaml.safe_dump(hooks.base_config()),
        {"PYTHONPATH": str(REPO), "SLURM_CONF": str(cluster.conf_path)},
    )
    with running(cluster, "hook test cluster"):
        yield hooks


@pytest.fixture
def hooked(hook_cluster: HookCluster) -> HookCluster:
    """Clean state per test: no jobs, nodes idle, health checks off, base config, mounts there."""
    hook_cluster.set_health_interval(0)
    for node in hook_cluster.cluster.nodes:
        (hook_cluster.mounts / node).mkdir(parents=True, exist_ok=True)
    hook_cluster.write_config(hook_cluster.base_config())
    hook_cluster.cluster.reset()
    return hook_cluster
