"""Performing the actions that start processes and publish plans: the run's start, spares,
standbys, nodes from Slurm, and the next generation after a fault.

Each function performs one action (:mod:`launcher.supervisor.policy.actions`) with the run's
:class:`~launcher.supervisor.perform.hands.Hands`; what to do was decided by the policy.
"""

from __future__ import annotations

import dataclasses

from launcher.placement import NewNode
from launcher.supervisor.policy import actions as act
from launcher.supervisor.perform.hands import Hands
from resilience.contract import slots

REFILL_PERIOD_S = 3.0
"""How often a job short of spares asks its placement for a node that came back."""


def launch(h: Hands, a: act.Launch) -> None:
    for slot, node, local in a.spawn:
        h.spawn(slot, node, local)
    h.publish(dict(a.members), replaced=(), reason="start")


def use_idle_node(h: Hands, a: act.UseIdleNode) -> None:
    _add_node(h, h.supply.idle_node(), "idle-node")


def acquire_node(h: Hands, a: act.AcquireNode) -> None:
    _add_node(h, h.supply.grow(), "new-node")


def _add_node(h: Hands, new: NewNode | None, source: str) -> None:
    """A node for the open fault, as a cold spare; none: that source is tried and came up empty."""
    b = h.books
    if new is None:
        b.fault = dataclasses.replace(b.current_fault, tried=b.current_fault.tried | {source})
        return
    h.start_node(new)
    b.spare_nodes.append(new.node)


def refill_spare(h: Hands, a: act.RefillSpare) -> None:
    h.books.next_refill = h.clocks.clock() + REFILL_PERIOD_S
    new = h.supply.idle_node()
    if new is not None:
        h.start_node(new)
        h.books.spare_nodes.append(new.node)


def start_standby(h: Hands, a: act.StartStandby) -> None:
    b = h.books
    b.standbys_started += 1
    slot = slots.standby_slot(a.node, b.standbys_started)
    h.spawn(slot, a.node, 0)  # its local rank is the one it takes over (Publish.promoted)
    b.standby.add(slot)


def publish(h: Hands, a: act.Publish) -> None:
    """The next generation after a fault: spares taken, cold processes started, standbys
    promoted; one ``replaced`` event per rank that moved (how: the policy's), then the plan."""
    b = h.books
    for node in a.used_spares:
        b.spare_nodes.remove(node)
    for slot, node, local in a.spawn:
        b.respawns += 1
        h.spawn(slot, node, local)
    for slot, local in a.promoted:
        b.standby.discard(slot)
        b.move(slot, local)
    for rank, how in sorted(a.replaced.items()):
        node = b.slots[a.members[rank]].info.node
        how = "forked" if how == "respawn" and b.slots[a.members[rank]].forked else how
        h.events.emit(
            "replaced", rank=rank, slot=a.members[rank], node=node, host=h.names.host(node), how=how
        )
    h.publish(dict(a.members), tuple(sorted(a.replaced)), a.reason)
    b.fault = None
