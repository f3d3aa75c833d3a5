"""The embedded default backend: N simulated nodes on this machine, each a group of processes.

A "node" is a node id shared by P processes; killing a node SIGKILLs all of them at once.
Each process's output goes to ``<log dir>/ranks/<slot>.log``; lines of the process that
currently holds rank 0 are also echoed to the console, so a user sees one training log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from launcher.placement import NewNode, NodeEvidence
from launcher.errors import SresError


class LocalPlacement:
    store_host = "127.0.0.1"
    requeueable = False
    job_id: str | None = None

    def __init__(
        self,
        log_dir: Path,
        echo=sys.stdout,
        repair_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``repair_after_s``: a retired (drained) node comes back that long after, healthy,
        under a new number: what an admin or the health hooks' resume does on a cluster.
        ``None``: lost nodes stay lost."""
        self.log_dir = Path(log_dir) / "ranks"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.echo = echo
        self.echo_slot: str | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self._readers: list[threading.Thread] = []
        self._echo_lock = threading.Lock()
        self.repair_after_s, self.clock = repair_after_s, clock
        self._in_repair: list[tuple[float, int]] = []  # (back at, node)
        self._top_node = -1

    def host(self, node: int) -> str:
        return f"node{node}"

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None:
        self._top_node = max(self._top_node, node)
        self._start(slot, command, env)

    def evidence(self, node: int) -> NodeEvidence:
        return NodeEvidence()  # simulated nodes die only when the supervisor kills them

    def retire(self, node: int, why: str) -> None:
        if self.repair_after_s is not None:
            self._in_repair.append((self.clock() + self.repair_after_s, node))

    def idle_node(self) -> NewNode | None:
        """A drained node back from repair (with ``repair_after_s``), else None."""
        if not self._in_repair or self._in_repair[0][0] > self.clock():
            return None
        self._in_repair.pop(0)
        self._top_node += 1
        return NewNode(self._top_node, self.host(self._top_node), "idle", 0.0, returned=True)

    def grow(self) -> NewNode | None:
        return None

    def new_node(self, index: int) -> NewNode | None:
        return NewNode(index, self.host(index), "local", 0.0)  # one more simulated node

    def release(self, node: int, why: str) -> str | None:
        return None

    def lendable(self) -> int:
        return 0

    def job_of(self, node: int) -> str | None:
        return None

    def requeue(self, why: str) -> None:
        raise SresError("a local run cannot be requeued: it is not a Slurm job")

    def time_limits(self) -> tuple[float | None, float | None]:
        return None, None

    def _start(self, slot: str, command: Sequence[str], env: Mapping[str, str]) -> int:
        proc = subprocess.Popen(
            list(command),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[slot] = proc
        reader = threading.Thread(target=self._pump, args=(slot, proc), daemon=True, name=f"sres-out-{slot}")
        reader.start()
        self._readers.append(reader)
        return proc.pid

    def poll(self, slot: str) -> int | None:
        return self.procs[slot].poll()

    def kill(self, slot: str) -> None:
        proc = self.procs[slot]
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop_all(self, timeout_s: float = 30.0) -> None:
        """Wait for processes to leave by themselves, then kill what is left."""
        for slot, proc in self.procs.items():
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill(slot)
                proc.wait()
            timeout_s = 1.0  # the first wait had the whole budget
        for reader in self._readers:
            reader.join(timeout=5)

    def _pump(self, slot: str, proc: subprocess.Popen) -> None:
        with (self.log_dir / f"{slot}.log").open("ab") as log:
            for line in iter(proc.stdout.readline, b""):
                log.write(line)
                log.flush()
                if slot == self.echo_slot and self.echo is not None:
                    with self._echo_lock:
                        self.echo.write(line.decode(errors="replace"))
                        self.echo.flush()
        proc.stdout.close()
