"""A Slurm cluster of its own with the health hooks configured (Prolog, Epilog,
HealthCheckProgram), written by the same code that ``sres hooks install`` uses.

The health-check program starts disabled (``HealthCheckInterval=0``) so that a test decides
when slurmd starts running it (:func:`enable_health_checks`): a test of the prolog path must
not have its node drained by the health check first.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import yaml

from slurm_plugins import wrappers
from tests.support.slurm_cluster import SlurmCluster

REPO = Path(__file__).resolve().parents[2]
NODES = 3


class HookCluster:
    """The cluster, where the hooks live, and how a test changes their config."""

    def __init__(self, cluster: SlurmCluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.prefix = root / "sres"
        self.config_path = self.prefix / wrappers.CONFIG_NAME
        self.log_file = root / "health.jsonl"
        self.mounts = root / "mnt"
        self.ram_root_template = str(root / "shm-{uid}")
        self.ram_root = self.ram_root_of(0)
        """Root's: the jobs of these tests run as root, but for one of another user's."""

    def ram_root_of(self, uid: int) -> Path:
        return Path(self.ram_root_template.replace("{uid}", str(uid)))

    def base_config(self) -> dict:
        return {
            "log": {"file": str(self.log_file), "syslog": True},
            "budget": {"per_check_s": 10, "total_s": 20},
            "ram_root": self.ram_root_template,
            "state_dir": str(self.root / "state"),
            "checks": {
                "disk": [{"path": "/tmp", "min_free_mib": 10}],
                "shm": {"min_free_mib": 10},
                "memory": {"min_free_mib": 10},
                # A per-node directory stands for a mount: all nodes share this host.
                "mounts": [{"path": str(self.mounts / "%n"), "mountpoint": False, "writable": True}],
            },
            "deep": {
                "per_check_s": 40,
                "allreduce_mib": 1,
                "allreduce_cpu_min_gbps": 0.0001,
                "memory_mib": 16,
                "memory_s": 0.5,
                "disk_path": str(self.root),
                "disk_mib": 8,
                "disk_s": 0.5,
            },
        }

    def write_config(self, config: dict) -> None:
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config))
        tmp.replace(self.config_path)

    def events(self, **match) -> list[dict]:
        if not self.log_file.exists():
            return []
        found = []
        for line in self.log_file.read_text().splitlines():
            event = json.loads(line)
            if all(event.get(k) == v for k, v in match.items()):
                found.append(event)
        return found

    def set_health_interval(self, seconds: int) -> None:
        conf = self.cluster.conf_path
        lines = [
            f"HealthCheckInterval={seconds}" if line.startswith("HealthCheckInterval=") else line
            for line in conf.read_text().splitlines()
        ]
        conf.write_text("\n".join(lines) + "\n")
        subprocess.run(
            ["scontrol", "reconfigure"], env=self.cluster.env(), check=True, timeout=30, capture_output=True
        )


def hook_conf(prefix: Path) -> str:
    return "\n".join(
        [
            *[
                line
                for line in wrappers.slurm_conf_lines(str(prefix), interval_s=0)
                if not line.startswith("SchedulerParameters")
            ],
            # The base config's SchedulerParameters line comes first: the last one wins.
            "SchedulerParameters=permit_job_expansion,nohold_on_prolog_fail",
            "RebootProgram=/bin/true",
        ]
    )


def wait_for(predicate, timeout: float, what) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(what() if callable(what) else what)
        time.sleep(0.25)
