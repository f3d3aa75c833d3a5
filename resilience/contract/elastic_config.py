"""``ElasticConfig``: how far a run's world may shrink and grow, and what a node loss does.

One frozen, validated value, built from ``sres run`` flags, a YAML file (``--elastic-config``)
or ``resilience.run(train, elastic={...})``, with the same keys everywhere. The supervisor
decides resizes with it; ranks use its batch keys (``batch_policy``, ``lr_scaling``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from resilience.errors import ElasticConfigError, SettingsUnreadable

BATCH_POLICIES = ("keep-closest", "fail")
"""What a world that does not divide the global batch does (``resilience.elastic.batch_plan``)."""
LR_SCALINGS = ("linear", "sqrt", "none")
ON_NO_SPARE = ("shrink", "wait", "requeue", "fail")
ELASTIC_ENV = "SRES_ELASTIC"


@dataclass(frozen=True)
class ElasticConfig:
    """Bounds and behaviour of resizing. ``None`` bounds mean the starting size (not elastic)."""

    min_nodes: int | None = None
    max_nodes: int | None = None
    on_no_spare: str | None = None
    """A node lost with no spare: ``shrink`` (the default when min < current), ``wait`` for a
    node up to ``resize_timeout_s``, ``requeue`` (Slurm) or ``fail``."""
    resize_step: int | None = None
    """The world changes by multiples of this many nodes (exclusive with ``resize_sizes``)."""
    resize_sizes: tuple[int, ...] | None = None
    """The only node counts the world may have."""
    grow_snooze_s: float = 30.0
    """No growth into free capacity within this many seconds after a restart or resize."""
    resize_timeout_s: float = 300.0
    """How long ``wait`` holds for a node before the fallback (requeue under Slurm, else fail)."""
    drain_grace_s: float = 30.0
    """How long leaving ranks may take to reach a step boundary before they are released."""
    batch_policy: str = "keep-closest"
    lr_scaling: str = "linear"

    def __post_init__(self) -> None:
        if self.resize_sizes is not None:
            object.__setattr__(self, "resize_sizes", tuple(sorted(set(int(s) for s in self.resize_sizes))))
        if self.min_nodes is not None and self.min_nodes < 1:
            raise ElasticConfigError(f"min_nodes must be at least 1 (got {self.min_nodes})")
        if self.min_nodes is not None and self.max_nodes is not None and self.max_nodes < self.min_nodes:
            raise ElasticConfigError(f"max_nodes {self.max_nodes} is below min_nodes {self.min_nodes}")
        if self.on_no_spare is not None and self.on_no_spare not in ON_NO_SPARE:
            raise ElasticConfigError(f"on_no_spare {self.on_no_spare!r}: one of {', '.join(ON_NO_SPARE)}")
        if self.resize_step is not None and self.resize_sizes is not None:
            raise ElasticConfigError("resize_step and resize_sizes exclude each other: give one")
        if self.resize_step is not None and self.resize_step < 1:
            raise ElasticConfigError(f"resize_step must be at least 1 (got {self.resize_step})")
        if self.resize_sizes is not None and (not self.resize_sizes or self.resize_sizes[0] < 1):
            raise ElasticConfigError("resize_sizes must be node counts >= 1")
        for name in ("grow_snooze_s", "resize_timeout_s", "drain_grace_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ElasticConfigError(f"{name} must be a number of seconds >= 0 (got {value})")
        if self.batch_policy not in BATCH_POLICIES:
            raise ElasticConfigError(
                f"batch_policy {self.batch_policy!r}: one of {', '.join(BATCH_POLICIES)}"
            )
        if self.lr_scaling not in LR_SCALINGS:
            raise ElasticConfigError(f"lr_scaling {self.lr_scaling!r}: one of {', '.join(LR_SCALINGS)}")

    # --- for a run of ``nodes`` nodes -------------------------------------------------------------

    def for_run(self, nodes: int) -> "ElasticConfig":
        """Bounds filled in for a run that starts with ``nodes`` nodes, checked against it."""
        lo = self.min_nodes if self.min_nodes is not None else nodes
        hi = self.max_nodes if self.max_nodes is not None else max(nodes, lo)
        if not lo <= nodes <= hi:
            raise ElasticConfigError(
                f"the run starts with {nodes} node(s), outside min_nodes {lo} .. max_nodes {hi}"
            )
        on = self.on_no_spare or ("shrink" if lo < nodes else None)
        done = replace(self, min_nodes=lo, max_nodes=hi, on_no_spare=on)
        if done.resize_sizes is not None and nodes not in done.resize_sizes:
            raise ElasticConfigError(
                f"the run starts with {nodes} node(s), not one of resize_sizes "
                f"{','.join(map(str, done.resize_sizes))}"
            )
        return done

    @property
    def elastic(self) -> bool:
        return self.min_nodes != self.max_nodes

    @property
    def bounds(self) -> tuple[int, int]:
        """``(min_nodes, max_nodes)`` of a config filled in by :meth:`for_run` (as a ``RunConfig``'s
        is): the methods below judge sizes of a run."""
        assert self.min_nodes is not None and self.max_nodes is not None, "bounds before for_run"
        return self.min_nodes, self.max_nodes

    def allowed(self, count: int, start: int) -> bool:
        """Whether the world may have ``count`` nodes (``start``: the run's first size)."""
        lowest, highest = self.bounds
        if not lowest <= count <= highest:
            return False
        if self.resize_sizes is not None:
            return count in self.resize_sizes
        return self.resize_step is None or (count - start) % self.resize_step == 0

    def largest_allowed(self, at_most: int, start: int) -> int | None:
        """The largest allowed node count not above ``at_most``, or None."""
        return next((n for n in range(at_most, 0, -1) if self.allowed(n, start)), None)

    def why_not(self, count: int, start: int) -> str | None:
        """Why a world of ``count`` nodes is refused (one line), or None."""
        lowest, highest = self.bounds
        if count < lowest:
            return f"{count} node(s) is below --min-nodes {lowest}"
        if count > highest:
            return f"{count} node(s) is above --max-nodes {highest}"
        if not self.allowed(count, start):
            rule = (
                f"--resize-sizes {','.join(map(str, self.resize_sizes))}"
                if self.resize_sizes is not None
                else f"--resize-step {self.resize_step} from {start}"
            )
            return f"{count} node(s) is not an allowed size ({rule})"
        return None

    # --- reading and passing on ----------------------------------------------------------------------

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], where: str = "elastic") -> "ElasticConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ElasticConfigError(
                f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        out = dict(values)
        if isinstance(out.get("resize_sizes"), str):
            out["resize_sizes"] = [s for s in out["resize_sizes"].split(",") if s.strip()]
        try:
            if out.get("resize_sizes") is not None:
                out["resize_sizes"] = tuple(int(s) for s in out["resize_sizes"])
            for name in ("min_nodes", "max_nodes", "resize_step"):
                if out.get(name) is not None:
                    out[name] = int(out[name])
            for name in ("grow_snooze_s", "resize_timeout_s", "drain_grace_s"):
                if name in out:
                    out[name] = float(out[name])
        except (TypeError, ValueError) as err:
            raise ElasticConfigError(f"{where}: {err}") from None
        return cls(**out)

    def updated(self, values: Mapping[str, Any], where: str) -> "ElasticConfig":
        """This config with ``values`` (same keys and conversions as :meth:`from_mapping`) over it."""
        return type(self).from_mapping(
            {**{f.name: getattr(self, f.name) for f in fields(self)}, **values}, where
        )

    @classmethod
    def from_yaml(cls, path: str | Path) -> "ElasticConfig":
        from resilience.contract import settings_yaml  # YAML only where a file is read

        try:
            data = settings_yaml.read(Path(path)) or {}
        except SettingsUnreadable as err:
            raise ElasticConfigError(f"--elastic-config {path}: {err}") from None
        if not isinstance(data, dict):
            raise ElasticConfigError(f"--elastic-config {path}: expected a mapping of keys")
        return cls.from_mapping(data, f"--elastic-config {path}")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ElasticConfig":
        return cls.from_mapping(json.loads(text), ELASTIC_ENV)
