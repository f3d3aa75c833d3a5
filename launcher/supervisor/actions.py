"""What the supervisor can do: one small frozen dataclass per action.

The policy (:mod:`launcher.supervisor.policy`) returns a list of these; the executor
(:mod:`launcher.supervisor.executor`) performs them. A new capability (shrink, grow, a node
from a satellite job) is a new action here, a rule in the policy and a handler in the
executor, never a new path through the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from resilience.contract.membership import Report


@dataclass(frozen=True)
class KillSlot:
    """Kill one rank process; the next observation sees it lost ``as_`` (e.g. "hang")."""

    slot: str
    as_: str


@dataclass(frozen=True)
class KillNode:
    """The node is dead to this run: its remaining processes go, as one node fault.

    ``why`` is what was seen (the drain reason), None for an injected node kill.
    """

    node: int
    why: str | None = None


@dataclass(frozen=True)
class DropSpare:
    """A spare node whose waiting process died can no longer take a whole node's ranks."""

    node: int
    slot: str


@dataclass(frozen=True)
class HoldForCulprit:
    """Only collateral errors so far: wait (briefly) for the process death behind them."""

    since: float


@dataclass(frozen=True)
class OpenFault:
    """Record a fault (events, counters) and start replacing what it lost.

    ``t``: when it was seen; ``lost``: member rank -> how it was lost ("kill", "exit N", "hang", "node");
    ``bad_nodes``: node -> why it must leave the job; ``culprit``: the first own error when
    no process was lost; ``process_faults``: the per-node fault counts after this fault.
    """

    t: float
    lost: Mapping[int, str]
    bad_nodes: Mapping[int, str] = field(default_factory=dict)
    culprit: Report | None = None
    process_faults: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Drain:
    """Drain a bad node (reason ``sres: why``) and drop it from the job."""

    node: int
    why: str


@dataclass(frozen=True)
class UseIdleNode:
    """Take a healthy node the job already holds and no rank uses, as a cold spare."""


@dataclass(frozen=True)
class AcquireNode:
    """Get one more node from the scheduler (job expansion), as a cold spare."""


@dataclass(frozen=True)
class Publish:
    """Publish the next generation: ``members`` (rank -> slot), after starting ``spawn``
    (slot, node, local rank) and taking ``used_spares`` out of the spare pool."""

    members: Mapping[int, str]
    replaced: tuple[int, ...]
    reason: str
    spawn: tuple[tuple[str, int, int], ...] = ()
    used_spares: tuple[int, ...] = ()


@dataclass(frozen=True)
class Requeue:
    """Requeue the Slurm job; ``save``: every rank is alive, persist the newest commit first."""

    why: str
    save: bool = False


@dataclass(frozen=True)
class Finish:
    """Every rank reported done."""


@dataclass(frozen=True)
class Fail:
    reason: str


Action = (KillSlot | KillNode | DropSpare | HoldForCulprit | OpenFault | Drain | UseIdleNode | AcquireNode
          | Publish | Requeue | Finish | Fail)
