"""The frozen view the policy decides on: one tick's :class:`Observation` and the run's
:class:`RunState`. Values only: nothing here reads the world or changes the run.

Everything the policy reads arrives through this module (the policy modules import only it,
the actions, the configs, the contract's messages and the errors: ``tests/unit/test_layout.py``).
It also names the value types an observation is made of, defined where they are produced: a
placement's :class:`NodeEvidence`, a :class:`Straggler` of the detector. A control
:class:`Request` is defined here, not in the control server that receives it: the view stays
free of sockets and threads. The view is built from the executor's books by
:func:`launcher.supervisor.perform.books.run_state` (pure); the Observer builds the observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from launcher.observability.straggler import Straggler
from launcher.placement import NodeEvidence
from resilience.contract.messages import Report, SlotInfo, StepRecord

__all__ = [
    "ErrorAt",
    "FaultState",
    "NodeEvidence",
    "Observation",
    "RankStep",
    "Request",
    "ResizeState",
    "RunState",
    "Straggler",
]


@dataclass(frozen=True)
class Request:
    """A control request (``sres resize/grow/shrink/status``) as the control server checked it."""

    id: int
    op: str
    nodes: int | None = None
    by: int | None = None

    def target(self, current: int) -> int:
        """The node count this request asks for, given the current one."""
        if self.op == "resize":
            assert self.nodes is not None, "a resize names its count (checked when received)"
            return self.nodes
        assert self.by is not None, "a grow or shrink names its count (checked when received)"
        return current + (self.by if self.op == "grow" else -self.by)


class RankStep(NamedTuple):
    """One step of one rank, as read this tick: a line of ``step_times.jsonl`` (a tuple: thousands
    a second in a large run)."""

    generation: int
    rank: int
    slot: str
    record: StepRecord


@dataclass(frozen=True)
class Observation:
    """One tick's facts. ``lost``: member rank -> how it was lost; ``reports``: this
    generation's reports by slot; ``evidence``: what can be seen of nodes that lost a rank."""

    seen_t: float = 0.0
    """Wall-clock time of this look: a fault's time, from which its recovery is measured."""
    lost: Mapping[int, str] = field(default_factory=dict)
    reports: Mapping[str, Report] = field(default_factory=dict)
    hung: tuple[str, ...] = ()
    node_kills: tuple[int, ...] = ()
    link_faults: tuple[str, ...] = ()
    """Link faults a fault injection asked for (their specs: ``cut:1:for=0:step=8``)."""
    child_kill: bool = False
    """A fault injection asked the supervisor to kill one of its warm spares' processes."""
    spares_exited: tuple[tuple[int, str], ...] = ()
    preempted: str | None = None
    time_left_s: float | None = None
    """When ``preempted``: the job's time left and limit, as Slurm saw them then (None: no limit)."""
    time_limit_s: float | None = None
    evidence: Mapping[int, NodeEvidence] = field(default_factory=dict)
    stragglers: tuple[Straggler, ...] = ()
    """Ranks whose compute time per step stayed above the others' (reported once per streak)."""
    steps: tuple[RankStep, ...] = ()
    """The ranks' steps first read in this look (the loop appends them to ``step_times.jsonl``)."""
    requests: tuple[Request, ...] = ()
    """Control requests (``sres resize/grow/shrink/status``) that arrived since the last tick."""
    reclaimed: tuple[int, ...] = ()
    """Lent nodes whose ranks got Slurm's signal that the node is being taken back."""
    lendable: int | None = None
    """Idle nodes the run could grow into, when looked at this tick (every ``LEND_PERIOD_S``)."""
    exited: tuple[str, ...] = ()
    """Slots whose process was seen to end in this look (members, spares and standbys alike)."""
    warm: frozenset[str] = frozenset()
    """Live slots that warmed up and wait for a plan (imports and first-use costs paid)."""
    warm_at: Mapping[str, float] = field(default_factory=dict)
    """The wall time each of ``warm`` said it was ready (its own clock: the look comes later)."""
    generation: int = 0
    """The generation this look was taken for."""
    first_step_t: float | None = None
    """When ``generation`` made its first step; read only with ``--standby`` (which waits for it)."""

    @property
    def errors(self) -> dict[str, Report]:
        return {s: r for s, r in self.reports.items() if r.kind == "error"}

    @property
    def unrecoverable(self) -> Report | None:
        return next((r for r in self.reports.values() if r.kind == "unrecoverable"), None)

    @property
    def refused(self) -> Report | None:
        """A rank's ``train`` asked for what sres refuses (``RegistrationError``): the same on every entry."""
        return next((r for r in self.reports.values() if r.kind == "refused"), None)

    def evidence_of(self, node: int) -> NodeEvidence:
        """What was seen of ``node``; nothing seen: a healthy node."""
        return self.evidence.get(node, NodeEvidence())

    def all_done(self, members: Mapping[int, str]) -> bool:
        return len(self.reports) == len(members) and all(r.kind == "done" for r in self.reports.values())

    def all_paused(self, members: Mapping[int, str]) -> bool:
        """Every rank left the generation at the agreed step boundary (a resize)."""
        return len(self.reports) == len(members) and all(r.kind == "paused" for r in self.reports.values())


@dataclass(frozen=True)
class FaultState:
    """A fault being handled: what it lost and which replacement sources came up empty."""

    lost: Mapping[int, str]
    bad_nodes: Mapping[int, str]
    drained: frozenset[int] = frozenset()
    tried: frozenset[str] = frozenset()
    waiting_since: float | None = None


@dataclass(frozen=True)
class ErrorAt:
    """A rank's own exception and the step it raised in: what a deterministic error repeats."""

    error_type: str
    message: str
    step: int


@dataclass(frozen=True)
class ResizeState:
    """A resize under way (not forced by a fault)."""

    nodes: int
    """The node count it moves to."""
    why: str
    since: float
    request: int | None = None
    added: bool = False
    joining: tuple[int, ...] = ()
    """Nodes started for it (growth), taking ranks when the plan of the new size is published."""
    pausing_since: float | None = None
    release: tuple[int, ...] = ()
    """The nodes a shrink lets go; empty: lent nodes first, then the newest, never node 0."""


@dataclass(frozen=True)
class RunState:
    """What the policy may know of the run: a frozen view the supervisor builds per decision."""

    members: Mapping[int, str]
    slots: Mapping[str, SlotInfo]
    hosts: Mapping[int, str]
    spare_nodes: tuple[int, ...] = ()
    dead_nodes: frozenset[int] = frozenset()
    process_faults: Mapping[int, int] = field(default_factory=dict)
    restarts: int = 0
    respawns: int = 0
    requeueable: bool = False
    collateral_since: float | None = None
    fault: FaultState | None = None
    resize: ResizeState | None = None
    warm: frozenset[str] = frozenset()
    """Slots whose process has warmed up and waits for a plan (imports and first-use costs paid)."""
    next_refill: float = 0.0
    """When the job may next look for a node to refill its spares (asking Slurm costs a call)."""
    standby: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """node -> its live standby processes (``warm`` says which are ready to take over)."""
    settled: bool = True
    """The current generation made its first step: background work (new standbys) may start."""
    origin: Mapping[int, str] = field(default_factory=dict)
    """node -> how it joined after the start (``NewNode.how``: idle, satellite, expansion, local)."""
    lent: frozenset[int] = frozenset()
    """Nodes lent to the run by Slurm (satellites): the first to go in a shrink."""
    changed_at: float = 0.0
    """When the world last changed (a plan published): growth into idle nodes waits ``grow_snooze_s``."""
    asked_nodes: int | None = None
    """The size a user last asked for (``sres resize/grow/shrink``): growth into idle nodes stops there."""
    errors_seen: frozenset[ErrorAt] = frozenset()
    """The own exceptions of earlier faults, where they were raised: one seen again is deterministic."""
    started: bool = True
    """Plan 1 is published; False: nothing runs yet, and the policy's first action starts the run."""

    def node_of(self, rank: int) -> int:
        return self.slots[self.members[rank]].node

    @property
    def current_fault(self) -> FaultState:
        """``fault``, where only an open fault leads here (a replacement source, its drains)."""
        assert self.fault is not None, "no fault is open"
        return self.fault

    @property
    def current_resize(self) -> ResizeState:
        """``resize``, where only a resize under way leads here (its next step)."""
        assert self.resize is not None, "no resize is under way"
        return self.resize

    @cached_property
    def nodes(self) -> list[int]:
        """The nodes that hold ranks now (once per view: the policy asks at every tick)."""
        return sorted({self.slots[s].node for s in self.members.values()})
