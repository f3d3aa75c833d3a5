"""Performing the elastic actions: control requests answered, and the steps of a resize
(begin, start nodes, pause, abandon, publish the new size).

Each function performs one action (:mod:`launcher.supervisor.policy.actions`) with the run's
:class:`~launcher.supervisor.perform.hands.Hands`; what to do was decided by the policy
(:mod:`launcher.supervisor.policy.resize`).
"""

from __future__ import annotations

import dataclasses

from launcher.supervisor.policy import actions as act
from launcher.supervisor.perform.hands import Hands, take_node
from launcher.supervisor.policy.resize import node_slots
from launcher.supervisor.observe.view import ResizeState


def answer(h: Hands, a: act.Answer) -> None:
    h.events.emit("request", request=a.request, ok=a.ok, message=a.message)
    h.say(f"request {a.request}: {a.message}")
    h.answer(a.request, a.ok, a.message)


def report_status(h: Hands, a: act.ReportStatus) -> None:
    h.answer(a.request, True, "running", status=status(h))


def status(h: Hands) -> dict[str, object]:
    """What ``sres status`` shows of a running job."""
    b, c, host = h.books, h.config, h.names.host
    plan = b.current_plan
    nodes = sorted({b.slots[s].info.node for s in plan.members.values()})
    return {
        "world_size": plan.world_size,
        "nodes": [host(n) for n in nodes],
        "spares": [host(n) for n in b.spare_nodes],
        "generation": plan.generation,
        "step": h.progress(),
        "faults": b.faults,
        "last_resize": b.last_resize,
        "resizing_to": b.resize.nodes if b.resize is not None else None,
        "min_nodes": c.elastic.min_nodes,
        "max_nodes": c.elastic.max_nodes,
        "job_id": h.names.job_id,
        "jobs": h.jobs(nodes),
        "protection": _protection(h),
    }


def _protection(h: Hands) -> dict[str, object] | None:
    """The tiers' cadence the ranks last agreed (the ``protection`` event); None before any."""
    said = next((e for e in reversed(h.events.events) if e.get("event") == "protection"), None)
    return (
        None
        if said is None
        else {k: said[k] for k in ("step", "every", "steps_at_risk", "overhead", "budget")}
    )


def begin_resize(h: Hands, a: act.BeginResize) -> None:
    under_way = h.books.resize  # Slurm taking back more lent nodes: the same pause serves
    pausing = under_way.pausing_since if under_way is not None and under_way.why == a.why else None
    h.books.resize = ResizeState(
        a.nodes, a.why, h.clocks.clock(), a.request, release=a.release, pausing_since=pausing
    )
    if a.why == "request":
        h.books.asked_nodes = a.nodes
    else:
        h.say(f"resizing to {a.nodes} node(s) at the next step boundary ({a.why})")


def add_nodes(h: Hands, a: act.AddNodes) -> None:
    """Each node from the first source the policy named that has one; the first node that
    none has ends the adding."""
    b = h.books
    added = []
    for number in a.nodes:
        new = take_node(h.supply, a.sources, number)
        if new is None:
            break
        h.start_node(new)
        added.append(new.node)
    if b.fault is not None:
        b.spare_nodes += added  # a node loss waits for them: they take the lost ranks
    elif b.resize is not None:
        b.resize = dataclasses.replace(b.resize, added=True, joining=b.resize.joining + tuple(added))


def pause(h: Hands, a: act.Pause) -> None:
    b = h.books
    h.store.plans.request_pause(b.current_plan.generation, b.current_resize.why)
    b.resize = dataclasses.replace(b.current_resize, pausing_since=h.clocks.clock())


def abandon_resize(h: Hands, a: act.AbandonResize) -> None:
    b = h.books
    abandoned = b.current_resize
    for node in abandoned.joining:
        for slot in node_slots(node, h.config.procs_per_node):
            h.processes.kill(slot)
    h.events.emit("resize-abandoned", to_nodes=abandoned.nodes, why=a.why)
    h.say(f"resize to {abandoned.nodes} node(s) abandoned: {a.why}")
    b.resize = None


def resize(h: Hands, a: act.Resize) -> None:
    """Publish the world of the new size: leaving nodes' processes end and the nodes go back
    (or stay as spares); the resize's start is the pause, or now for a shrink after a loss."""
    b = h.books
    pausing = b.resize.pausing_since if b.resize is not None and a.why != "fault" else None
    t0 = pausing if pausing is not None else h.clocks.clock()  # the pause, or now: the decision to shrink
    for slot, state in b.slots.items():  # respawned ranks and standbys too, not only the first slots
        if state.info.node in a.release and state.alive:
            h.processes.kill(slot)
    for node in a.release:
        h.give_back(node, "preempted" if a.why == "preempted" else "request")
    b.spare_nodes += list(a.to_spares)
    if a.why != "fault":
        b.resize = None  # done; a resize asked for during a fault goes on from the new world
    b.fault = None
    started_t = h.clocks.wall() - (h.clocks.clock() - t0)
    h.publish(dict(a.members), (), f"resize-{a.why}")
    b.last_resize = {
        "from_world": a.from_world,
        "to_world": len(a.members),
        "why": a.why,
        "generation": b.current_plan.generation,
        "t": started_t,
    }
    jobs = h.jobs({b.slots[s].info.node for s in a.members.values()})
    h.recovery.resized(
        a.from_world, len(a.members), a.why, started_t, b.current_plan.generation, jobs or None
    )
    _say_resized(h, a)


def _say_resized(h: Hands, a: act.Resize) -> None:
    host = h.names.host
    text = f"resizing: world {a.from_world} -> {len(a.members)} ({a.why})"
    if a.release:
        text += f", released {', '.join(host(n) for n in a.release)}"
    if a.to_spares:
        text += f", {', '.join(host(n) for n in a.to_spares)} kept as spare"
    h.say(text)
