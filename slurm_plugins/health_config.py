"""The health hooks' configuration: frozen dataclasses built from one YAML file.

Why one validating builder: a typo in ``/etc/sres/health.yaml`` reaches every node at once,
so it must be refused with one line that names the key (``checks.memory.min_free_mib: must
not be negative``), never silently ignored and never a traceback. The file is found in one
place (:func:`config_path`): ``--config``, else ``$SRES_HEALTH_CONFIG``, else the default.
What a hook does with a bad file (fail open or closed) is :mod:`slurm_plugins.hooks`' job.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from resilience.contract import settings_yaml

from slurm_plugins.errors import HealthConfigError

DEFAULT_PATH = Path("/etc/sres/health.yaml")
ENV_VAR = "SRES_HEALTH_CONFIG"

Action = Literal["drain", "reboot"]
FaultName = Literal["transient", "persistent"]

THROTTLE_REASONS = {
    # NVML clocks-event (throttle) reason bits; the first three are normal operation.
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}


@dataclass(frozen=True)
class Budget:
    """Hard time limits: a hung NVML call or NFS mount must not hang the prolog."""

    per_check_s: float = 10.0
    total_s: float = 30.0
    slurm_s: float = 10.0  # each Slurm command of a hook (drain, resume, node state)
    cleanup_s: float = 30.0  # the epilog's removal of a job's RAM tier, as the job's user

    def __post_init__(self) -> None:
        if min(self.per_check_s, self.total_s, self.slurm_s, self.cleanup_s) <= 0:
            raise ValueError("per_check_s, total_s, slurm_s and cleanup_s must be positive")


@dataclass(frozen=True)
class LogConfig:
    file: str = "/var/log/sres/health.jsonl"
    syslog: bool = True


@dataclass(frozen=True)
class Actions:
    """What a failure of each fault class does to the node."""

    transient: Action = "drain"
    persistent: Action = "drain"


@dataclass(frozen=True)
class GpuConfig:
    enabled: bool = True
    expected_count: int | None = None
    ecc_uncorrectable_max: int = 0
    retired_pages_max: int = 60
    max_temperature_c: float = 90.0
    fail_throttle_reasons: tuple[str, ...] = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
    nvlink: bool = True
    xid_fail: tuple[int, ...] = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120)
    xid_state_file: str = "/var/lib/sres/xid.state"

    def __post_init__(self) -> None:
        unknown = [r for r in self.fail_throttle_reasons if r not in THROTTLE_REASONS]
        if unknown:
            raise ValueError(
                f"fail_throttle_reasons: unknown reason {unknown[0]!r} (known: {', '.join(THROTTLE_REASONS)})"
            )


@dataclass(frozen=True)
class MemoryConfig:
    enabled: bool = True
    min_free_mib: int = 512


@dataclass(frozen=True)
class PathSpace:
    path: str
    min_free_mib: int = 1024


@dataclass(frozen=True)
class ShmConfig:
    enabled: bool = True
    path: str = "/dev/shm"
    min_free_mib: int = 512
    count_users_files: bool = False
    """Whether space held by files of users (not root's) counts as used. Off: any user can fill
    ``/dev/shm``, and draining for that let one user take nodes from everyone; their files go
    with their jobs' epilogs, or a reboot."""


@dataclass(frozen=True)
class Mount:
    """A path jobs need. ``%n`` is replaced by the node name, as in slurm.conf."""

    path: str
    mountpoint: bool = True
    writable: bool = True


@dataclass(frozen=True)
class Toggle:
    enabled: bool = True


@dataclass(frozen=True)
class SlurmctldConfig:
    enabled: bool = True
    timeout_s: float = 3.0


@dataclass(frozen=True)
class CommandCheck:
    """A site's own check: a program that exits 0 when the node is fine."""

    name: str
    command: tuple[str, ...]
    fault: FaultName = "persistent"


@dataclass(frozen=True)
class ChecksConfig:
    gpu: GpuConfig = field(default_factory=GpuConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    disk: tuple[PathSpace, ...] = (PathSpace("/tmp"),)
    shm: ShmConfig = field(default_factory=ShmConfig)
    mounts: tuple[Mount, ...] = ()
    processes: Toggle = field(default_factory=Toggle)
    slurmctld: SlurmctldConfig = field(default_factory=SlurmctldConfig)
    commands: tuple[CommandCheck, ...] = ()


@dataclass(frozen=True)
class DeepConfig:
    """Deep checks: run by ``sres hooks deep-check`` and before a drained node is resumed."""

    before_resume: bool = True
    per_check_s: float = 30.0
    total_s: float = 50.0  # slurmd kills a HealthCheckProgram after 60 s
    gpu_stress_s: float = 10.0
    allreduce_mib: int = 64
    allreduce_min_gbps: float = 10.0  # NCCL bus bandwidth across this node's GPUs
    allreduce_cpu_min_gbps: float = 0.05  # gloo on CPU, where a node has fewer than 2 GPUs
    allreduce_cpu_procs: int = 2
    memory_mib: int = 256
    memory_s: float = 5.0
    disk_path: str = "/tmp"
    disk_mib: int = 128
    disk_s: float = 5.0


@dataclass(frozen=True)
class HealthConfig:
    on_config_error: Literal["open", "closed"] = "open"
    budget: Budget = field(default_factory=Budget)
    log: LogConfig = field(default_factory=LogConfig)
    actions: Actions = field(default_factory=Actions)
    ram_root: str | None = None
    state_dir: str = "/var/lib/sres"
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    deep: DeepConfig = field(default_factory=DeepConfig)


def config_path(explicit: str | None, env: Mapping[str, str]) -> tuple[Path, bool]:
    """Where the config is and whether it was asked for (a missing default file is fine)."""
    if explicit:
        return Path(explicit), True
    if env.get(ENV_VAR):
        return Path(env[ENV_VAR]), True
    return DEFAULT_PATH, False


def load(path: Path, required: bool = True) -> HealthConfig:
    """Read and validate; a missing default file means the built-in defaults."""
    if not path.exists():
        if required:
            raise HealthConfigError(str(path), "", "no such file")
        return HealthConfig()
    return parse(read_raw(path), str(path))


def read_raw(path: Path) -> Any:
    try:
        return settings_yaml.load_file(path) or {}
    except OSError as err:
        raise HealthConfigError(str(path), "", f"cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError:
        raise HealthConfigError(str(path), "", "not UTF-8 text") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise HealthConfigError(str(path), "", f"not valid YAML{where}") from None


def parse(data: Any, source: str = "<config>") -> HealthConfig:
    """Build a :class:`HealthConfig` from parsed YAML, refusing anything unexpected."""
    return _build(HealthConfig, data, "", source)


def failure_policy(data: Any) -> str:
    """``on_config_error`` of a config that did not validate; ``open`` when unreadable too."""
    value = data.get("on_config_error") if isinstance(data, dict) else None
    return value if value in ("open", "closed") else "open"


def to_dict(config: HealthConfig) -> dict:
    """Plain data (YAML-ready): what ``sres hooks install`` ships when no file is given."""
    return _plain(dataclasses.asdict(config))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


# --- the builder: walks the dataclasses' type hints ------------------------------------------


def _build(cls: type, data: Any, key: str, source: str) -> Any:
    if not isinstance(data, dict):
        raise HealthConfigError(source, key or "(top level)", f"expected a mapping, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        known = ", ".join(fields)
        raise HealthConfigError(source, _join(key, str(unknown[0])), f"unknown key (known here: {known})")
    values = {}
    for name, f in fields.items():
        sub = _join(key, name)
        if name in data:
            values[name] = _value(hints[name], data[name], sub, source)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise HealthConfigError(source, sub, "missing (required)")
    try:
        return cls(**values)
    except ValueError as err:
        raise HealthConfigError(source, key or "(top level)", str(err)) from None


def _value(hint: Any, data: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _value(inner, data, key, source)
    if origin is Literal:
        if data not in args:
            raise HealthConfigError(
                source, key, f"must be one of {', '.join(map(str, args))}, got {_show(data)}"
            )
        return data
    if origin is tuple:
        if not isinstance(data, list):
            raise HealthConfigError(source, key, f"expected a list, got {_show(data)}")
        return tuple(_value(args[0], item, f"{key}[{i}]", source) for i, item in enumerate(data))
    if dataclasses.is_dataclass(hint):
        return _build(hint, data, key, source)
    if hint is bool:
        if not isinstance(data, bool):
            raise HealthConfigError(source, key, f"expected true or false, got {_show(data)}")
        return data
    if hint in (int, float):
        ok = isinstance(data, int) if hint is int else isinstance(data, (int, float))
        if isinstance(data, bool) or not ok:
            what = "an integer" if hint is int else "a number"
            raise HealthConfigError(source, key, f"expected {what}, got {_show(data)}")
        if data < 0:
            raise HealthConfigError(source, key, f"must not be negative, got {data}")
        return hint(data)
    if hint is str:
        if not isinstance(data, str) or not data:
            raise HealthConfigError(source, key, f"expected a non-empty string, got {_show(data)}")
        return data
    raise TypeError(f"unsupported config type {hint!r} for {key}")  # a bug of ours


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"[:80]
