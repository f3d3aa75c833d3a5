"""Rank processes forked from a warm server per machine, cold starts where none can fork.

:class:`ForkingProcesses` is what the supervisor starts, polls and kills rank processes through.
Once the run has made its first step (the ranks' imports no longer compete for the CPU), it keeps
one fork server (:mod:`resilience.fork_server`) per machine that holds ranks: the training
command in slot ``n<node>f``, started again when it dies (``fork-server`` events). A rank started
on a machine whose server is warm is forked from it; anywhere else, or when the server is
still warming, has died or refused, it starts cold through the placement, with a
``fork-fallback`` event saying why. A forked rank's exit comes from its server (the server's
death is theirs too: they die with it); a kill goes through its server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from launcher.observability.events import EventLog
from launcher.placement import ForkHosts, Placement
from resilience.contract import fork_protocol

KILLED = -9
"""A forked rank's exit code when its server died before reporting it (it died with its server)."""


@dataclass
class _Server:
    slot: str
    node: int
    ready_s: float | None = None
    """The server's warm-up, once it said it is ready."""
    announced: bool = False
    broken: str | None = None
    """Why it may not fork again (it refused a fork)."""


class ForkingProcesses:
    """The placement's rank processes, forked from a machine's warm server where one is ready."""

    def __init__(
        self,
        placement: Placement,
        hosts: ForkHosts,
        command: Sequence[str],
        env: Callable[[str, int, int], dict[str, str]],
        events: EventLog,
    ) -> None:
        self.placement, self.hosts, self.events = placement, hosts, events
        self.command, self.env = list(command), env
        self.servers: dict[str, _Server] = {}
        """machine -> its server, started and not stopped."""
        self._forked: dict[str, str] = {}
        """rank slot -> the slot of the server that forked it (this process of the slot)."""
        self._exits: dict[str, int] = {}
        self._lock = threading.Lock()

    # --- RankProcesses -------------------------------------------------------------------------

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> bool:
        """Start ``slot``'s process; True when it was forked."""
        with self._lock:
            self._exits.pop(slot, None)
            self._forked.pop(slot, None)
        server = self.servers.get(self.hosts.machine(node))
        why = self._unusable(server) if server is not None else None
        if server is not None and why is None:
            if self.hosts.send(server.slot, fork_protocol.encode({"fork": slot, "env": dict(env)})):
                with self._lock:
                    self._forked[slot] = server.slot
                return True
            why = "its input is closed"
        if server is not None:
            self.events.emit(
                "fork-fallback", slot=slot, node=node, host=self.placement.host(node), why=str(why)
            )
        self.placement.spawn(slot, node, command, env)
        return False

    def poll(self, slot: str) -> int | None:
        server = self._forked.get(slot)
        if server is None:
            return self.placement.poll(slot)
        with self._lock:
            code = self._exits.get(slot)
        if code is not None:
            return code
        if self.placement.poll(server) is not None or self.hosts.rank_lost(slot):
            return KILLED
        return None

    def kill(self, slot: str) -> None:
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
        self.placement.stop_all(timeout_s)

    # --- the servers ---------------------------------------------------------------------------

    def tick(self, nodes: Iterable[int], started: bool) -> None:
        """Keep a server on each machine of ``nodes`` (those holding ranks now) once the run has
        ``started`` (made its first step); stop those of machines that left."""
        machines = {self.hosts.machine(node): node for node in sorted(nodes, reverse=True)}
        for machine in [m for m in self.servers if m not in machines]:
            self._stop(self.servers.pop(machine))
        if not started:
            return
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
        slot = fork_protocol.server_slot(node)
        with self._lock:  # the ranks an earlier server of this slot forked died with it
            for rank_slot in [s for s, by in self._forked.items() if by == slot and s not in self._exits]:
                self._exits[rank_slot] = KILLED
        self.servers[machine] = _Server(slot, node)
        self.hosts.start_server(slot, node, self.command, self.env(slot, node, 0), self._on_reply)
        self.events.emit(
            "fork-server",
            node=node,
            host=self.placement.host(node),
            how=how,
            **({"exit_code": code} if code is not None else {}),
        )

    def _stop(self, server: _Server) -> None:
        self.hosts.close_input(server.slot)
        self.placement.kill(server.slot)

    def _unusable(self, server: _Server) -> str | None:
        """Why ``server`` cannot fork now (None: it can)."""
        code = self.placement.poll(server.slot)
        if code is not None:
            return f"its fork server exited with {code}"
        if server.broken is not None:
            return server.broken
        return None if server.ready_s is not None else "its fork server is still warming up"

    def _on_reply(self, server_slot: str, message: dict[str, object]) -> None:
        """A server's reply, on the placement's reader thread."""
        server = next((s for s in tuple(self.servers.values()) if s.slot == server_slot), None)
        if "ready" in message and server is not None:
            server.ready_s = float(str(message["ready"]))
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
