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
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.errors import ConfigError
from launcher.run.option_spec import flag
from launcher.run.options import RunOptions
from launcher.run.typed_fields import read_fields

__all__ = ["MAX_COUNT", "RunOptions", "RunRequest", "flag", "preempt_signal_in"]

PLACEMENTS = ("local", "srun")
"""Where ranks run (:mod:`launcher.placement`): simulated nodes here, or srun steps of the job."""


MAX_COUNT = 100_000
"""Nodes, ranks per node or spares beyond any cluster: a count this large is a typo, and one of
ten digits would have the supervisor build a plan of billions of slots before anything ran."""
MAX_LOCAL_PROCESSES = 512
"""Ranks a local run may start on one machine: each is a process importing torch; 100,000
"nodes" once started a run that would have forked until the machine gave out."""


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
    placement: str = "local"
    """Where ranks run: ``local`` (simulated nodes on this machine) or ``srun`` (srun steps of
    the Slurm job this process runs in)."""
    step_args: tuple[str, ...] = ()
    """With ``srun``: options for every rank's srun step (``--gpus-per-task=1``)."""
    partition: str | None = None
    """With ``srun``: the steps' partition (srun's ``-p``)."""
    options: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        read_fields(self, str)
        if not isinstance(self.options, RunOptions):
            raise ConfigError(f"options: {self.options!r} is not a RunOptions")
        if self.placement == "slurm":  # the old spelling (--launcher slurm)
            object.__setattr__(self, "placement", "srun")
        if self.placement not in PLACEMENTS:
            raise ConfigError(f"placement {self.placement!r}: one of {', '.join(PLACEMENTS)}")
        for name in ("nodes", "procs_per_node", "spares"):
            if getattr(self, name) > MAX_COUNT:
                raise ConfigError(f"{flag(name)} {getattr(self, name)}: more than {MAX_COUNT} (a typo?)")
        processes = (self.nodes + self.spares) * self.procs_per_node
        if self.placement == "local" and processes > MAX_LOCAL_PROCESSES:
            raise ConfigError(
                f"--nodes {self.nodes} x --procs-per-node {self.procs_per_node} (spares included): a "
                f"local run starts every rank on this machine; at most {MAX_LOCAL_PROCESSES} "
                "(run under Slurm with --launcher srun for more)"
            )
        repair = self.options.repair_after
        if repair is not None and (self.placement == "srun" or repair < 0):
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
            if "launcher" in data:  # a request written before the field was named for what it picks
                data["placement"] = data.pop("launcher")
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


def _path_text(value: object) -> str:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{value!r} cannot be written as JSON")
