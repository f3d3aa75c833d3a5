"""The health checks and which of them a config turns on.

Each check is a small function in its own module; :func:`enabled_checks` is the one place
that maps configuration to checks, so adding a check never means editing a hook.
"""

from __future__ import annotations

from slurm_plugins.checks.base import Check, CheckContext, CheckResult, Fault, Status
from slurm_plugins.checks.command import command_check
from slurm_plugins.checks.gpu import check_gpu
from slurm_plugins.checks.processes import check_processes
from slurm_plugins.checks.slurmctld import check_slurmctld
from slurm_plugins.checks.system import check_disk, check_memory, check_mounts, check_shm
from slurm_plugins.health_config import HealthConfig

__all__ = ["Check", "CheckContext", "CheckResult", "Fault", "Status", "enabled_checks"]


def enabled_checks(config: HealthConfig) -> list[Check]:
    c = config.checks
    checks = []
    if c.gpu.enabled:
        checks.append(Check("gpu", check_gpu, Fault.TRANSIENT))  # a hung NVML: the driver may need a reload
    if c.memory.enabled:
        checks.append(Check("memory", check_memory))
    checks.append(Check("disk", check_disk))
    if c.shm.enabled:
        checks.append(Check("shm", check_shm))
    checks.append(Check("mounts", check_mounts))  # a hung NFS mount times out here
    if c.processes.enabled:
        checks.append(Check("processes", check_processes))
    if c.slurmctld.enabled:
        checks.append(Check("slurmctld", check_slurmctld, Fault.TRANSIENT))
    checks += [Check(spec.name, command_check(spec), Fault(spec.fault)) for spec in c.commands]
    return checks
