"""Dynamic node-list discovery: which nodes a running job holds now, and which are healthy.

``SLURM_JOB_NODELIST`` is fixed when the job starts; after a shrink or an expansion it is
stale. Every recovery attempt therefore asks Slurm again (:func:`discover`) and decides from
what it answers with a pure function (:func:`classify`), which tests exercise without Slurm.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from launcher.errors import NotInAllocation, SlurmError
from launcher.slurm.client import SlurmClient
from launcher.slurm.types import Node


CONFIG_PATHS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")
"""Where a Slurm client finds its cluster when ``SLURM_CONF`` is unset: the default path (Debian's,
and its older one) and the cache that configless mode's ``sackd``/``slurmd`` keep."""


def cluster_configured(
    environ: Mapping[str, str] = os.environ,
    is_file: Callable[[str], bool] = os.path.isfile,
    which: Callable[[str], str | None] = shutil.which,
) -> bool:
    """Whether a job submitted from here reaches a Slurm cluster: ``sbatch`` on PATH and a
    configuration it will read. A client installed without a cluster (``slurm-client`` on a
    workstation) is not one: choosing Slurm there ends in sbatch's own error, not in a run."""
    if which("sbatch") is None:
        return False
    if "SLURM_JOB_ID" in environ:  # inside an allocation: its cluster answered already
        return True
    conf = environ.get("SLURM_CONF")
    if conf:
        return is_file(conf)
    return any(is_file(path) for path in CONFIG_PATHS)


@dataclass(frozen=True)
class Allocation:
    """A job's nodes as Slurm sees them now."""

    job_id: str
    nodes: tuple[str, ...]
    healthy: tuple[str, ...]
    unhealthy: Mapping[str, str] = field(default_factory=dict)
    """node -> why it is not usable (``"DOWN+NOT_RESPONDING"``, ``"drained: sres: ..."``)."""
    addresses: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)
    """node -> its slurmd's port (0: not known)."""

    @property
    def master_node(self) -> str:
        """The first healthy node: where rank 0 and the store go."""
        if not self.healthy:
            raise SlurmError(f"job {self.job_id} has no healthy node left")
        return self.healthy[0]

    @property
    def master_addr(self) -> str:
        return self.addresses.get(self.master_node) or self.master_node

    def spares(self, in_use: Iterable[str]) -> tuple[str, ...]:
        """Healthy nodes of the allocation that no rank uses, in allocation order."""
        busy = set(in_use)
        return tuple(n for n in self.healthy if n not in busy)


def classify(job_id: str, job_nodes: Iterable[str], records: Iterable[Node]) -> Allocation:
    """Split a job's nodes into healthy and unhealthy from node records. Pure.

    A node of the job that Slurm no longer lists counts as unhealthy rather than being
    dropped silently: it was part of the allocation and something removed it.
    """
    by_name = {n.name: n for n in records}
    healthy: list[str] = []
    unhealthy: dict[str, str] = {}
    addresses: dict[str, str] = {}
    ports: dict[str, int] = {}
    nodes = tuple(job_nodes)
    for name in nodes:
        node = by_name.get(name)
        if node is None:
            unhealthy[name] = "unknown to Slurm"
            continue
        addresses[name] = node.address or node.hostname or name
        ports[name] = node.port
        if node.usable:
            healthy.append(name)
        elif node.drained:
            unhealthy[name] = f"drained: {node.reason}" if node.reason else "drained"
        else:
            unhealthy[name] = node.long_state
    return Allocation(job_id, nodes, tuple(healthy), unhealthy, addresses, ports)


def discover(
    client: SlurmClient, job_id: str | None = None, env: Mapping[str, str] | None = None
) -> Allocation:
    """Ask Slurm for the job's current nodes and their health.

    ``job_id`` defaults to ``SLURM_JOB_ID`` of ``env`` (the process environment by default).
    """
    if job_id is None:
        env = os.environ if env is None else env
        job_id = env.get("SLURM_JOB_ID")
        if not job_id:
            raise NotInAllocation(
                "not inside a Slurm allocation (SLURM_JOB_ID is unset): run under sbatch or salloc"
            )
    job = client.job(job_id)
    if not job.running:
        raise SlurmError(f"job {job_id} is {job.state}, not running")
    return classify(job.job_id, job.nodes, client.nodes(names=job.nodes))
