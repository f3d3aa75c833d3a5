"""Test nodes with networks of their own: a bridge, one network namespace per simulated node with
a veth pair into it, addresses from a private /24 that exists only between them; and the faults a
real link has, done to those links alone (iproute2's ``ip``).

Everything is named with this process's id and removed at the end: no address or interface
outside what the test made is ever touched. The faults are the run's own
(:mod:`launcher.placement.links`, what ``--inject cut:N:...`` does), done here from the test. The
kernel here has no ``sch_netem`` and no tc classifiers (checked: ``tc qdisc add ... netem`` and
``tc filter ... matchall`` are refused): no per-packet loss or delay.
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

from launcher.placement.links import LinkFaults, NetnsLayout


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

    subnet: int = 0
    """The third number of its /24, ``10.213.<subnet>.0``: the first free one (:meth:`up`)."""

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
        return (
            f"prefix={self.prefix},host={self.host},first={self.address(0)},dev={DEV},"
            f"veth=sresv{self.tag}n,bridge={self.bridge}"
        )

    def up(self) -> "Network":
        self.down()
        self.subnet = _free_subnet()
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

    # --- faults: the run's own (launcher/placement/links.py), done from the test ------------------

    @property
    def links(self) -> LinkFaults:
        return LinkFaults(NetnsLayout.parse(self.variable))

    def cut(self, node: int) -> None:
        """Node ``node`` loses its link: nothing in or out, nothing refused."""
        self.links.cut(node)

    def heal(self, node: int) -> None:
        self.links.cut(node, down=False)

    def reset(self) -> None:
        """Every link as :meth:`up` made it: up, on the bridge (an impaired link's forwarder put it
        back when it ended), no lost direction, no cap, a packet a frame no more."""
        for node in range(self.nodes):
            self.heal(node)
            run("ip", "link", "set", self.outside(node), "master", self.bridge)
            run("ip", "-n", self.namespace(node), "link", "set", DEV, "gso_max_segs", "65535")
            for argv, dev in ((("ip", "-n", self.namespace(node)), DEV), (("ip",), self.bridge)):
                with contextlib.suppress(subprocess.CalledProcessError):  # ours only: dev named
                    run(*argv, "neigh", "flush", "dev", dev, "nud", "permanent")
            for argv, dev in (((), self.outside(node)), (("ip", "netns", "exec", self.namespace(node)), DEV)):
                with contextlib.suppress(subprocess.CalledProcessError):
                    run(*argv, "tc", "qdisc", "del", "dev", dev, "root")

    def slow(self, node: int, rate: str) -> None:
        """Both directions of node ``node``'s link capped at ``rate`` Mbit/s."""
        self.links.slow(node, float(rate))


def _free_subnet() -> int:
    """A ``10.213.X.0/24`` no interface of this machine has an address in (another test's, or a
    leftover of a run that was killed, would take its packets)."""
    shown = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    used = {int(part.split(".")[2]) for part in shown.split() if part.startswith("10.213.")}
    start = 100 + os.getpid() % 150
    free = next((n for n in range(start, start + 150) if n % 250 + 1 not in used), None)
    if free is None:
        raise RuntimeError("no free 10.213.X.0/24 left for a test network")
    return free % 250 + 1


@pytest.fixture
def network(request) -> Iterator[Network]:
    """Namespaces for ``request.param`` nodes (default 4), removed after the test."""
    why = available()
    if why is not None:
        pytest.fail(f"the network tests need namespaces: {why}")
    net = Network(getattr(request, "param", 4))
    try:
        yield net.up()
    finally:  # also when up() failed half-way: nothing of it is left
        net.down()
