"""Test nodes with networks of their own: a bridge, one network namespace per simulated node with
a veth pair into it, addresses from a private /24 that exists only between them; and the faults a
real link has, done to those links alone (iproute2's ``ip``).

Everything is named with this process's id and removed at the end: no address or interface
outside what the test made is ever touched. The kernel here has no ``sch_netem`` and no tc
classifiers (checked: ``tc qdisc add ... netem`` and ``tc filter ... matchall`` are refused), so
the faults use what it has: a cut is the link's host end set down (the node's end loses its
carrier: nothing is refused, packets vanish, as with a pulled cable); one direction dropped is a
static neighbour entry on the node's side pointing at no one (its frames to that address go
nowhere, the other direction is untouched); a slow link is ``tbf`` on both ends.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

DEV = "sres0"
"""The interface inside each namespace."""
_MADE = itertools.count()
"""Networks made by this process: each gets names and a subnet of its own (a removed veth pair
lingers a moment in the kernel; the next test's must not collide with it)."""


def run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


def available() -> str | None:
    """Why namespaces cannot be made here (None: they can): root and iproute2 are needed."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    return None


@dataclass
class Network:
    """``nodes`` namespaces on one bridge; the supervisor stays in this namespace on the bridge."""

    nodes: int
    number: int = field(default_factory=lambda: next(_MADE))

    @property
    def tag(self) -> str:
        return f"{os.getpid() % 100000}{self.number % 100}"

    @property
    def subnet(self) -> int:
        return 100 + (os.getpid() + self.number) % 150

    @property
    def prefix(self) -> str:
        return f"sres{self.tag}n"

    @property
    def bridge(self) -> str:
        return f"sresb{self.tag}"

    @property
    def host(self) -> str:
        return f"10.213.{self.subnet}.1"

    def address(self, node: int) -> str:
        return f"10.213.{self.subnet}.{10 + node}"

    def outside(self, node: int) -> str:
        """The host end of node ``node``'s veth."""
        return f"sresv{self.tag}n{node}"

    def namespace(self, node: int) -> str:
        return f"{self.prefix}{node}"

    @property
    def variable(self) -> str:
        """``SRES_NETNS`` for a run on these nodes."""
        return f"prefix={self.prefix},host={self.host},first={self.address(0)},dev={DEV}"

    def up(self) -> "Network":
        self.down()
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.host}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        for node in range(self.nodes):
            ns, out = self.namespace(node), self.outside(node)
            run("ip", "netns", "add", ns)
            run("ip", "link", "add", out, "type", "veth", "peer", "name", DEV, "netns", ns)
            run("ip", "link", "set", out, "master", self.bridge, "up")
            run("ip", "-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", DEV)
            run("ip", "-n", ns, "link", "set", DEV, "up")
            run("ip", "-n", ns, "link", "set", "lo", "up")
        return self

    def down(self) -> None:
        """Remove what :meth:`up` made (and a leftover of an earlier run with the same tag)."""
        for node in range(self.nodes):
            with contextlib.suppress(subprocess.CalledProcessError):
                run("ip", "link", "del", self.outside(node))  # and its peer in the namespace
            with contextlib.suppress(subprocess.CalledProcessError):
                run("ip", "netns", "del", self.namespace(node))
        with contextlib.suppress(subprocess.CalledProcessError):
            run("ip", "link", "del", self.bridge)

    # --- faults ----------------------------------------------------------------------------------

    def cut(self, node: int) -> None:
        """Node ``node`` loses its link: nothing in or out, nothing refused."""
        run("ip", "link", "set", self.outside(node), "down")

    def heal(self, node: int) -> None:
        run("ip", "link", "set", self.outside(node), "up")

    def drop_towards(self, node: int, address: str) -> None:
        """Node ``node``'s packets to ``address`` go nowhere (a neighbour entry with no one's
        hardware address); packets from there still arrive."""
        run("ip", "-n", self.namespace(node), "neigh", "replace", address, "lladdr", "02:00:00:00:00:01",
            "dev", DEV, "nud", "permanent")  # fmt: skip

    def undrop(self, node: int, address: str) -> None:
        run("ip", "-n", self.namespace(node), "neigh", "del", address, "dev", DEV)

    def slow(self, node: int, rate: str) -> None:
        """Both directions of node ``node``'s link capped at ``rate`` (e.g. ``100mbit``)."""
        for argv in (("ip", "netns", "exec", self.namespace(node)), ()):
            dev = DEV if argv else self.outside(node)
            run(*argv, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb",
                "latency", "200ms")  # fmt: skip


@pytest.fixture
def network(request) -> Iterator[Network]:
    """Namespaces for ``request.param`` nodes (default 4), removed after the test."""
    why = available()
    if why is not None:
        pytest.fail(f"the network tests need namespaces: {why}")
    net = Network(getattr(request, "param", 4)).up()
    try:
        yield net
    finally:
        net.down()
