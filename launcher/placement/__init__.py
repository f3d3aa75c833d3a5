"""Where ranks run (a *placement*): ``local`` (simulated nodes on this machine) or ``srun`` (steps of a Slurm job).

The supervisor decides; a backend carries out. Both offer the same operations, so the
supervisor's fault handling is one piece of code whichever runs the ranks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class NodeEvidence:
    """What can be seen of a node right after one of its ranks was lost."""

    slurmd_answers: bool = True
    slurm_usable: bool = True
    slurm_state: str = ""
    slurm_reason: str = ""
    reclaimed: bool = False
    """The node was lent to the run (a satellite) and Slurm is taking it back: not a fault of the node."""


@dataclass(frozen=True)
class NewNode:
    node: int
    host: str
    how: str
    """"idle" (a healthy node the job held and no rank used; ``returned`` when it was drained
    earlier and is healthy again), "satellite" (a one-node job of ours), "expansion" (the job
    grew) or "local"."""
    seconds: float
    returned: bool = False


class Placement(Protocol):
    echo_slot: str | None
    store_host: str
    requeueable: bool
    job_id: str | None
    """The Slurm job the run belongs to (None for a local run)."""
    """Whether :meth:`requeue` can work: a Slurm batch job (not salloc, not a local run)."""

    def host(self, node: int) -> str: ...
    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None: ...
    def poll(self, slot: str) -> int | None: ...
    def kill(self, slot: str) -> None: ...
    def stop_all(self, timeout_s: float = 30.0) -> None: ...
    def evidence(self, node: int) -> NodeEvidence: ...
    def retire(self, node: int, why: str) -> None: ...
    def idle_node(self) -> NewNode | None:
        """A healthy node the job holds and no rank uses, or None."""

    def grow(self) -> NewNode | None:
        """One more node from the scheduler (job expansion), or None when it cannot or may not."""

    def new_node(self, index: int) -> NewNode | None:
        """A node for a growing world (``index``: the next unused node number, where the
        placement numbers nodes freely), or None when there is none."""

    def release(self, node: int, why: str) -> str | None:
        """The node leaves the run, not for a fault: give it back to Slurm where it is ours to
        give (a satellite is cancelled). Returns the Slurm job id given back, or None."""

    def lendable(self) -> int:
        """How many idle nodes the run could grow into now (0 where nothing is lent)."""

    def job_of(self, node: int) -> str | None:
        """The Slurm job the node's ranks run in (the job itself or a satellite); None locally."""

    def requeue(self, why: str) -> None: ...
    def time_limits(self) -> tuple[float | None, float | None]:
        """The job's time left and time limit in seconds, (None, None) where there is none."""
