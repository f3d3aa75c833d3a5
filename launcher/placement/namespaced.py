"""Simulated nodes with networks of their own: each in a Linux network namespace, with its own
address on a bridge, so that a test can cut, half-cut or slow one node's link while its processes
live on (what a NIC, a switch port or a cable does on a cluster).

The layout is made by whoever runs the test (``tests/support/netns.py``: namespaces, veth pairs,
the bridge and its addresses, all its own) and handed to the run as ``SRES_NETNS``. Node ``k``'s
processes (its ranks, its fork server, its batch producer) start inside namespace ``<prefix><k>``
and reach the supervisor, whose store and liveness server listen on the bridge's address, over
that link; gloo is told the namespace's interface.

What crosses the simulated network is real TCP over real links. Two channels do not: a process's
start and its exit code travel through the supervisor's pipes, as they would through srun and
slurmd. The placement therefore does what a supervisor whose messages cannot reach a node does:
before a kill or a message to a node's fork server it asks whether the node answers on the network
(:meth:`reachable`: a TCP connection to a closed port is refused by a reachable host at once, and
goes unanswered across a cut), and sends nothing to one that does not. A rank left alive across
the cut must then fence itself (its lease) -- the property under test.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence

from launcher.placement import NodeEvidence
from launcher.placement.links import LinkFaults, NetnsLayout
from launcher.placement.local import LocalPlacement
from resilience.contract.injections import Injection


PROBE_PORT = 9
"""A port nothing listens on (discard): a reachable node's kernel refuses the connection."""
PROBE_S = 0.5


def reachable(address: str, timeout_s: float = PROBE_S) -> bool:
    """Whether ``address`` answers on the network: refused (RST) is an answer; silence is not."""
    try:
        socket.create_connection((address, PROBE_PORT), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return True


class NamespacedPlacement(LocalPlacement):
    """:class:`LocalPlacement` with each simulated node in its own network namespace."""

    def __init__(
        self, layout: NetnsLayout, *args: object, probe: Callable[[str], bool] = reachable, **kwargs: object
    ) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.layout, self._probe = layout, probe
        self.store_host = layout.host
        self._node_of: dict[str, int] = {}
        self.links = LinkFaults(layout)

    def _inside(self, slot: str, node: int, command: Sequence[str]) -> list[str]:
        self._node_of[slot] = node
        return ["ip", "netns", "exec", self.layout.namespace(node), *command]

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None:
        super().spawn(slot, node, self._inside(slot, node, command), self.environ(node, env))

    def start_server(
        self,
        slot: str,
        node: int,
        command: Sequence[str],
        env: Mapping[str, str],
        on_reply: Callable[[str, dict[str, object]], None],
    ) -> None:
        super().start_server(slot, node, self._inside(slot, node, command), self.environ(node, env), on_reply)

    def environ(self, node: int, env: Mapping[str, str]) -> dict[str, str]:
        return {**env, "GLOO_SOCKET_IFNAME": self.layout.dev}

    def machine(self, node: int) -> str:
        return self.layout.namespace(node)  # a fork server per node, inside its namespace

    def reachable(self, node: int) -> bool:
        return self._probe(self.layout.address(node))

    def _reaches(self, slot: str) -> bool:
        node = self._node_of.get(slot)
        return node is None or self.reachable(node)

    def send(self, slot: str, data: bytes) -> bool:
        return self._reaches(slot) and super().send(slot, data)

    def kill(self, slot: str) -> None:
        if self._reaches(slot):
            super().kill(slot)

    def evidence(self, node: int) -> NodeEvidence:
        return NodeEvidence(reachable=self.reachable(node))

    def break_link(self, injection: Injection) -> str:
        """An injected network fault on its node's link (``NodeLinks``); what was done, in words."""
        return self.links.break_link(injection)
