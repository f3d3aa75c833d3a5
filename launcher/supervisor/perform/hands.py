"""What performing an action may touch, in one frozen place: :class:`Hands`.

The performers (the modules of ``perform/``) are plain functions ``(hands, action)``; they share the
few effects that several of them need (start a process, publish a plan, give a node back, say
a line) through these methods rather than through a common base class. The placement is there
by capability (processes, node names, nodes leaving, new nodes, the job): a performer uses
the one it needs, and a source of a node is performed as the policy named it
(:func:`take_node`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from launcher.observability.events import EventLog
from launcher.placement import (
    JobControl,
    NewNode,
    NodeExits,
    NodeLinks,
    NodeNames,
    NodeSupply,
    RankProcesses,
)
from launcher.supervisor.perform.books import Books
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe.observer import SlotState
from launcher.supervisor.observe.recovery_watch import RecoveryWatch
from launcher.supervisor.policy.resize import node_slots
from resilience.contract.messages import Plan, SlotInfo
from resilience.contract.run_store import RunStore


def _no_answer(request: int, ok: bool, message: str, **extra: object) -> None:
    """Requests are answered nowhere (a supervisor without a control server)."""


@dataclass(frozen=True)
class Clocks:
    """Time, injected: ``clock`` (monotonic) for durations, ``wall`` for event times, ``sleep``."""

    clock: Callable[[], float]
    wall: Callable[[], float]
    sleep: Callable[[float], None]


@dataclass(frozen=True)
class Hands:
    """The run's books and everything an action's effects go through.

    The placement's capabilities: ``processes`` (rank processes), ``names`` (hosts, Slurm
    jobs), ``exits`` (drain, give back), ``supply`` (new nodes), ``job`` (requeue). ``env``: a
    slot's process environment (slot, node, local rank); ``flush``: persist the newest commit
    now (its timeout) -> the step saved; ``answer``: reply to a control request.
    """

    config: RunConfig
    books: Books
    processes: RankProcesses
    names: NodeNames
    exits: NodeExits
    supply: NodeSupply
    job: JobControl
    store: RunStore
    events: EventLog
    recovery: RecoveryWatch
    env: Callable[[str, int, int], dict[str, str]]
    flush: Callable[[float], int | None]
    clocks: Clocks
    out: TextIO
    answer: Callable[..., None] = _no_answer
    ram_root: Callable[[], Path | None] = lambda: None
    """This run's RAM root as its ranks found it (None: the default), for the cleanup at its end."""
    links: NodeLinks | None = None
    """Nodes' network links, where the placement can break them (injected network faults)."""
    copy_events: Callable[[], None] = lambda: None
    """Copy what the ranks said through the store into the log now. Their tiers' threads say it
    without ringing, so it is otherwise copied at the next look: before a run's last event, it
    must be, or a ``tier-resumed`` said before ``done`` is written after ``finished``."""

    def spawn(self, slot: str, node: int, local: int) -> bool:
        """Start the slot's process; True when it is forked from its machine's fork server."""
        wall = self.clocks.wall()
        forked = bool(self.processes.spawn(slot, node, self.config.command, self.env(slot, node, local)))
        state = SlotState(
            SlotInfo(node, local), started=self.clocks.clock(), started_wall=wall, forked=forked
        )
        self.books.place(slot, state)
        return forked

    def start_node(self, new: NewNode) -> None:
        """Start a node's rank processes; they warm up and wait for a plan that includes them."""
        slots = node_slots(new.node, self.config.procs_per_node)
        forked = sum(self.spawn(slot, new.node, local) for local, slot in enumerate(slots))
        self.books.origin[new.node] = new.how
        job = self.names.job_of(new.node)
        self.events.emit(
            "node-added",
            node=new.node,
            host=new.host,
            how=new.how,
            seconds=new.seconds,
            forked=forked,
            **({"returned": True} if new.returned else {}),
            **({"job": job} if job else {}),
        )
        self.say(
            f"added node {new.host} to the run ({new.how}{f' job {job}' if job else ''}, {new.seconds:.2f} s)"
        )

    def publish(self, members: dict[int, str], replaced: tuple[int, ...], reason: str) -> None:
        """The next generation's plan, to the store; the ranks in it form that generation."""
        b = self.books
        generation = b.plan.generation + 1 if b.plan else 1
        plan = Plan(
            generation=generation,
            world_size=len(members),
            members=dict(members),
            slots={s: b.slots[s].info for s in members.values()},
            procs_per_node=self.config.procs_per_node,
            replaced=replaced,
            reason=reason,
        )
        self.store.plans.publish(plan, b.plan)
        b.plan, b.changed_at = plan, self.clocks.clock()
        self.processes.echo(members[0])
        self.events.emit(
            "generation", generation=generation, world_size=plan.world_size, replaced=list(replaced)
        )

    def give_back(self, node: int, why: str) -> None:
        """A node leaves the run, not drained: a satellite's job is cancelled (``why``:
        preempted or request)."""
        job = self.exits.release(node, why)
        host = self.names.host(node)
        self.events.emit("node-released", node=node, host=host, why=why, **({"job": job} if job else {}))
        self.say(f"released {host} ({why}{f', job {job} cancelled' if job else ''})")

    def progress(self) -> int:
        progress = self.store.progress.step()
        return -1 if progress is None else progress

    def jobs(self, nodes: Iterable[int]) -> dict[str, str]:
        """host -> the Slurm job its ranks run in (the job itself or a satellite); empty locally."""
        return {self.names.host(n): job for n in sorted(nodes) if (job := self.names.job_of(n))}

    def say(self, text: str) -> None:
        for line in text.splitlines():
            self.out.write(f"sres: {line}\n")
        self.out.flush()


NODE_SOURCES: dict[str, Callable[[NodeSupply, int], NewNode | None]] = {
    "idle-node": lambda supply, number: supply.idle_node(),
    "new-node": lambda supply, number: supply.grow(),
    "simulated": lambda supply, number: supply.simulate(number),
}
"""Each source of a node the policy may name -> how the placement's supply performs it."""


def take_node(supply: NodeSupply, sources: Iterable[str], number: int) -> NewNode | None:
    """A node from the first of ``sources`` (in the policy's order) that has one; ``number``:
    the node's number where the placement numbers nodes freely. None: no source had one."""
    for source in sources:
        new = NODE_SOURCES[source](supply, number)
        if new is not None:
            return new
    return None
