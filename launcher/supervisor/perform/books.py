"""The run's mutable books, the frozen view the policy gets of them, and what performing an
action ends with.

Only the executor and its performers change the books; the policy sees them frozen, through
:func:`run_state`, and the Observer only reads the slots. The view is only as pure as its
builder: :func:`run_state` reads no store, emits no event and changes no book, so the same
books and observation give the same view however often it is built in a tick. What must be
read from the world (readiness, a generation's first step) arrives as
:class:`~launcher.supervisor.observe.view.Observation` fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from launcher.observability.timeline import Event
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe.observer import SlotState
from launcher.supervisor.observe.view import ErrorAt, FaultState, Observation, ResizeState, RunState
from resilience.contract.messages import Plan, Report, SlotInfo


@dataclass
class Outcome:
    ok: bool
    reason: str = ""
    events: list[Event] = field(default_factory=list)
    requeued: bool = False


@dataclass
class Books:
    """The run's mutable facts, changed only by the executor."""

    slots: dict[str, SlotState] = field(default_factory=dict)
    plan: Plan | None = None
    spare_nodes: list[int] = field(default_factory=list)
    dead_nodes: set[int] = field(default_factory=set)
    process_faults: dict[int, int] = field(default_factory=dict)
    origin: dict[int, str] = field(default_factory=dict)  # node -> how it joined after the start
    faults: int = 0
    restarts: int = 0
    respawns: int = 0
    collateral_since: float | None = None
    fault: FaultState | None = None
    first_culprit: Report | None = None
    resize: ResizeState | None = None
    last_resize: dict[str, object] | None = None
    next_refill: float = 0.0
    killed: set[str] = field(default_factory=set)
    """Slots the supervisor killed (their ``killed_as`` is set): what the Observer looks at for lost
    ranks instead of every slot at every tick."""
    standby: set[str] = field(default_factory=set)
    """Slots of live standby processes that have not taken over a rank (a dead one is dropped
    when an observation says it ended)."""
    standbys_started: int = 0
    announced: set[str] = field(default_factory=set)
    finished: bool = False
    changed_at: float = 0.0
    asked_nodes: int | None = None
    errors_seen: set[ErrorAt] = field(default_factory=set)
    """Every fault's own exception, where it was raised (a recurrence fails the run)."""
    _infos: tuple[int, dict[str, SlotInfo]] = field(default=(-1, {}), repr=False, compare=False)
    _placed: int = field(default=0, repr=False, compare=False)
    """Bumped by :meth:`place` and :meth:`move`, the only changes of where slots run: the
    policy's view of them is rebuilt only then (4,096 slots took milliseconds a tick, 50 ticks
    a second, to copy)."""

    @classmethod
    def for_run(cls, config: RunConfig) -> "Books":
        """The books before anything starts: the spare nodes are the ones after the run's nodes."""
        return cls(spare_nodes=list(range(config.nodes, config.nodes + config.spares)))

    def place(self, slot: str, state: SlotState) -> None:
        """A process started for ``slot``."""
        self.slots[slot] = state
        self._placed += 1

    def move(self, slot: str, local: int) -> None:
        """A standby took a rank: its slot's local rank on its node changes."""
        self.slots[slot].info = SlotInfo(self.slots[slot].info.node, local)
        self._placed += 1

    def infos(self) -> Mapping[str, SlotInfo]:
        """slot -> where it runs, for the policy: one mapping until a slot is placed or moved."""
        if self._infos[0] != self._placed:
            self._infos = (self._placed, {s: st.info for s, st in self.slots.items()})
        return self._infos[1]

    @property
    def placed(self) -> int:
        """How many times slots were placed or moved (a change of :meth:`infos`)."""
        return self._placed

    @property
    def current_plan(self) -> Plan:
        """``plan``, once the run started: the policy's first action (``Launch``) publishes plan 1."""
        assert self.plan is not None, "no plan before the run's start"
        return self.plan

    @property
    def current_fault(self) -> FaultState:
        """``fault``, where only an open fault leads here (its performers)."""
        assert self.fault is not None, "no fault is open"
        return self.fault

    @property
    def current_resize(self) -> ResizeState:
        """``resize``, where only a resize under way leads here (its performers)."""
        assert self.resize is not None, "no resize is under way"
        return self.resize


def run_state(
    books: Books, obs: Observation, config: RunConfig, hosts: Mapping[int, str], requeueable: bool
) -> RunState:
    """The policy's view of the run. Pure. ``hosts``: node -> its host name (for messages)."""
    b = books
    return RunState(  # read-only views, not copies, of what is not changed in place: built every tick
        members=MappingProxyType(b.plan.members) if b.plan is not None else {},
        slots=b.infos(),
        hosts=MappingProxyType(hosts),
        spare_nodes=tuple(b.spare_nodes),
        dead_nodes=frozenset(b.dead_nodes),
        process_faults=dict(b.process_faults),
        restarts=b.restarts,
        respawns=b.respawns,
        requeueable=requeueable,
        collateral_since=b.collateral_since,
        fault=b.fault,
        resize=b.resize,
        warm=obs.warm,
        next_refill=b.next_refill,
        standby=standby_by_node(b),
        settled=settled(b, obs, config),
        origin=dict(b.origin),
        lent=frozenset(n for n, how in b.origin.items() if how == "satellite"),
        changed_at=b.changed_at,
        asked_nodes=b.asked_nodes,
        errors_seen=frozenset(b.errors_seen),
        started=b.plan is not None,
    )


def standby_by_node(books: Books) -> dict[int, tuple[str, ...]]:
    """node -> its live standby slots, in name order."""
    by_node: dict[int, tuple[str, ...]] = {}
    for slot in sorted(books.standby):
        state = books.slots[slot]
        if state.alive:
            by_node[state.info.node] = (*by_node.get(state.info.node, ()), slot)
    return by_node


def settled(books: Books, obs: Observation, config: RunConfig) -> bool:
    """The current generation made its first step (only ``--standby`` waits for that)."""
    plan = books.plan
    if plan is None or not config.standby:
        return False
    return obs.generation == plan.generation and obs.first_step_t is not None
