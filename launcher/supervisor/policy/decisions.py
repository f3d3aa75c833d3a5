"""The supervisor's decisions, as pure functions: observation + state -> a :class:`Decision`.

:func:`decide` is the one entry point; it takes ``now``, what was just seen and a frozen
view of the run (:mod:`launcher.supervisor.observe.view`), and returns the actions for the
executor with the reason they were chosen (torchft's quorum returns its why the same way): the
loop learns from it whether to ask again, a test whether the right rule answered.
While a fault is being handled it is called again after each action that changes the facts (a
node added, a source found empty), so each call only looks at the state, never at the world.

The rules are split by what they decide: a fault's classification
(:mod:`~launcher.supervisor.policy.classify`), where lost ranks go
(:mod:`~launcher.supervisor.policy.replace`, its order is data: ``REPLACEMENT_ORDER``),
resizes (:mod:`~launcher.supervisor.policy.resize`, ``GROWTH_ORDER``) and requeues
(:mod:`~launcher.supervisor.policy.requeue`); this module puts them in order. What they may
import is the folder's rule (:mod:`launcher.supervisor.policy`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from launcher.supervisor.policy.actions import (
    Action,
    BreakLink,
    Drain,
    DropSpare,
    Fail,
    Finish,
    HoldForCulprit,
    KillNode,
    KillSlot,
    Launch,
    NoteStraggler,
    RefillSpare,
    StartStandby,
    WaitForNode,
)
from launcher.supervisor.config import RunConfig
from launcher.supervisor.policy.classify import (
    INJECTED_NODE_LOSS,
    SPARE_PROCESS_DIED,
    UNREACHABLE,
    await_culprit,
    cut_off_from_every_node,
    isolated,
    open_fault,
)
from launcher.supervisor.policy.replace import replace_lost
from launcher.supervisor.policy.requeue import requeue_or_fail, signal_cause
from launcher.supervisor.policy.resize import advance, node_slots, on_capacity, on_requests
from launcher.supervisor.observe.view import Observation, RunState, Straggler
from resilience.contract import slots


Why = Literal[
    "start",
    "replacing",
    "preempted",
    "unrecoverable",
    "refused",
    "culprit awaited",
    "isolated",
    "new fault",
    "done",
    "running",
]
"""Which rule of :func:`decide` answered: the run's start, an open fault's replacement, a
requeue signal, a failure the ranks reported, a wait for a fault's culprit, the supervisor cut
off from every node, a fault opened, the run's end, or a run going on (which may decide nothing)."""


@dataclass(frozen=True)
class Decision:
    """One call's actions, in the order they are performed, and which rule chose them."""

    actions: tuple[Action, ...]
    why: Why

    @property
    def waits(self) -> bool:
        """An open fault waits for a node (``--min-nodes``): asking again this tick changes nothing."""
        return any(isinstance(a, WaitForNode) for a in self.actions)


def decide(now: float, obs: Observation, state: RunState, config: RunConfig) -> Decision:
    """The actions for this tick. Pure. Control requests are answered whatever else happens."""
    if not state.started:
        return _decision("start", [launch(config)])
    answers = on_requests(obs.requests, state, config)
    if state.fault is not None:
        return _decision("replacing", answers, replace_lost(now, state, config))
    if (obs.lost or obs.spares_exited) and cut_off_from_every_node(obs, state):
        return _decision("isolated", [isolated(obs, state, config)], answers)  # blame no node, drain none
    kills = _kills(obs, state, config)
    ending = _fault_or_end(now, obs, state, config)
    if ending is not None:
        why, actions = ending
        return _decision(why, kills, actions, answers)
    return _decision("running", kills, _running(now, obs, state, config, busy=bool(kills)), answers)


def _decision(why: Why, *parts: Sequence[Action]) -> Decision:
    return Decision(tuple(a for part in parts for a in part), why)


def _kills(obs: Observation, state: RunState, config: RunConfig) -> list[Action]:
    """What this look asks to kill at once: dead spares, hung ranks, injected faults."""
    actions: list[Action] = []
    for node, slot in obs.spares_exited:  # a node that cannot keep a process alive is not a spare
        why = SPARE_PROCESS_DIED if obs.evidence_of(node).reachable else UNREACHABLE  # it fenced itself
        actions += [DropSpare(node, slot), Drain(node, why)]
    if obs.child_kill and state.spare_nodes:
        actions.append(KillSlot(node_slots(state.spare_nodes[0], config.procs_per_node)[0], "injected"))
    actions += [KillSlot(slot, "hang") for slot in obs.hung]
    actions += [BreakLink(spec) for spec in obs.link_faults]
    for node in obs.node_kills:  # an injected node loss: the node goes, as a real lost node does
        actions += [KillNode(node), Drain(node, INJECTED_NODE_LOSS)]
    return actions


def _fault_or_end(
    now: float, obs: Observation, state: RunState, config: RunConfig
) -> tuple[Why, list[Action]] | None:
    """A requeue signal, a failure, a fault (or a wait for its culprit), or the run's end; None
    while the run goes on."""
    if obs.preempted:
        if signal_cause(obs.time_left_s, obs.time_limit_s) == "time-limit":
            why = f"time limit in {obs.time_left_s:.0f} s"
            return "preempted", [requeue_or_fail(why, config, save=True, cause="time-limit")]
        return "preempted", [requeue_or_fail(obs.preempted, config, save=True, cause="preemption")]
    if obs.unrecoverable is not None:
        return "unrecoverable", [
            Fail(f"the state could not be recovered from peers: {obs.unrecoverable.message}")
        ]
    if obs.refused is not None:
        return "refused", [Fail(f"rank {obs.refused.rank}: {obs.refused.message}")]
    if await_culprit(obs.lost, obs.errors, state.collateral_since, now):
        since = state.collateral_since if state.collateral_since is not None else now
        return "culprit awaited", [HoldForCulprit(since)]
    if obs.lost or obs.errors:
        return "new fault", open_fault(obs, state, config)
    if obs.all_done(state.members):
        digests = tuple((rank, obs.reports[slot].digest) for rank, slot in sorted(state.members.items()))
        return "done", [Finish(digests)]
    return None


def _running(now: float, obs: Observation, state: RunState, config: RunConfig, busy: bool) -> list[Action]:
    """A run going on: stragglers, Slurm's priorities, a resize's next step; when nothing else
    is to be done (``busy``: kills this tick), spares refilled and standbys started."""
    actions = on_stragglers(obs.stragglers, state, config)
    capacity = on_capacity(now, obs, state, config)
    if capacity:
        actions += capacity
    elif state.resize is not None:
        actions += advance(now, obs, state, config)
    elif len(state.spare_nodes) < config.spares and now >= state.next_refill and not (busy or actions):
        actions.append(RefillSpare())
    if not (busy or actions) and state.settled and state.resize is None:
        actions += standbys_missing(state, config)
    return actions


def launch(config: RunConfig) -> Launch:
    """The run's start: every node's and spare's processes, node by node, then plan 1 over the
    first ``nodes`` nodes (rank = node * procs_per_node + local rank)."""
    ppn = config.procs_per_node
    spawn = tuple(
        (slots.rank_slot(node, local), node, local)
        for node in range(config.nodes + config.spares)
        for local in range(ppn)
    )
    members = {
        node * ppn + local: slots.rank_slot(node, local)
        for node in range(config.nodes)
        for local in range(ppn)
    }
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
