"""Where ranks run (a *placement*): ``local`` (simulated nodes on this machine) or ``srun``
(steps of a Slurm job).

The supervisor decides; a placement carries out. What a placement can do is split by
capability into small protocols, and each part of the supervisor asks for the one it uses:
the executor starts and kills processes (:class:`RankProcesses`), names nodes
(:class:`NodeNames`), lets nodes go (:class:`NodeExits`), takes new ones
(:class:`NodeSupply`) and requeues the job (:class:`JobControl`); the Observer also reads
evidence about a node (:class:`NodeInspector`). A placement offers these without choosing
among them: which source of a node comes first is the policy's choice
(``REPLACEMENT_ORDER``, ``GROWTH_ORDER``). :class:`Placement` is all of them at once, what a
``Supervisor`` is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from resilience.contract.injections import Injection


@dataclass(frozen=True)
class NodeEvidence:
    """What can be seen of a node right after one of its ranks was lost."""

    slurmd_answers: bool = True
    slurm_usable: bool = True
    slurm_state: str = ""
    slurm_reason: str = ""
    reclaimed: bool = False
    """The node was lent to the run (a satellite) and Slurm is taking it back: not a fault of the node."""
    reachable: bool = True
    """The node answers on the network (False: cut off, its processes perhaps alive: unreachable)."""
    slurm_answers: bool = True
    """slurmctld answered the question about this node (False: it could not be asked)."""
    runs_supervisor: bool = False
    """The supervisor runs on this node: that it answers says nothing of the supervisor's own link."""


@dataclass(frozen=True)
class NewNode:
    node: int
    host: str
    how: str
    """"idle" (a healthy node the job held and no rank used; ``returned`` when it was drained
    earlier and is healthy again), "satellite" (a one-node job of ours), "expansion" (the job
    grew) or "local" (a simulated node)."""
    seconds: float
    returned: bool = False


@runtime_checkable
class NodeLinks(Protocol):
    """Breaks a node's network link as an injected fault says (nodes with networks of their own)."""

    def break_link(self, injection: Injection) -> str:
        """Do it; what was done, in words (the ``network-fault`` event's)."""


class RankProcesses(Protocol):
    """Starts, watches and stops rank processes."""

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> bool | None:
        """Start the slot's process; True when it was forked from a warm fork server."""

    def poll(self, slot: str) -> int | None:
        """The process's exit code (negative: killed by that signal), None while it runs."""

    def kill(self, slot: str) -> None: ...
    def echo(self, slot: str) -> None:
        """Show this slot's output on the console from now on (the process holding rank 0)."""

    def stop_all(self, timeout_s: float = 30.0) -> None:
        """Wait for every process to leave by itself, then kill what is left."""


@runtime_checkable
class ForkHosts(Protocol):
    """Where a placement can run fork servers (:mod:`launcher.placement.forks`): a process per
    machine started with its stdin a pipe the supervisor writes requests to, its replies read
    from its output."""

    def start_server(
        self,
        slot: str,
        node: int,
        command: Sequence[str],
        env: Mapping[str, str],
        on_reply: Callable[[str, dict[str, object]], None],
    ) -> None: ...
    def send(self, slot: str, data: bytes) -> bool:
        """Write to a server's stdin; False when it cannot take it."""

    def close_input(self, slot: str) -> None: ...
    def environ(self, node: int, env: Mapping[str, str]) -> dict[str, str]:
        """A rank's whole environment on ``node``: ``env`` and what the placement adds to every
        process it starts there (a forked rank gets it in its request, not from its server)."""

    def machine(self, node: int) -> str:
        """What nodes on one machine share: the same fork server serves them."""

    def rank_lost(self, slot: str) -> int | None:
        """A rank's end seen apart from its process (its liveness connection closed), before its
        exit code can be: the code it said it was exiting with, else a kill's (-9); None while
        it is not seen lost."""


class NodeNames(Protocol):
    """Where things are: nodes' host names, the Slurm job each runs in, the store's host.
    (Read-only members: a plain attribute of the type, or of a narrower one, provides them.)"""

    @property
    def store_host(self) -> str: ...
    @property
    def job_id(self) -> str | None:
        """The Slurm job the run belongs to (None for a local run)."""

    def host(self, node: int) -> str: ...
    def job_of(self, node: int) -> str | None:
        """The Slurm job the node's ranks run in (the job itself or a satellite); None locally."""


class NodeInspector(Protocol):
    """Evidence about a node, gathered when one of its ranks was lost; the policy judges it."""

    def evidence(self, node: int) -> NodeEvidence: ...


class NodeExits(Protocol):
    """A node leaves the run: drained for a fault, or given back."""

    def retire(self, node: int, why: str) -> None:
        """Drain the node (reason ``sres: why``) and drop it from the job where Slurm allows."""

    def release(self, node: int, why: str) -> str | None:
        """The node leaves the run, not for a fault: give it back to Slurm where it is ours to
        give (a satellite is cancelled). Returns the Slurm job id given back, or None."""


class NodeSupply(Protocol):
    """The sources of one more node, each on its own (None: this source has none now), and
    how much the scheduler could lend."""

    def idle_node(self) -> NewNode | None:
        """A healthy node the job holds and no rank uses (or one back from repair), or None."""

    def grow(self) -> NewNode | None:
        """One more node from the scheduler (a satellite or job expansion), or None when it
        cannot or may not."""

    def simulate(self, node: int) -> NewNode | None:
        """A simulated node numbered ``node`` (a placement that numbers its nodes freely), or
        None where nodes are real."""

    def lendable(self) -> int:
        """How many idle nodes the run could grow into now (0 where nothing is lent)."""


class JobControl(Protocol):
    """The job as a whole: its time limits and a requeue."""

    @property
    def requeueable(self) -> bool:
        """Whether :meth:`requeue` can work: a Slurm batch job (not salloc, not a local run)."""

    def requeue(self, why: str) -> None: ...
    def time_limits(self) -> tuple[float | None, float | None]:
        """The job's time left and time limit in seconds, (None, None) where there is none."""


class Placement(RankProcesses, NodeNames, NodeInspector, NodeExits, NodeSupply, JobControl, Protocol):
    """Every capability at once: what a ``Supervisor`` is given (its parts each take one)."""
