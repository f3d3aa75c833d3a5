"""The embedded default placement: N simulated nodes on this machine, each a group of processes.

A "node" is a node id shared by P processes; killing a node SIGKILLs all of them at once. The
processes themselves are :class:`~launcher.placement.processes.Processes` (per-slot logs, rank
0's output echoed), the part every placement shares.

Without a scheduler, new nodes come from two places only: a drained node back from repair
after ``--repair-after`` (an idle node, under a new number) and a simulated node added on
request (a resize). Under submitit's local controller a :class:`LocalRerun` gives the run what
a Slurm batch job has: a time limit, and a requeue (an exit code on which its parent runs it again).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from launcher.errors import SresError
from launcher.placement import NewNode, NodeEvidence
from launcher.placement.processes import Processes


@dataclass(frozen=True)
class LocalRerun:
    """A local run that its parent runs again when it exits with ``exit_code``, under a time limit:
    submitit's local controller (144, ``timeout_min``), what a Slurm batch job's requeue and limit
    are on a cluster. ``started``: when this run began, on ``time.monotonic``'s clock;
    ``restart_count``: the runs before it."""

    exit_code: int
    time_limit_s: float | None
    started: float
    restart_count: int = 0


class LocalPlacement:
    store_host = "127.0.0.1"
    job_id: str | None = None

    def __init__(
        self,
        log_dir: Path,
        echo: TextIO | None = sys.stdout,
        repair_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        rerun: LocalRerun | None = None,
    ) -> None:
        """``repair_after_s``: a retired (drained) node comes back that long after, healthy,
        under a new number: what an admin or the health hooks' resume does on a cluster.
        ``None``: lost nodes stay lost. ``rerun``: how this run is requeued (its exit code: the
        caller exits with it) and its time limit; None: it cannot be, and has none."""
        self.rerun = rerun
        self.requeueable = rerun is not None
        self.processes = Processes(log_dir, echo)
        self.repair_after_s, self.clock = repair_after_s, clock
        self._in_repair: list[tuple[float, int]] = []  # (back at, node)
        self._top_node = -1

    # --- rank processes ------------------------------------------------------------------------

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None:
        self._top_node = max(self._top_node, node)
        self.processes.start(slot, command, env)

    def start_server(
        self,
        slot: str,
        node: int,
        command: Sequence[str],
        env: Mapping[str, str],
        on_reply: Callable[[str, dict[str, object]], None],
    ) -> None:
        self.processes.on_reply = on_reply
        self.processes.start(slot, command, env, feed=True)

    def send(self, slot: str, data: bytes) -> bool:
        return self.processes.send(slot, data)

    def close_input(self, slot: str) -> None:
        self.processes.close_input(slot)

    def environ(self, node: int, env: Mapping[str, str]) -> dict[str, str]:
        return dict(env)

    def machine(self, node: int) -> str:
        return "local"  # every simulated node is this machine: one fork server serves them all

    def rank_lost(self, slot: str) -> int | None:
        return None  # a local rank's death is its process's exit, which its fork server reports

    def poll(self, slot: str) -> int | None:
        return self.processes.poll(slot)

    def kill(self, slot: str) -> None:
        self.processes.kill(slot)

    def echo(self, slot: str) -> None:
        self.processes.echo_slot = slot

    def stop_all(self, timeout_s: float = 30.0) -> None:
        self.processes.stop_all(timeout_s)

    # --- nodes ---------------------------------------------------------------------------------

    def host(self, node: int) -> str:
        return f"node{node}"

    def job_of(self, node: int) -> str | None:
        return None

    def evidence(self, node: int) -> NodeEvidence:
        return NodeEvidence()  # simulated nodes die only when the supervisor kills them

    def retire(self, node: int, why: str) -> None:
        if self.repair_after_s is not None:
            self._in_repair.append((self.clock() + self.repair_after_s, node))

    def release(self, node: int, why: str) -> str | None:
        return None

    def idle_node(self) -> NewNode | None:
        """A drained node back from repair (with ``repair_after_s``), else None."""
        if not self._in_repair or self._in_repair[0][0] > self.clock():
            return None
        self._in_repair.pop(0)
        self._top_node += 1
        return NewNode(self._top_node, self.host(self._top_node), "idle", 0.0, returned=True)

    def grow(self) -> NewNode | None:
        return None  # no scheduler: a lost node is replaced by a spare or a repaired node only

    def simulate(self, node: int) -> NewNode | None:
        self._top_node = max(self._top_node, node)  # its ranks may be forked: spawn may never see it
        return NewNode(node, self.host(node), "local", 0.0)  # one more simulated node

    def lendable(self) -> int:
        return 0

    # --- the job -------------------------------------------------------------------------------

    def requeue(self, why: str) -> None:
        if self.rerun is None:
            raise SresError(
                "a local run cannot be requeued: it is not a Slurm job nor run again by its parent"
            )

    def time_limits(self) -> tuple[float | None, float | None]:
        if self.rerun is None or self.rerun.time_limit_s is None:
            return None, None
        limit = self.rerun.time_limit_s
        return limit - (time.monotonic() - self.rerun.started), limit
