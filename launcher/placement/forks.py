"""Rank processes forked from a warm server per machine, cold starts where none can fork.

:class:`ForkingProcesses` is what the supervisor starts, polls and kills rank processes through.
It keeps one fork server (:mod:`resilience.fork_server`) per machine that holds ranks: the
training command in slot ``n<node>f``, started again when it dies (``fork-server`` events). The
first rank asked for on a machine, at the run's start as on a machine new to it (a satellite, an
expansion, a node back from repair), starts that machine's server, and its ranks wait for it: one
process importing torch and the user's modules, then a fork per rank, costs less than every rank
importing them side by side (measured, 4 ranks and a spare on one machine: half the CPU and a
fifth less wall time to the end of a 30-step run; with 8 ranks a node reading a shared file
system, one import instead of eight), and the machine has its server for every later fault. A
rank waits at most ``wait_s`` for a server warming up; then, or when the server has died, is
starting again after a death or refused, it starts cold through the placement, with a
``fork-fallback`` event saying why. A forked rank's exit comes from its server (the server's
death is theirs too: they die with it); a kill goes through its server.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from launcher.observability.events import EventLog
from launcher.placement import ForkHosts, Placement
from resilience.contract import fork_protocol
from resilience.contract import slots

KILLED = -9
"""A forked rank's exit code when its server died before reporting it (it died with its server)."""
WARMING = "its fork server is still warming up"
WAIT_S = 30.0
"""How long a rank waits for its machine's warming server before it starts cold: a cold start
takes seconds, so a server slower than this is stuck in the training script's own start-up."""


@dataclass
class _Server:
    slot: str
    node: int
    since: float = 0.0
    """When it was started (the supervisor's clock)."""
    ready_s: float | None = None
    """From its start to its ready reply: the srun step, imports, the script up to
    ``resilience.run`` and the warm-up."""
    announced: bool = False
    broken: str | None = None
    """Why it may not fork again (it refused a fork)."""
    after: int | None = None
    """How the server before it on this machine ended; ranks do not wait for a server started
    again (what killed the last one may kill it too): they start cold until it is ready."""


@dataclass(frozen=True)
class _Waiting:
    """A rank to fork once its machine's server is ready."""

    server: str
    node: int
    command: tuple[str, ...]
    env: dict[str, str]
    since: float


class ForkingProcesses:
    """The placement's rank processes, forked from a machine's warm server where one is ready."""

    def __init__(
        self,
        placement: Placement,
        hosts: ForkHosts,
        command: Sequence[str],
        env: Callable[[str, int, int], dict[str, str]],
        events: EventLog,
        wait_s: float = WAIT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.placement, self.hosts, self.events = placement, hosts, events
        self.command, self.env = list(command), env
        self.wait_s, self.clock = wait_s, clock
        self.servers: dict[str, _Server] = {}
        """machine -> its server, started and not stopped."""
        self._waiting: dict[str, _Waiting] = {}
        """rank slot -> its fork, until its server is ready (the supervisor's thread only)."""
        self._forked: dict[str, str] = {}
        """rank slot -> the slot of the server that forked it (this process of the slot)."""
        self._exits: dict[str, int] = {}
        self._lock = threading.Lock()

    # --- RankProcesses -------------------------------------------------------------------------

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> bool:
        """Start ``slot``'s process; True when it was forked or waits for its server to fork it."""
        with self._lock:
            self._exits.pop(slot, None)
            self._forked.pop(slot, None)
        machine = self.hosts.machine(node)
        if machine not in self.servers:
            self._start(machine, node, "started", None)
        server = self.servers.get(machine)
        why = self._unusable(server) if server is not None else None
        if server is not None and why is None:
            return self._fork(slot, node, server.slot, env, command)
        if server is not None and why == WARMING:
            self._waiting[slot] = _Waiting(server.slot, node, tuple(command), dict(env), self.clock())
            return True
        self._cold(slot, node, command, env, why)
        return False

    def _fork(
        self, slot: str, node: int, server: str, env: Mapping[str, str], command: Sequence[str]
    ) -> bool:
        request = {"fork": slot, "env": self.hosts.environ(node, env)}
        if self.hosts.send(server, fork_protocol.encode(request)):
            with self._lock:
                self._forked[slot] = server
            return True
        self._cold(slot, node, command, env, "its input is closed")
        return False

    def _cold(
        self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str], why: str | None
    ) -> None:
        if why is not None:
            self.events.emit("fork-fallback", slot=slot, node=node, host=self.placement.host(node), why=why)
        self.placement.spawn(slot, node, command, env)

    def poll(self, slot: str) -> int | None:
        if slot in self._waiting:
            self._settle(slot)
            if slot in self._waiting:
                return None
        with self._lock:
            code = self._exits.get(slot)
        if code is not None:
            return code
        server = self._forked.get(slot)
        if server is None:
            return self.placement.poll(slot)
        if self.placement.poll(server) is not None:
            return KILLED
        return self.hosts.rank_lost(slot)

    def kill(self, slot: str) -> None:
        if self._waiting.pop(slot, None) is not None:
            with self._lock:
                self._exits[slot] = KILLED
            return
        server = self._forked.get(slot)
        if server is None:
            self.placement.kill(slot)
        else:
            self.hosts.send(server, fork_protocol.encode({"kill": slot}))

    def echo(self, slot: str) -> None:
        self.placement.echo(slot)

    def stop_all(self, timeout_s: float = 30.0) -> None:
        """The servers fork nothing more and leave once their ranks have; then the placement
        waits for every process (servers included) as it does."""
        for server in self.servers.values():
            self.hosts.close_input(server.slot)
        self.servers.clear()
        self._waiting.clear()
        self.placement.stop_all(timeout_s)

    # --- the servers ---------------------------------------------------------------------------

    def tick(self, nodes: Iterable[int]) -> None:
        """Keep a server on each machine of ``nodes`` (those holding ranks now); stop those of
        machines that left (and have no rank waiting for their server)."""
        machines = {self.hosts.machine(node): node for node in sorted(nodes, reverse=True)}
        waited_for = {self.hosts.machine(wait.node) for wait in self._waiting.values()}
        for machine in [m for m in self.servers if m not in machines and m not in waited_for]:
            self._stop(self.servers.pop(machine))
        for slot in list(self._waiting):
            self._settle(slot)
        for machine, node in machines.items():
            server = self.servers.get(machine)
            code = self.placement.poll(server.slot) if server is not None else None
            if server is None or code is not None:
                self._start(machine, node, "started" if server is None else "restarted", code)
            elif server.ready_s is not None and not server.announced:
                server.announced = True
                self.events.emit(
                    "fork-server",
                    node=server.node,
                    host=self.placement.host(server.node),
                    how="ready",
                    seconds=server.ready_s,
                )

    def _start(self, machine: str, node: int, how: str, code: int | None) -> None:
        slot = slots.fork_server_slot(node)
        with self._lock:  # the ranks an earlier server of this slot forked died with it
            for rank_slot in [s for s, by in self._forked.items() if by == slot and s not in self._exits]:
                self._exits[rank_slot] = KILLED
        self.servers[machine] = _Server(slot, node, since=self.clock(), after=code)
        self.hosts.start_server(slot, node, self.command, self.env(slot, node, 0), self._on_reply)
        self.events.emit(
            "fork-server",
            node=node,
            host=self.placement.host(node),
            how=how,
            **({"exit_code": code} if code is not None else {}),
        )

    def _settle(self, slot: str) -> None:
        """Fork a waiting rank once its server is ready; cold when the server cannot or is late."""
        wait = self._waiting[slot]
        server = self._server(wait.server)
        why = self._unusable(server) if server is not None else None
        if why == WARMING and self.clock() - wait.since < self.wait_s:
            return
        del self._waiting[slot]
        if server is None:  # its machine left the run: nothing to start there
            with self._lock:
                self._exits[slot] = KILLED
        elif why is None:
            self._fork(slot, wait.node, wait.server, wait.env, wait.command)
        else:
            late = f"its fork server was not ready in {self.wait_s:g} s" if why == WARMING else why
            self._cold(slot, wait.node, wait.command, wait.env, late)

    def _stop(self, server: _Server) -> None:
        self.hosts.close_input(server.slot)
        self.placement.kill(server.slot)

    def _server(self, slot: str) -> _Server | None:
        """The running server of that slot (None once stopped); safe on the reader thread."""
        return next((s for s in tuple(self.servers.values()) if s.slot == slot), None)

    def _unusable(self, server: _Server) -> str | None:
        """Why ``server`` cannot fork now (None: it can)."""
        code = self.placement.poll(server.slot)
        if code is not None:
            return f"its fork server exited with {code}"
        if server.broken is not None:
            return server.broken
        if server.ready_s is not None:
            return None
        if server.after is not None:
            return f"its fork server is starting again (the one before exited with {server.after})"
        return WARMING

    def _on_reply(self, server_slot: str, message: dict[str, object]) -> None:
        """A server's reply, on the placement's reader thread."""
        server = self._server(server_slot)
        if "ready" in message and server is not None:
            server.ready_s = round(self.clock() - server.since, 3)
        elif "exit" in message:
            slot = str(message["exit"])
            with self._lock:
                if self._forked.get(slot) == server_slot:
                    self._exits[slot] = int(str(message.get("code", KILLED)))
        elif "refused" in message:
            slot = str(message["refused"])
            if server is not None:
                server.broken = f"its fork server refused a fork: {message.get('why')}"
            with self._lock:
                if self._forked.get(slot) == server_slot:
                    self._exits[slot] = KILLED
