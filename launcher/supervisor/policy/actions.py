"""What the supervisor can do: one small frozen dataclass per action.

The policy (:mod:`launcher.supervisor.policy.decisions`) returns a list of these; the executor
(:mod:`launcher.supervisor.perform.executor`) performs them. A new capability (shrink, grow, a node
from a satellite job) is a new action here, a rule in the policy and a handler in the
executor, never a new path through the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from resilience.contract.messages import Report


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
class BreakLink:
    """An injected network fault: the placement breaks a node's link as ``spec`` says; its
    processes live on, and what follows is found as a real one would be."""

    spec: str


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
    no process was lost; ``process_faults``: the per-node fault counts after this fault;
    ``recurred``: the culprit raised the same error at the same step in an earlier fault;
    ``counted``: it takes one of ``--max-restarts`` (not when every lost rank ended itself stuck in a
    generation an earlier fault ended: that is the earlier fault's, seen late).
    """

    t: float
    lost: Mapping[int, str]
    bad_nodes: Mapping[int, str] = field(default_factory=dict)
    culprit: Report | None = None
    process_faults: Mapping[int, int] = field(default_factory=dict)
    recurred: bool = False
    counted: bool = True


@dataclass(frozen=True)
class Drain:
    """Drain a bad node (reason ``sres: why``) and drop it from the job."""

    node: int
    why: str


@dataclass(frozen=True)
class UseIdleNode:
    """Take a healthy node the job already holds and no rank uses, as a cold spare."""


@dataclass(frozen=True)
class RefillSpare:
    """Fewer warm spares than asked for and no fault open: take a node that is healthy again
    (resumed after repair) or unused in the job as a warm spare, so the next fault finds one."""


@dataclass(frozen=True)
class StartStandby:
    """Start one warm standby process on ``node`` (it warms up and waits to take over a rank)."""

    node: int


@dataclass(frozen=True)
class AcquireNode:
    """Get one more node from the scheduler (job expansion), as a cold spare."""


@dataclass(frozen=True)
class Launch:
    """Start the run: every process in ``spawn`` (slot, node, local rank: the nodes' and the
    spares'), then plan 1, ``members`` (rank -> slot)."""

    spawn: tuple[tuple[str, int, int], ...]
    members: Mapping[int, str]


@dataclass(frozen=True)
class Publish:
    """Publish the next generation: ``members`` (rank -> slot), after starting ``spawn``
    (slot, node, local rank), taking ``used_spares`` out of the spare pool and giving each
    ``promoted`` standby (slot, local rank) the local rank of the rank it takes over.

    ``replaced``: each rank that moved -> how (``respawn``, ``standby``, or for a lost node's
    ranks how their new node came: ``spare``, ``idle``, ``satellite``, ``expansion``, ``local``)."""

    members: Mapping[int, str]
    replaced: Mapping[int, str]
    reason: str
    spawn: tuple[tuple[str, int, int], ...] = ()
    used_spares: tuple[int, ...] = ()
    promoted: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class WaitForNode:
    """No node can take the lost ranks and the world may not shrink: hold the fault open
    (a grow request or a returning node may serve) until ``since + resize_timeout_s``."""

    since: float


@dataclass(frozen=True)
class Answer:
    """Reply to a control request (``sres resize/grow/shrink/status``)."""

    request: int
    ok: bool
    message: str


@dataclass(frozen=True)
class ReportStatus:
    """Reply to ``sres status`` with the run's world, nodes, generation, step and last resize."""

    request: int


@dataclass(frozen=True)
class BeginResize:
    """Start moving the world to ``nodes`` nodes at the next step boundary."""

    nodes: int
    why: str  # "request" | "idle" (growing into lent nodes) | "preempted" (Slurm takes lent nodes back)
    request: int | None = None
    release: tuple[int, ...] = ()
    """The nodes that leave (a shrink); empty: the policy's choice, lent nodes first."""


@dataclass(frozen=True)
class AddNodes:
    """Start more nodes' rank processes for a growing world (they warm up, then join): one
    per number in ``nodes``, each from the first of ``sources`` that has one (a source name
    of the policy's ``GROWTH_ORDER``); the first node none has ends the adding.

    ``nodes``: the numbers the new nodes take where the placement numbers its nodes freely (a
    simulated node); a node of Slurm keeps the number its placement gives it."""

    nodes: tuple[int, ...]
    sources: tuple[str, ...]


@dataclass(frozen=True)
class Pause:
    """Ask every rank to leave the generation at the next step boundary (all at the same step)."""


@dataclass(frozen=True)
class AbandonResize:
    why: str


@dataclass(frozen=True)
class Resize:
    """Publish a generation of another size: ``members`` (rank -> slot), renumbered in order.

    ``release``: nodes that leave the run (their processes end); ``to_spares``: healthy nodes
    that leave the world but stay as warm spares (a shrink to an allowed size after a loss).
    """

    members: Mapping[int, str]
    why: str  # "fault" | "request" | "idle" | "preempted"
    from_world: int
    release: tuple[int, ...] = ()
    to_spares: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()


@dataclass(frozen=True)
class Release:
    """A lent node that lost ranks because Slurm takes it back: give it back, do not drain it."""

    node: int
    why: str


@dataclass(frozen=True)
class NoteStraggler:
    """A rank stayed slower than the others: say so (event, metrics); ``replaced``: its node goes."""

    rank: int
    node: int
    score: float
    step: int
    replaced: bool = False


@dataclass(frozen=True)
class Requeue:
    """Requeue the Slurm job; ``save``: every rank is alive, persist the newest commit first."""

    why: str
    save: bool = False
    cause: str = "fault"
    """``fault`` (no node left), ``preemption`` or ``time-limit``: the requeue event says which."""
    wait_s: float = 0.0
    """How long to keep asking when Slurm does not answer the requeue (0: ask once)."""


@dataclass(frozen=True)
class Finish:
    """Every rank reported done."""

    digests: tuple[tuple[int, str], ...] = ()
    """(rank, digest of its final state), from the ranks' reports."""


@dataclass(frozen=True)
class Fail:
    reason: str
    culprit: Report | None = None
    """The error whose traceback is shown; None: the run's first culprit, if any."""
    errors: tuple[Report, ...] = ()
    """Every rank's own error in the fault that ended the run, lowest rank first: each rank's
    is its own outcome (submitit shows the lowest task's), whoever raised first in time."""


Action = (
    KillSlot
    | KillNode
    | BreakLink
    | DropSpare
    | HoldForCulprit
    | OpenFault
    | Drain
    | UseIdleNode
    | RefillSpare
    | StartStandby
    | AcquireNode
    | Launch
    | Publish
    | WaitForNode
    | Answer
    | ReportStatus
    | BeginResize
    | AddNodes
    | Pause
    | AbandonResize
    | Resize
    | Release
    | NoteStraggler
    | Requeue
    | Finish
    | Fail
)
