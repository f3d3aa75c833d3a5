"""Where the ranks of an open fault go: the replacement sources, tried in order. Pure.

The order is data (:data:`REPLACEMENT_ORDER`), not control flow: :func:`replace_lost` returns
the actions of the first source that may serve; a source that needs the world (an idle node, a
node from the scheduler) is an action whose performer marks it tried when it comes up empty,
and the policy is asked again. :func:`replace` gives every lost rank a process. The order: a
warm spare, an idle node of the job, a node from the scheduler, a shrink, a wait for a node,
requeue, fail; a process fault on a healthy node goes to that node's warm standby first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from launcher.errors import ConfigError
from launcher.supervisor.policy.actions import (
    AcquireNode,
    Action,
    Drain,
    Fail,
    Publish,
    Release,
    UseIdleNode,
    WaitForNode,
)
from launcher.supervisor.config import RunConfig
from launcher.supervisor.policy.classify import RECLAIMED
from launcher.supervisor.policy.requeue import requeue_or_fail
from launcher.supervisor.policy.resize import shrink_after_loss
from launcher.supervisor.observe.view import RunState
from resilience.contract.messages import SlotInfo
from resilience.contract import slots

REPLACEMENT_ORDER: tuple[str, ...] = ("spare", "idle-node", "new-node", "shrink", "wait", "requeue", "fail")
"""Where the ranks of a lost node go, cheapest first: a warm spare of the run, a healthy node
the job holds and no rank uses, a node the scheduler adds, nowhere (the world shrinks, when
``--on-no-spare shrink`` allows), a node that may come (``wait``, up to ``--resize-timeout``),
a requeue of the job, failure."""


def replace_lost(now: float, state: RunState, config: RunConfig) -> list[Action]:
    """The next step of an open fault: the first replacement source in order that may serve."""
    return serving_source(now, state, config)[1]


def serving_source(now: float, state: RunState, config: RunConfig) -> tuple[str, list[Action]]:
    """The first source in :data:`REPLACEMENT_ORDER` not tried yet that may serve, and its actions."""
    fault = state.current_fault
    homeless = sorted({state.node_of(r) for r in fault.lost} & (state.dead_nodes | set(fault.bad_nodes)))
    for source in REPLACEMENT_ORDER:
        if source in fault.tried:
            continue
        actions = _SOURCES[source](now, state, config, homeless)
        if actions is not None:
            return source, actions
    raise AssertionError("the replacement order ends with a source that always serves")


def _use_spares(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action] | None:
    """A warm spare needs nothing from Slurm: publish first, drain after."""
    if len(homeless) > len(state.spare_nodes):
        return None
    fault = state.current_fault
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
        spare_slot=slots.rank_slot,
        respawn_slot=lambda node, local: slots.respawn_slot(node, local, next(respawned)),
        standby=warm_first,
    )
    return [
        Publish(
            decision.members,
            how_replaced(state, decision),
            "fault",
            decision.spawn,
            decision.used_spare_nodes,
            decision.promoted,
        ),
        *_drains(state),
    ]


def how_replaced(state: RunState, decision: Replacement) -> dict[int, str]:
    """Each lost rank -> how it was replaced: a lost node's ranks by how their new node came
    (``spare`` for a spare of the start), others as a ``standby`` took over or a ``respawn``."""
    promoted = {slot for slot, _ in decision.promoted}
    how = {}
    for rank in sorted(state.current_fault.lost):
        slot = decision.members[rank]
        if state.node_of(rank) in state.dead_nodes:
            how[rank] = state.origin.get(state.slots[slot].node, "spare")
        else:
            how[rank] = "standby" if slot in promoted else "respawn"
    return how


def _use_idle_node(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action]:
    # A cold node or an expansion needs the bad node out of the job first (shrink, then grow).
    return [*_drains(state), UseIdleNode()]


def _acquire_node(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action]:
    return [*_drains(state), AcquireNode()]


def _shrink(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action] | None:
    if not homeless or any(state.node_of(r) not in homeless for r in state.current_fault.lost):
        return None  # a process fault restarts in place; the world shrinks only without a node to run on
    resize = shrink_after_loss(state.members, state.slots, homeless, config)
    return None if resize is None else [resize, *_drains(state)]


def _wait(now: float, state: RunState, config: RunConfig, homeless: list[int]) -> list[Action] | None:
    if config.elastic.on_no_spare not in ("shrink", "wait"):
        return None
    waiting_since = state.current_fault.waiting_since
    since = waiting_since if waiting_since is not None else now
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
    fault = state.current_fault
    return [
        Release(node, "preempted") if why == RECLAIMED else Drain(node, why)
        for node, why in sorted(fault.bad_nodes.items())
        if node not in fault.drained
    ]


def _no_node(state: RunState, homeless: list[int], config: RunConfig) -> str:
    text = (
        f"node {', '.join(state.hosts.get(n, str(n)) for n in homeless)} was lost and no spare node is left"
    )
    if state.current_fault.waiting_since is not None:
        left = len(state.nodes) - len(homeless)
        text += (
            f"; the world may not shrink to {left} node(s) (--min-nodes {config.elastic.min_nodes}) and no "
            f"node came within --resize-timeout {config.elastic.resize_timeout_s:g} s"
        )
    return text


# --- the pure piece the spare source is made of -------------------------------------------------


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
