"""``RunRequest``: everything one supervised run needs, frozen and validated, with its JSON encoding.

The Python API of a run: ``sres run``/``sres srun`` build one from their options,
``ResilientExecutor`` from its parameters, and :func:`launcher.run.supervise.supervise` runs it.
It crosses a process boundary (submitit's job process gets it on its command line) only as
:meth:`RunRequest.to_json` / :meth:`RunRequest.from_json`.

Validated when built: each value is read as its field's type (``"3"`` is a count of 3, a list
becomes a tuple, text a path: environment variables and JSON arrive as text and lists), the
enumerated options hold one of their choices, and the rules between the request's own fields
hold. The ranges and the order of timeouts are ``RunConfig``'s, checked when ``supervise``
builds it. Errors are :class:`launcher.errors.ConfigError`, one line each.

The signal latch imports this module before torch (:func:`preempt_signal_in`): at import time,
the standard library and torch-free launcher modules only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from launcher.errors import ConfigError

LAUNCHERS = ("local", "slurm")
BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class RunOptions:
    """How a run is supervised: one field per option of ``sres run`` and ``sres srun`` (by its
    Python name: ``--hang-timeout`` -> ``hang_timeout``) and per option variable of
    :mod:`launcher.run.environment`, with the command line's defaults (unit tests keep the
    three, and these defaults and ``RunConfig``'s and ``StragglerConfig``'s, equal: written out
    here, since the latch imports this module before torch). Units are the flags': seconds, counts.
    """

    # faults, recovery, timing
    inject: tuple[str, ...] = ()
    """Faults to inject, ``--inject`` specs (resilience/agent/faults.py)."""
    log_dir: Path | None = None
    """None: ``sres-runs/job-<id>`` in a Slurm job, else ``sres-runs/run-<time>``."""
    standby: int = 0
    no_fork_server: bool = False
    backend: str = "gloo"
    hang_timeout: float = 30.0
    reform_timeout: float = 60.0
    replication_factor: int = 2
    copy_pace: float = 0.5
    node_fault_after: int = 2
    # requeues (Slurm batch jobs)
    max_requeues: int | None = 3
    """None: no cap of ours (Slurm's MaxBatchRequeue still applies)."""
    max_timeout_requeues: int | None = None
    """None: requeues at the time limit count with the others."""
    preempt_signal: str = "USR2"
    # watching
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"
    metrics_textfile: Path | None = None
    straggler_factor: float = 1.5
    straggler_steps: int = 20
    straggler_action: str = "none"
    # capacity: where a Slurm run's nodes come from beyond its allocation
    no_grow: bool = False
    grow_by: str = "satellite"
    all_satellites: bool = False
    lend_partition: str | None = None
    repair_after: float | None = None
    """Local runs only: a drained simulated node is healthy again this many seconds later."""
    # checkpoint tiers
    persistent_dir: str | None = None
    persist_every: int | None = None
    job_id: str | None = None
    ram_every: int | None = None
    tier_config: Path | None = None
    no_tiers: bool = False
    # elastic (None: ElasticConfig's default, or the YAML file's)
    min_nodes: int | None = None
    max_nodes: int | None = None
    on_no_spare: str | None = None
    resize_step: int | None = None
    resize_sizes: str | None = None
    grow_snooze: float | None = None
    resize_timeout: float | None = None
    drain_grace: float | None = None
    batch_policy: str | None = None
    lr_scaling: str | None = None
    elastic_config: Path | None = None

    def __post_init__(self) -> None:
        _read_fields(self, flag)
        for name, choices in _choices().items():
            value = getattr(self, name)
            if value is not None and value not in choices:
                raise ConfigError(f"{flag(name)} {value!r}: one of {', '.join(choices)}")

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> RunOptions:
        """Options from name -> value (text, as the environment gives it, or Python values)."""
        unknown = sorted(set(values) - {f.name for f in fields(cls)})
        if unknown:
            raise ConfigError(f"unknown option {flag(unknown[0])}")
        return cls(**values)


MAX_COUNT = 100_000
"""Nodes, ranks per node or spares beyond any cluster: a count this large is a typo, and one of
ten digits would have the supervisor build a plan of billions of slots before anything ran."""


@dataclass(frozen=True)
class RunRequest:
    """One run: its command and shape, where its ranks run, and how it is supervised."""

    command: tuple[str, ...]
    """What every rank runs. Empty only in a request still to be completed (ResilientExecutor's:
    its job process adds the rank command); ``supervise`` refuses an empty one."""
    nodes: int
    """Nodes that hold ranks."""
    procs_per_node: int = 1
    spares: int = 0
    """Warm spare nodes: processes started and waiting to take a lost node's ranks."""
    max_restarts: int = 10
    """Faults after which the run gives up."""
    launcher: str = "local"
    """Where ranks run: ``local`` (simulated nodes on this machine) or ``slurm`` (srun steps of
    the Slurm job this process runs in)."""
    step_args: tuple[str, ...] = ()
    """With ``slurm``: options for every rank's srun step (``--gpus-per-task=1``)."""
    partition: str | None = None
    """With ``slurm``: the steps' partition (srun's ``-p``)."""
    options: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        _read_fields(self, str)
        if not isinstance(self.options, RunOptions):
            raise ConfigError(f"options: {self.options!r} is not a RunOptions")
        if self.launcher not in LAUNCHERS:
            raise ConfigError(f"launcher {self.launcher!r}: one of {', '.join(LAUNCHERS)}")
        for name in ("nodes", "procs_per_node", "spares"):
            if getattr(self, name) > MAX_COUNT:
                raise ConfigError(f"{flag(name)} {getattr(self, name)}: more than {MAX_COUNT} (a typo?)")
        repair = self.options.repair_after
        if repair is not None and (self.launcher == "slurm" or repair < 0):
            raise ConfigError(
                "--repair-after S (S >= 0) simulates repairs of local nodes; on Slurm, resume the node"
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    def to_json(self) -> str:
        """One line of JSON: every field, paths as text, tuples as lists."""
        return json.dumps(asdict(self), default=_path_text, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RunRequest:
        """The request :meth:`to_json` wrote, validated again."""
        try:
            data = json.loads(text)
            options = RunOptions(**data.pop("options", {}))
            return cls(**data, options=options)
        except (ValueError, TypeError, AttributeError) as err:  # a ConfigError passes: it says more
            raise ConfigError(f"not a run request ({err})") from None


def preempt_signal_in(text: str) -> str | None:
    """The preempt signal a request's JSON names, read without validating it or importing more:
    the signal latch asks before torch is imported. None: the text is no request."""
    try:
        value = json.loads(text)["options"]["preempt_signal"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None


def flag(name: str) -> str:
    """An option's flag from its Python name: ``hang_timeout`` -> ``--hang-timeout``."""
    return "--" + name.replace("_", "-")


def _choices() -> dict[str, tuple[str, ...]]:
    """Option -> its allowed values, from the modules that own them (imported here, not at the
    top: the elastic ones import torch, and the latch imports this module before torch)."""
    from launcher.observability.straggler import ACTIONS
    from launcher.slurm.satellites import GROW_BY
    from resilience.contract.elastic_config import BATCH_POLICIES, LR_SCALINGS, ON_NO_SPARE

    return {
        "backend": BACKENDS,
        "grow_by": GROW_BY,
        "straggler_action": ACTIONS,
        "on_no_spare": ON_NO_SPARE,
        "batch_policy": BATCH_POLICIES,
        "lr_scaling": LR_SCALINGS,
    }


def _path_text(value: object) -> str:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{value!r} cannot be written as JSON")


# --- reading a value as its field's type -------------------------------------------------------


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError
    return int(value)


def _number(value: Any) -> float:
    """A finite number: nan compares false with every bound, so a nan timeout or factor would
    turn its check off without a word."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError
    number = float(value)
    if not math.isfinite(number):
        raise ValueError
    return number


def _text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise TypeError
    return str(value)


def _switch(value: Any) -> bool:
    return value.lower() in ("1", "true", "yes") if isinstance(value, str) else bool(value)


def _texts(value: Any) -> tuple[str, ...]:
    return tuple(_text(item) for item in ([value] if isinstance(value, str) else value))


_READERS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "int": (_count, "a whole number"),
    "float": (_number, "a number"),
    "str": (_text, "text"),
    "bool": (_switch, "true or false"),
    "Path": (Path, "a path"),
    "tuple[str, ...]": (_texts, "a list of text"),
}
"""A field's annotation -> how a value is read as that type, and what the type is called."""


def _read(annotation: str, value: Any) -> Any:
    base = annotation.removesuffix(" | None")
    if base != annotation and (value is None or (base == "int" and str(value).lower() == "none")):
        return None  # 'none': no cap, as --max-requeues none
    return _READERS[base][0](value)


def _read_fields(obj: object, name_of: Callable[[str], str]) -> None:
    """Each field of ``obj`` read as its annotation's type, in place (frozen: before anyone sees it)."""
    for f in fields(obj):  # type: ignore[arg-type]
        if f.type.removesuffix(" | None") not in _READERS:
            continue
        value = getattr(obj, f.name)
        try:
            object.__setattr__(obj, f.name, _read(str(f.type), value))
        except (TypeError, ValueError):
            what = _READERS[f.type.removesuffix(" | None")][1]
            raise ConfigError(f"{name_of(f.name)}: {value!r} is not {what}") from None
