"""The supervisor's decisions, as pure functions: observation + state -> actions.

:func:`decide` is the one entry point; it takes ``now``, what was just seen and a frozen
view of the run, and returns the actions for the executor. While a fault is being handled it
is called again after each action that changes the facts (a node added, a source found
empty), so each call only looks at the state, never at the world. The order in which lost
nodes are replaced is data (:data:`REPLACEMENT_ORDER`), not control flow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from launcher.errors import ConfigError
from launcher.placement import NodeEvidence
from launcher.observability.straggler import Straggler
from launcher.supervisor.actions import (
    AcquireNode,
    Action,
    Drain,
    DropSpare,
    Fail,
    Finish,
    HoldForCulprit,
    KillNode,
    KillSlot,
    Launch,
    NoteStraggler,
    OpenFault,
    Publish,
    RefillSpare,
    Release,
    StartStandby,
    UseIdleNode,
    WaitForNode,
)
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe import Observation
from launcher.supervisor.requeue_policy import requeue_or_fail, signal_cause
from launcher.supervisor.resize import (
    ResizeState,
    advance,
    node_slots,
    on_capacity,
    on_requests,
    shrink_after_loss,
)
from resilience.contract.messages import Report, SlotInfo

INJECTED_NODE_LOSS = "node lost (injected fault)"
SPARE_PROCESS_DIED = "a warm spare process of this node died"
RECLAIMED = "Slurm took the lent node back (preempted)"
COLLATERAL_GRACE_S = 1.0
"""How long reports of collateral errors alone wait for the process death that caused them."""


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
    def nodes(self) -> list[int]:
        """The nodes that hold ranks now."""
        return sorted({self.slots[s].node for s in self.members.values()})


def decide(now: float, obs: Observation, state: RunState, config: RunConfig) -> list[Action]:
    """The actions for this tick. Pure. Control requests are answered whatever else happens."""
    if not state.started:
        return [launch(config)]
    waiting = state.fault is not None and state.fault.waiting_since is not None
    answers = on_requests(obs.requests, state.nodes, state.resize, state.fault is not None, waiting, config)
    if state.fault is not None:
        return answers + replace_lost(now, state, config)
    return _decide(now, obs, state, config) + answers


def _decide(now: float, obs: Observation, state: RunState, config: RunConfig) -> list[Action]:
    actions: list[Action] = []
    for node, slot in obs.spares_exited:  # a node that cannot keep a process alive is not a spare
        actions += [DropSpare(node, slot), Drain(node, SPARE_PROCESS_DIED)]
    if obs.child_kill and state.spare_nodes:
        actions.append(KillSlot(node_slots(state.spare_nodes[0], config.procs_per_node)[0], "injected"))
    actions += [KillSlot(slot, "hang") for slot in obs.hung]
    for node in obs.node_kills:  # an injected node loss: the node goes, as a real lost node does
        actions += [KillNode(node), Drain(node, INJECTED_NODE_LOSS)]
    if obs.preempted:
        if signal_cause(obs.time_left_s, obs.time_limit_s) == "time-limit":
            return actions + [
                requeue_or_fail(
                    f"time limit in {obs.time_left_s:.0f} s", config, save=True, cause="time-limit"
                )
            ]
        return actions + [requeue_or_fail(obs.preempted, config, save=True, cause="preemption")]
    if obs.unrecoverable is not None:
        return actions + [Fail(f"the state could not be recovered from peers: {obs.unrecoverable.message}")]
    if obs.refused is not None:
        return actions + [Fail(f"rank {obs.refused.rank}: {obs.refused.message}")]
    if await_culprit(obs.lost, obs.errors, state.collateral_since, now):
        return actions + [
            HoldForCulprit(state.collateral_since if state.collateral_since is not None else now)
        ]
    if obs.lost or obs.errors:
        return actions + open_fault(obs, state, config)
    if obs.all_done(state.members):
        return actions + [
            Finish(tuple((rank, obs.reports[slot].digest) for rank, slot in sorted(state.members.items())))
        ]
    actions += on_stragglers(obs.stragglers, state, config)
    capacity = on_capacity(
        now,
        obs.reclaimed,
        obs.lendable,
        state.nodes,
        state.resize,
        state.changed_at,
        config,
        state.asked_nodes,
    )
    if capacity:
        actions += capacity
    elif state.resize is not None:
        actions += advance(
            now,
            state.resize,
            state.members,
            state.slots,
            state.warm,
            obs.all_paused(state.members),
            config,
            state.lent,
        )
    elif len(state.spare_nodes) < config.spares and now >= state.next_refill and not actions:
        actions.append(RefillSpare())
    if not actions and state.settled and state.resize is None:
        actions += standbys_missing(state, config)
    return actions


def launch(config: RunConfig) -> Launch:
    """The run's start: every node's and spare's processes, node by node, then plan 1 over the
    first ``nodes`` nodes (rank = node * procs_per_node + local rank)."""
    ppn = config.procs_per_node
    spawn = tuple(
        (f"n{node}p{local}", node, local)
        for node in range(config.nodes + config.spares)
        for local in range(ppn)
    )
    members = {node * ppn + local: f"n{node}p{local}" for node in range(config.nodes) for local in range(ppn)}
    return Launch(spawn, members)


def standbys_missing(state: RunState, config: RunConfig) -> list[Action]:
    """Start what ``--standby`` asks for and a node lacks: at the start, after a standby took
    over a rank, on a node that joined. Only once the generation runs, so a new standby's
    start-up never competes with a recovery for the node's CPUs."""
    return [
        StartStandby(node)
        for node in state.nodes
        if node not in state.dead_nodes
        for _ in range(config.standby - len(state.standby.get(node, ())))
    ]


def on_stragglers(stragglers: Iterable[Straggler], state: RunState, config: RunConfig) -> list[Action]:
    """Report each straggler; with ``--straggler-action replace`` and a spare node, its node is
    treated as faulty: killed (one node fault: the spare takes its ranks) and drained."""
    actions: list[Action] = []
    spares = list(state.spare_nodes)
    for s in stragglers:
        node = state.node_of(s.rank)
        replace = config.straggler.action == "replace" and bool(spares) and node not in state.dead_nodes
        actions.append(NoteStraggler(s.rank, node, s.score, s.step, replaced=replace))
        if replace:
            spares.pop()
            why = f"straggler: {s.score:.2f}"
            actions += [KillNode(node, why), Drain(node, why)]
    return actions


def open_fault(obs: Observation, state: RunState, config: RunConfig) -> list[Action]:
    """Classify a fault: which nodes must go (killed, later drained), who is the culprit."""
    counts = dict(state.process_faults)
    bad: dict[int, str] = {}
    # Every rank lost at once has a common cause (the program, the job): it is no node's fault.
    common = len(state.members) > 1 and set(obs.lost) >= set(state.members)
    for node in sorted(
        {state.node_of(r) for r in obs.lost} - state.dead_nodes
    ):  # injected kills: already dead
        if not common:
            counts[node] = counts.get(node, 0) + 1
        why = node_verdict(
            obs.evidence.get(node, NodeEvidence()),
            counts.get(node, 0) if not common else 0,
            config.node_fault_after,
        )
        if why is not None:
            bad[node] = why
    lost = {rank: "node" if state.node_of(rank) in bad else how for rank, how in obs.lost.items()}
    culprit = None if lost else min(obs.errors.values(), key=lambda r: (r.collateral, r.seq))
    where = error_at(culprit)
    recurred = where is not None and where in state.errors_seen
    actions: list[Action] = [OpenFault(obs.seen_t, lost, bad, culprit, counts, recurred)]
    actions += [KillNode(node, why) for node, why in sorted(bad.items())]
    if recurred:
        said = (
            culprit.message.splitlines()[0] if culprit.message else culprit.error_type
        )  # the traceback has the rest
        actions.append(
            Fail(
                f"rank {culprit.rank} raised {said} at step {where.step} again after recovering from "
                f"it: the error is deterministic; not retrying",
                culprit,
            )
        )
    elif state.restarts + 1 > config.max_restarts:
        actions.append(Fail(f"gave up after {config.max_restarts} restart(s)"))
    return actions


def error_at(report: Report | None) -> ErrorAt | None:
    """Where a rank's own exception was raised; None for a peer's fault seen by a survivor
    (collateral) and for an exception raised outside ``ctx.steps()`` (no step). Pure."""
    if report is None or report.collateral or report.origin != "own" or report.step is None:
        return None
    return ErrorAt(report.error_type, report.message, report.step)


REPLACEMENT_ORDER: tuple[str, ...] = ("spare", "idle-node", "new-node", "shrink", "wait", "requeue", "fail")
"""Where the ranks of a lost node go, cheapest first: a warm spare of the run, a healthy node
the job holds and no rank uses, a node the scheduler adds, nowhere (the world shrinks, when
``--on-no-spare shrink`` allows), a node that may come (``wait``, up to ``--resize-timeout``),
a requeue of the job, failure."""


def replace_lost(now: float, state: RunState, config: RunConfig) -> list[Action]:
    """The next step of an open fault: the first replacement source in order that may serve."""
    fault = state.fault
    assert fault is not None
    homeless = sorted({state.node_of(r) for r in fault.lost} & (state.dead_nodes | set(fault.bad_nodes)))
    for source in REPLACEMENT_ORDER:
        if source in fault.tried:
            continue
        actions = _SOURCES[source](now, state, config, homeless)
        if actions is not None:
            return actions
    raise AssertionError("the replacement order ends with a source that always serves")


def _use_spares(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action] | None:
    """A warm spare needs nothing from Slurm: publish first, drain after."""
    if len(homeless) > len(state.spare_nodes):
        return None
    fault = state.fault
    respawned = iter(range(state.respawns + 1, state.respawns + 1 + len(fault.lost)))
    warm_first = {
        node: sorted(slots, key=lambda s: s not in state.warm) for node, slots in state.standby.items()
    }
    decision = replace(
        state.members,
        state.slots,
        {r: state.node_of(r) in homeless for r in fault.lost},
        set(homeless),
        state.spare_nodes,
        spare_slot=lambda node, local: f"n{node}p{local}",
        respawn_slot=lambda node, local: f"n{node}p{local}r{next(respawned)}",
        standby=warm_first,
    )
    return [
        Publish(
            decision.members,
            tuple(sorted(fault.lost)),
            "fault",
            decision.spawn,
            decision.used_spare_nodes,
            decision.promoted,
        ),
        *_drains(state),
    ]


def _use_idle_node(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action]:
    # A cold node or an expansion needs the bad node out of the job first (shrink, then grow).
    return [*_drains(state), UseIdleNode()]


def _acquire_node(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action]:
    return [*_drains(state), AcquireNode()]


def _shrink(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action] | None:
    if not homeless or any(state.node_of(r) not in homeless for r in state.fault.lost):
        return None  # a process fault restarts in place; the world shrinks only without a node to run on
    resize = shrink_after_loss(state.members, state.slots, homeless, config)
    return None if resize is None else [resize, *_drains(state)]


def _wait(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action] | None:
    if config.elastic.on_no_spare not in ("shrink", "wait"):
        return None
    since = state.fault.waiting_since if state.fault.waiting_since is not None else now
    if now - since >= config.elastic.resize_timeout_s:
        return None
    return [*_drains(state), WaitForNode(since)]


def _requeue(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action] | None:
    if not state.requeueable or config.elastic.on_no_spare == "fail":
        return None
    return [
        *_drains(state),
        requeue_or_fail(f"{_no_node(state, homeless, config)}, nor an idle node to grow into", config),
    ]


def _fail(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action]:
    hint = " (start with --spares)" if config.elastic.on_no_spare is None else ""
    return [*_drains(state), Fail(f"{_no_node(state, homeless, config)}{hint}")]


_SOURCES: dict[str, Callable[[float, RunState, RunConfig, list[int]], list[Action] | None]] = {
    "spare": _use_spares,
    "idle-node": _use_idle_node,
    "new-node": _acquire_node,
    "shrink": _shrink,
    "wait": _wait,
    "requeue": _requeue,
    "fail": _fail,
}


def _drains(state: RunState) -> list[Action]:
    """Bad nodes leave the job drained; a lent node that Slurm takes back is only given back."""
    fault = state.fault
    return [
        Release(node, "preempted") if why == RECLAIMED else Drain(node, why)
        for node, why in sorted(fault.bad_nodes.items())
        if node not in fault.drained
    ]


def _no_node(state: RunState, homeless: list[int], config: RunConfig) -> str:
    text = (
        f"node {', '.join(state.hosts.get(n, str(n)) for n in homeless)} was lost and no spare node is left"
    )
    if state.fault.waiting_since is not None:
        left = len(state.nodes) - len(homeless)
        text += (
            f"; the world may not shrink to {left} node(s) (--min-nodes {config.elastic.min_nodes}) and no "
            f"node came within --resize-timeout {config.elastic.resize_timeout_s:g} s"
        )
    return text


# --- the pure pieces the rules are made of ---------------------------------------------------


@dataclass(frozen=True)
class Replacement:
    members: dict[int, str]
    spawn: tuple[tuple[str, int, int], ...] = ()  # (slot, node, local_rank) to start cold
    used_spare_nodes: tuple[int, ...] = ()
    promoted: tuple[tuple[str, int], ...] = ()  # (standby slot, local rank it takes over)


def replace(
    members: Mapping[int, str],
    slots: Mapping[str, SlotInfo],
    lost: Mapping[int, bool],
    dead_nodes: set[int],
    spare_nodes: Sequence[int],
    spare_slot: Callable[[int, int], str],
    respawn_slot: Callable[[int, int], str],
    standby: Mapping[int, Sequence[str]] | None = None,
) -> Replacement:
    """Give every lost rank a process. Pure.

    ``lost`` maps a lost rank to whether its node died. A rank whose node is alive (a process
    fault) goes to a standby process of its node (``standby``: node -> its standby slots, warm
    ones first; one still warming up is further along than a cold start) or else restarts
    cold on its node; ranks of a dead node move, keeping their ranks and local ranks, to one
    warm spare node. Raises ConfigError when a dead node has no spare left.
    """
    new = dict(members)
    spawn: list[tuple[str, int, int]] = []
    promoted: list[tuple[str, int]] = []
    waiting = {node: list(slots) for node, slots in (standby or {}).items()}
    spares = list(spare_nodes)
    used: list[int] = []
    moved: dict[int, int] = {}
    for rank in sorted(lost):
        info = slots[members[rank]]
        if info.node in dead_nodes:
            if info.node not in moved:
                if not spares:
                    raise ConfigError(
                        f"node {info.node} was lost and no spare node is left (start with --spares)"
                    )
                moved[info.node] = spares.pop(0)
                used.append(moved[info.node])
            new[rank] = spare_slot(moved[info.node], info.local_rank)
        elif waiting.get(info.node):
            new[rank] = waiting[info.node].pop(0)
            promoted.append((new[rank], info.local_rank))
        else:
            slot = respawn_slot(info.node, info.local_rank)
            new[rank] = slot
            spawn.append((slot, info.node, info.local_rank))
    return Replacement(new, tuple(spawn), tuple(used), tuple(promoted))


def node_verdict(evidence: NodeEvidence, process_faults: int, limit: int) -> str | None:
    """Why a node that just lost a rank must leave the job, or None for a process fault. Pure.

    The returned text becomes the drain reason (after ``sres:``), so it says what was seen.
    """
    if evidence.reclaimed:
        return RECLAIMED
    if not evidence.slurmd_answers:
        return "slurmd not responding"
    if not evidence.slurm_usable:
        detail = f" ({evidence.slurm_reason})" if evidence.slurm_reason else ""
        return f"slurm reports {evidence.slurm_state or 'node unusable'}{detail}"
    if process_faults >= limit:
        return f"repeated failure: {process_faults} process faults on this node"
    return None


def await_culprit(
    lost: Mapping[int, str],
    errors: Mapping[str, Report],
    collateral_since: float | None,
    now: float,
    grace_s: float = COLLATERAL_GRACE_S,
) -> bool:
    """Whether to hold a fault that so far is only collateral errors (collectives that lost a
    peer): a rank's SIGKILL reaches its peers' sockets as fast as it reaches us, and a survivor's
    report can come first. Handled as an exception at once, it would cost a generation with no
    one replaced, then a second fault for the real loss. Waits at most ``grace_s``. Pure."""
    if lost or not errors or not all(r.collateral for r in errors.values()):
        return False
    return collateral_since is None or now - collateral_since < grace_s
