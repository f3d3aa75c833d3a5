"""What every health check is and returns.

A check is a small function ``(CheckContext) -> list[CheckResult]``: most return one result,
the GPU check returns one per aspect (count, ECC, pages, XID, thermal, NVLink) from a single
NVML read. Results are plain data so that they cross the process boundary of the runner as
JSON and land in the log as one line each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path

from slurm_plugins.health_config import HealthConfig


class Status(str, Enum):
    OK = "ok"
    FAIL = "fail"
    SKIPPED = "skipped"
    TIMEOUT = "timeout"


class Fault(str, Enum):
    """Transient: a reboot may fix it (GPU fell off the bus). Persistent: it needs a person."""

    TRANSIENT = "transient"
    PERSISTENT = "persistent"


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: Status
    detail: str = ""
    fault: Fault = Fault.PERSISTENT
    duration_s: float = 0.0

    @property
    def failed(self) -> bool:
        """A timeout is a failure: a check that cannot answer in time is not a healthy one."""
        return self.status in (Status.FAIL, Status.TIMEOUT)

    def to_json(self) -> dict:
        data = asdict(self)
        data["status"], data["fault"] = self.status.value, self.fault.value
        data["duration_s"] = round(self.duration_s, 3)
        return data

    @classmethod
    def from_json(cls, data: Mapping) -> "CheckResult":
        return cls(
            str(data["check"]),
            Status(data["status"]),
            str(data.get("detail", "")),
            Fault(data.get("fault", "persistent")),
            float(data.get("duration_s", 0.0)),
        )


def ok(check: str, detail: str = "") -> CheckResult:
    return CheckResult(check, Status.OK, detail)


def fail(check: str, detail: str, fault: Fault = Fault.PERSISTENT) -> CheckResult:
    return CheckResult(check, Status.FAIL, detail, fault)


def skipped(check: str, detail: str) -> CheckResult:
    return CheckResult(check, Status.SKIPPED, detail)


@dataclass(frozen=True)
class CheckContext:
    """What a check may know about where it runs; nothing else is global."""

    config: HealthConfig
    node: str
    cluster: str | None = None
    job_id: str | None = None
    slurm_conf: Path | None = None
    env: Mapping[str, str] = field(default_factory=dict)

    def expand(self, path: str) -> str:
        """``%n`` -> node name, as Slurm does in slurm.conf paths."""
        return path.replace("%n", self.node)


CheckFn = Callable[[CheckContext], list[CheckResult]]


@dataclass(frozen=True)
class Check:
    """A named check; ``fault`` classifies its timeout or crash."""

    name: str
    run: CheckFn
    fault: Fault = Fault.PERSISTENT
