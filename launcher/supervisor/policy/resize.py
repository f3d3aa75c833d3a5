"""The elastic rules of the policy: shrinking after a node loss, and resizes on request. Pure.

Slurm's own priorities move the world too (:func:`on_capacity`): idle nodes lent to the run
(satellites) are grown into after ``grow_snooze_s``, and a lent node that Slurm takes back
(preemption) leaves at the next step boundary, inside the partition's grace time.

A resize that is not forced by a fault happens at a step boundary: new nodes' processes
start and warm up first (:class:`AddNodes`), then every rank is asked to leave the generation
before the same step (:class:`Pause`), then the plan of the new size is published
(:class:`Resize`). A shrink after a node loss needs no pause: the generation is already broken.
Ranks are renumbered in their old order, new nodes' ranks come last, so ranks stay grouped by
node (buddies are found by node). A shrink asked for releases lent nodes first, node 0 last.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from launcher.supervisor.policy.actions import (
    AbandonResize,
    Action,
    AddNodes,
    Answer,
    BeginResize,
    Pause,
    ReportStatus,
    Resize,
)
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe.view import Observation, Request, ResizeState, RunState
from resilience.contract.messages import SlotInfo
from resilience.contract import slots

GROWTH_ORDER: tuple[str, ...] = ("simulated", "idle-node", "new-node")
"""Where the nodes of a growing world come from, for each node the first source that has one:
a simulated node (a placement that numbers its nodes freely: a local run grows on request), a
healthy node the job holds and no rank uses, a node the scheduler adds (a satellite or job
expansion, as ``--grow-by`` says). A lost node's ranks go by
:data:`~launcher.supervisor.policy.replace.REPLACEMENT_ORDER` instead, which has no simulated
node: a local run without a spare shrinks, waits, requeues or fails as a full cluster would."""


def renumber(members: Mapping[int, str], keep: set[str], new_slots: Sequence[str] = ()) -> dict[int, str]:
    """Ranks for the kept slots in their old rank order, then the new slots. Pure."""
    kept = [members[r] for r in sorted(members) if members[r] in keep]
    return dict(enumerate([*kept, *new_slots]))


def node_slots(node: int, procs_per_node: int) -> list[str]:
    return [slots.rank_slot(node, local) for local in range(procs_per_node)]


def add_nodes(slots: Mapping[str, SlotInfo], count: int) -> AddNodes:
    """Start ``count`` more nodes, numbered after every node the run ever used (a number is
    never given twice), each from the first source in :data:`GROWTH_ORDER` that has one."""
    top = max((info.node for info in slots.values()), default=-1)
    return AddNodes(tuple(range(top + 1, top + 1 + count)), GROWTH_ORDER)


def on_requests(requests: Sequence[Request], state: RunState, config: RunConfig) -> list[Action]:
    """Answer control requests: status, or a resize the policy allows (one at a time).

    While a node loss waits for a node (``--on-no-spare wait``), ``grow`` starts nodes that
    the lost ranks then move to.
    """
    out: list[Action] = []
    resize, fault = state.resize, state.fault
    for req in requests:
        if req.op == "status":
            out.append(ReportStatus(req.id))
            continue
        current = len(state.nodes)
        target = req.target(current)
        why = config.elastic.why_not(target, config.nodes)
        if fault is not None and fault.waiting_since is not None and req.op == "grow":
            out.append(Answer(req.id, True, f"starting {req.by} node(s) for the lost ranks"))
            out.append(add_nodes(state.slots, target - current))  # req.by
        elif resize is not None:
            out.append(
                Answer(req.id, False, f"a resize to {resize.nodes} node(s) is under way; try again after it")
            )
        elif fault is not None:
            out.append(Answer(req.id, False, "the run is recovering from a fault; try again after it"))
        elif target == current:
            out.append(Answer(req.id, True, f"the run already has {current} node(s)"))
        elif why is not None:
            out.append(Answer(req.id, False, f"refused: {why}"))
        else:
            out.append(
                Answer(req.id, True, f"resizing from {current} to {target} node(s) at the next step boundary")
            )
            out.append(BeginResize(target, "request", req.id))
            resize = ResizeState(target, "request", 0.0)  # one resize per tick
    return out


def advance(now: float, obs: Observation, state: RunState, config: RunConfig) -> list[Action]:
    """The next step of the resize under way (``state.resize``)."""
    resize, members, slots = state.current_resize, state.members, state.slots
    nodes = state.nodes
    grow = resize.nodes - len(nodes)
    new_slots: list[str] = []
    if grow == 0:  # a fault meanwhile shrank the world to this size
        return [AbandonResize(f"the world already has {len(nodes)} node(s)")]
    if grow > 0:
        if not resize.added:
            return [add_nodes(slots, grow)]
        if len(resize.joining) < grow and (resize.why != "idle" or not resize.joining):
            return [AbandonResize(f"only {len(resize.joining)} of {grow} node(s) could be started")]
        grow = len(resize.joining)  # growing into idle nodes: as many as Slurm lent
        new_slots = [s for node in resize.joining for s in node_slots(node, config.procs_per_node)]
        if not all(s in state.warm for s in new_slots):
            if now - resize.since > config.startup_timeout_s:
                return [AbandonResize(f"the new node(s) did not start within {config.startup_timeout_s:g} s")]
            return []
    if resize.pausing_since is None:
        return [Pause()]
    if not obs.all_paused(members) and now - resize.pausing_since < config.elastic.drain_grace_s:
        return []
    release = (resize.release or tuple(released_first(nodes, state.lent)[:-grow])) if grow < 0 else ()
    keep = {s for s in members.values() if slots[s].node not in release}
    return [
        Resize(
            renumber(members, keep, new_slots),
            resize.why,
            len(members),
            release=release,
            joined=resize.joining,
        )
    ]


def released_first(nodes: Sequence[int], lent: frozenset[int]) -> list[int]:
    """The order in which a shrink lets nodes go: lent ones (satellites) first, newest first;
    node 0, where the supervisor and its store run under Slurm, last. Pure."""
    return sorted(nodes, key=lambda n: (n == 0, n not in lent, -n))


def on_capacity(now: float, obs: Observation, state: RunState, config: RunConfig) -> list[Action]:
    """Follow Slurm's priorities. Pure.

    A lent node being taken back (its ranks got the preemption signal) leaves at the next step
    boundary, before its grace time ends; a growth under way gives way to it. Below
    ``min_nodes`` the node is not let go early: when Slurm ends it, the loss is a fault like
    any other. Idle nodes (``obs.lendable``) are grown into once the world has been unchanged
    for ``grow_snooze_s``, up to ``max_nodes``, or to the size a user asked for last.
    """
    elastic, resize = config.elastic, state.resize
    going = tuple(n for n in obs.reclaimed if n in state.nodes)
    if going:
        if resize is not None and resize.why == "idle":
            return [AbandonResize("Slurm is taking lent nodes back")]
        target = len(state.nodes) - len(going)
        if resize is not None and (resize.why != "preempted" or set(going) <= set(resize.release)):
            # A shrink on request finishes first; one taking lent nodes back takes the later ones too.
            return []
        if not elastic.allowed(target, config.nodes):
            return []
        return [BeginResize(target, "preempted", release=going)]
    if resize is not None or not obs.lendable or now - state.changed_at < elastic.grow_snooze_s:
        return []  # the common case, at every tick: the nodes (O(N) to list) are not needed
    nodes = state.nodes
    asked, highest = state.asked_nodes, elastic.bounds[1]
    ceiling = highest if asked is None else min(asked, highest)
    grown = elastic.largest_allowed(min(ceiling, len(nodes) + obs.lendable), config.nodes)
    return [BeginResize(grown, "idle")] if grown is not None and grown > len(nodes) else []


def shrink_after_loss(
    members: Mapping[int, str], slots: Mapping[str, SlotInfo], homeless: Sequence[int], config: RunConfig
) -> Resize | None:
    """Re-form without the lost nodes at the largest allowed size; healthy nodes beyond that
    size become spares. None where the user chose otherwise (``--on-no-spare``) or no size is
    allowed.

    With no choice made, a run above its ``--min-nodes`` (grown onto lent nodes) shrinks too: a
    lent node Slurm ended before the run let it go (a preemption whose signal came while the
    supervisor was busy) requeued the whole job, which still held every node of its own."""
    elastic = config.elastic
    if elastic.on_no_spare not in ("shrink", None):
        return None
    nodes = sorted({slots[s].node for s in members.values()} - set(homeless))
    target = elastic.largest_allowed(len(nodes), config.nodes)
    if target is None or not nodes:
        return None
    to_spares = tuple(nodes[target:])
    keep = {s for s in members.values() if slots[s].node in nodes[:target]}
    return Resize(renumber(members, keep), "fault", len(members), to_spares=to_spares)
