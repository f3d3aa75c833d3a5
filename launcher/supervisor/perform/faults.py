"""Performing a fault's actions: kills, the fault's record, drains and node releases.

Each function performs one action (:mod:`launcher.supervisor.policy.actions`) with the run's
:class:`~launcher.supervisor.perform.hands.Hands`; what to do was decided by the policy.
"""

from __future__ import annotations

import dataclasses

from launcher.errors import SresError
from launcher.supervisor.policy import actions as act
from launcher.supervisor.perform.hands import Hands
from launcher.supervisor.policy.classify import error_at
from launcher.supervisor.observe.view import FaultState
from resilience.contract import injections
from resilience.contract.messages import Report


def kill_slot(h: Hands, a: act.KillSlot) -> None:
    state = h.books.slots[a.slot]
    state.killed_as, state.killed_t = a.as_, h.clocks.wall()
    h.books.killed.add(a.slot)
    h.processes.kill(a.slot)


def break_link(h: Hands, a: act.BreakLink) -> None:
    """An injected network fault: done to the node's link by the placement, then left to be found.
    A job-wide one (``isolate-supervisor``) is done to every node that has a process of the run."""
    (injection,) = injections.parse([a.spec])
    if h.links is None:  # refused before the start (supervise): a bug if it comes here
        raise SresError(f"--inject {a.spec}: this placement has no links to break")
    if injection.node is not None:
        nodes = [injection.node]
    else:
        nodes = sorted({s.info.node for s in h.books.slots.values() if s.alive} - h.books.dead_nodes)
    for node in nodes:
        what = h.links.break_link(dataclasses.replace(injection, node=node))
        host = h.names.host(node)
        h.events.emit("network-fault", node=node, host=host, kind=injection.kind, spec=a.spec, what=what)
        h.say(f"injected {a.spec}: {host}: {what}")


def kill_node(h: Hands, a: act.KillNode) -> None:
    b = h.books
    b.dead_nodes.add(a.node)
    if a.node in b.spare_nodes:
        b.spare_nodes.remove(a.node)
    for slot, state in b.slots.items():
        if state.info.node == a.node and state.alive:
            # Marked first: the Observer counts the node's ranks lost from now on (one fault),
            # however long their exits take to land.
            state.killed_as, state.killed_t = "node", h.clocks.wall()
            b.killed.add(slot)
            h.processes.kill(slot)


def note_straggler(h: Hands, a: act.NoteStraggler) -> None:
    host = h.names.host(a.node)
    straggler = h.config.straggler
    action = "replace" if a.replaced else ("none" if straggler.action == "none" else "kept: no spare")
    h.events.emit(
        "straggler",
        rank=a.rank,
        node=a.node,
        host=host,
        score=a.score,
        step=a.step,
        steps=straggler.steps,
        action=action,
    )
    h.say(
        f"straggler: rank {a.rank} on {host} computes {a.score:.2f}x the median for "
        f"{straggler.steps} steps (step {a.step}); {action}"
    )


def drop_spare(h: Hands, a: act.DropSpare) -> None:
    if a.node in h.books.spare_nodes:
        h.books.spare_nodes.remove(a.node)
        h.events.emit("spare-lost", node=a.node, slot=a.slot)


def hold(h: Hands, a: act.HoldForCulprit) -> None:
    h.books.collateral_since = a.since


def open_fault(h: Hands, a: act.OpenFault) -> None:
    """Record the fault: one event per lost rank (and the culprit's), the counters, its start."""
    b = h.books
    b.collateral_since = None
    progress = h.progress()
    plan = b.current_plan
    generation = plan.generation
    for rank, how in sorted(a.lost.items()):
        node = b.slots[plan.members[rank]].info.node
        why = a.bad_nodes.get(node)
        h.events.emit(
            "fault",
            kind=how,
            rank=rank,
            node=node,
            host=h.names.host(node),
            step=progress + 1,
            generation=generation,
            t=a.t,
            **({"why": why} if why else {}),
        )
        h.say(
            f"fault: {how} of rank {rank} (node {h.names.host(node)}"
            f"{': ' + why if why else ''}) at step {progress + 1}"
        )
    if a.culprit is not None:
        _record_culprit(h, a, a.culprit, progress, generation)
    b.process_faults = dict(a.process_faults)
    if b.resize is not None:
        b.resize = dataclasses.replace(b.resize, pausing_since=None)  # pause again in the next generation
    b.faults += 1
    b.restarts += 1 if a.counted else 0
    node_fault = bool(a.bad_nodes) or any(how == "node" for how in a.lost.values())
    h.recovery.fault("node" if node_fault else "process", a.t, progress, generation)
    b.fault = FaultState(dict(a.lost), dict(a.bad_nodes))


def _record_culprit(h: Hands, a: act.OpenFault, c: Report, progress: int, generation: int) -> None:
    b = h.books
    node = b.slots[b.current_plan.members[c.rank]].info.node
    h.events.emit(
        "fault",
        kind="exception",
        rank=c.rank,
        node=node,
        host=h.names.host(node),
        step=progress + 1,
        generation=generation,
        message=c.message,
        t=a.t,
        **({"recurred": True} if a.recurred else {}),
    )
    h.say(f"fault: exception in rank {c.rank}: {c.message}")
    b.first_culprit = b.first_culprit or c
    if (where := error_at(c)) is not None:
        b.errors_seen.add(where)


def drain(h: Hands, a: act.Drain) -> None:
    b = h.books
    if b.fault is not None:
        b.fault = dataclasses.replace(b.fault, drained=b.fault.drained | {a.node})
    host = h.names.host(a.node)
    t0 = h.clocks.clock()
    try:
        h.exits.retire(a.node, a.why)
    except SresError as err:
        h.events.emit("drain-failed", node=a.node, host=host, why=a.why, error=str(err))
        h.say(f"warning: could not drain {host}: {err}")
        return
    h.events.emit("drained", node=a.node, host=host, why=a.why, seconds=h.clocks.clock() - t0)
    h.events.emit("node-released", node=a.node, host=host, why="fault", detail=a.why)
    h.say(f"drained {host}: sres: {a.why}")


def release(h: Hands, a: act.Release) -> None:
    b = h.books
    if b.fault is not None:
        b.fault = dataclasses.replace(b.fault, drained=b.fault.drained | {a.node})
    h.give_back(a.node, a.why)


def wait_for_node(h: Hands, a: act.WaitForNode) -> None:
    b = h.books
    fault = b.current_fault
    if fault.waiting_since is None:
        timeout = h.config.elastic.resize_timeout_s
        h.events.emit(
            "waiting",
            why="no spare node, and the world may not shrink further",
            timeout_s=timeout,
            world_size=len(b.current_plan.members) - len(fault.lost),
            t=h.clocks.wall() - (h.clocks.clock() - a.since),
        )  # when the timeout started
        h.say(f"waiting up to {timeout:g} s for a node (sres grow adds one)")
    b.fault = dataclasses.replace(fault, waiting_since=a.since)
