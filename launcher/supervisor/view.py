"""The frozen view the policy decides on, built from the books and one observation. Pure.

The policy is only as pure as its input: this view reads no store, emits no event and
changes no book, so the same books and observation give the same view however often it is
built in a tick. What must be read from the world (readiness, a generation's first step)
arrives as :class:`~launcher.supervisor.observe.Observation` fields.
"""

from __future__ import annotations

from collections.abc import Mapping

from launcher.supervisor.books import Books
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe import Observation
from launcher.supervisor.policy import RunState


def run_state(
    books: Books, obs: Observation, config: RunConfig, hosts: Mapping[int, str], requeueable: bool
) -> RunState:
    """The policy's view of the run. ``hosts``: node -> its host name (for messages)."""
    b = books
    return RunState(
        members=dict(b.plan.members) if b.plan is not None else {},
        slots={s: st.info for s, st in b.slots.items()},
        hosts=dict(hosts),
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
