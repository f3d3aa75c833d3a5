"""``TierConfig``: which checkpoint tiers a run uses, as ``sres run`` and every rank see it.

One frozen, validated value: from ``sres run`` flags, a YAML file (``from_yaml``), or
``resilience.run(train, tiers=...)``; ranks get it as JSON in ``SRES_TIERS``. Where the tiers
keep their files is :mod:`resilience.tiers.layout`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilience.errors import SettingsUnreadable, TierConfigError

TIERS_ENV = "SRES_TIERS"


def check_job_id(job_id: str) -> None:
    """A job id names a directory under the RAM root: nothing that could leave it."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", job_id or "") or job_id in (".", ".."):
        raise ValueError(f"not a job id: {job_id!r}")


@dataclass(frozen=True)
class TierConfig:
    """Which tiers a run uses, validated when built. One place: ``sres run`` flags, a YAML
    file (``from_yaml``), or ``resilience.run(train, tiers=...)``; ranks get it as JSON in
    ``SRES_TIERS``."""

    job_id: str
    ram: bool = True
    neighbour: bool = True
    persistent_dir: str | None = None
    persist_every: int = 0
    """K: every K-th commit goes to the persistent tier (0: only on flush requests)."""
    ram_every: int = 1
    """Every N-th step (by step number, the same on every rank) goes to the RAM and neighbour
    tiers. 1 protects every commit; each save costs a copy, a /dev/shm write and a send in the
    background, which competes with training where CPU cores are scarce."""
    budget: float = 0.03
    """The protection budget: the share of step time the RAM and neighbour tiers' copies may
    take; the cadence is chosen online from their measured cost to stay within it
    (:mod:`resilience.tiers.budget`). 0 copies every ``ram_every``-th commit whatever it
    costs; a ``ram_every`` above 1 fixes the cadence, and the budget is not used."""
    keep_ram: int = 2
    keep_persistent: int = 2
    fsync: bool = True
    """fsync persistent files before their manifest (a crash of the file server must not leave
    a manifest that names unwritten data)."""
    share_group: bool = False
    """Persistent checkpoints readable by the persistent directory's group (step and rank
    directories 0750, files 0640), for a project that shares one; never writable by it. Off:
    the user's alone whatever the umask. A run still loads only its user's own files."""
    persist_replicated_once: bool = True
    """In the persistent tier, ranks other than 0 write only their sharded state; their
    manifests point at rank 0's replicated file and carry their own checksum for it, which a
    restore verifies. Data parallelism then sends the model to the shared filesystem once, not
    once per rank. A rank that finds its replicated state differs from rank 0's (checked at
    its next save) writes its own copy from then on."""

    def __post_init__(self) -> None:
        check_job_id(self.job_id)
        for name, kind, what in _TYPED:
            value = getattr(self, name)
            if (
                type(value) is not kind
                and not (value is None and name == "persistent_dir")
                and not (kind is float and type(value) is int)
            ):
                raise TierConfigError(f"{name}: {value!r} is not {what}")
        if self.persist_every < 0:
            raise TierConfigError(f"persist_every must be >= 0 (got {self.persist_every})")
        if self.persist_every and not self.persistent_dir:
            raise TierConfigError("persist_every needs a persistent directory (--persistent-dir)")
        if not 0 <= self.budget < 1:
            raise TierConfigError(f"budget is a share of step time, 0 <= budget < 1 (got {self.budget})")
        if self.ram_every < 1:
            raise TierConfigError(f"ram_every must be >= 1 (got {self.ram_every})")
        if self.keep_ram < 1 or self.keep_persistent < 1:
            raise TierConfigError("keep_ram and keep_persistent must be >= 1")
        if self.share_group and not self.persistent_dir:
            raise TierConfigError("share_group shares the persistent tier: it needs a persistent directory")
        if self.neighbour and not self.ram:
            raise TierConfigError("the neighbour tier copies the RAM tier: it needs ram=True")

    @property
    def enabled(self) -> bool:
        return self.ram or bool(self.persistent_dir)

    @property
    def budgeted(self) -> bool:
        """Whether the RAM and neighbour tiers' cadence is the budget's to choose."""
        return self.ram and self.budget > 0 and self.ram_every == 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], **overrides: Any) -> "TierConfig":
        values = {**dict(data), **{k: v for k, v in overrides.items() if v is not None}}
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise TierConfigError(f"unknown tier setting(s): {', '.join(sorted(unknown))}")
        if values.get("persistent_dir") is not None:
            values["persistent_dir"] = str(values["persistent_dir"])
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: Path, **overrides: Any) -> "TierConfig":
        """Settings from a YAML file (top level, or under ``tiers:``); ``overrides`` that are
        not None win (command-line flags)."""
        return cls.from_mapping(_yaml_settings(path), **overrides)

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> "TierConfig | None":
        text = env.get(TIERS_ENV)
        return cls.from_mapping(json.loads(text)) if text else None

    @classmethod
    def from_option(
        cls, option: Any, current: "TierConfig | None", env: Mapping[str, str]
    ) -> "TierConfig | None":
        """``resilience.run(train, tiers=...)``: a TierConfig, a mapping of settings, a YAML
        path, or None (tiers off). Settings not given keep what ``sres run`` configured."""
        if option is None or isinstance(option, TierConfig):
            return option
        base = asdict(current) if current is not None else {"job_id": env.get("SLURM_JOB_ID") or "local"}
        if isinstance(option, (str, Path)):
            option = _yaml_settings(Path(option))
        return cls.from_mapping({**base, **dict(option)})


_COUNTS = ("persist_every", "ram_every", "keep_ram", "keep_persistent")
_SWITCHES = ("ram", "neighbour", "fsync", "persist_replicated_once", "share_group")
_TYPED = (
    *((name, int, "a whole number") for name in _COUNTS),
    *((name, bool, "true or false") for name in _SWITCHES),
    ("persistent_dir", str, "a path"),
    ("budget", float, "a number"),
)
"""Settings come from YAML and JSON as they are written (``keep_ram: two``): each must be of
its type before a bound is compared with it."""


def _yaml_settings(path: Path) -> dict[str, Any]:
    from resilience.contract import settings_yaml  # YAML only where a file is read

    try:
        data = settings_yaml.read(Path(path)) or {}
    except SettingsUnreadable as err:
        raise TierConfigError(f"{path}: cannot read the tier settings ({err})") from None
    data = data.get("tiers", data) if isinstance(data, dict) else data
    if not isinstance(data, dict):
        raise TierConfigError(f"{path}: expected a mapping of tier settings")
    return data
