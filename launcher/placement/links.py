"""The network of nodes in namespaces of their own: its layout (``SRES_NETNS``, made by a test),
and breaking a node's link the ways real links break (``--inject cut:N:...`` and its kin):
iproute2 on the links the test made, never on any other interface or address.

The kernels this runs on may lack ``sch_netem`` and tc's classifiers (this machine's do), so each
fault uses what every kernel has: a cut is the link's host end set down (the node's end loses its
carrier: nothing is refused, packets vanish, as with a pulled cable); a lost direction is a
permanent neighbour entry pointing at no one (frames to that address go nowhere, the other way is
untouched); a degraded cable is ``tbf`` on both ends of the link; packet loss and added delay are a
forwarder process put in the link's path (:mod:`.impaired_link`: a TAP device and a packet socket).
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from launcher.errors import ConfigError, SresError
from resilience.contract.injections import Injection

VARIABLE = "SRES_NETNS"
"""``prefix=<namespace prefix>,host=<the supervisor's address>,first=<node 0's address>,dev=<the
interface inside each namespace>,veth=<the host ends' prefix>,bridge=<the bridge>``: set by a test
that made the namespaces."""


@dataclass(frozen=True)
class NetnsLayout:
    prefix: str
    host: str
    """The supervisor's address on the bridge: its store and liveness server listen there."""
    first: str
    """Node 0's address; node k's is ``first + k``."""
    dev: str = "sres0"
    veth: str = ""
    """Node k's link's host end is ``<veth><k>`` (what a cut sets down)."""
    bridge: str = ""

    @classmethod
    def parse(cls, text: str) -> "NetnsLayout":
        try:
            fields = dict(part.split("=", 1) for part in text.split(","))
            layout = cls(
                fields["prefix"],
                fields["host"],
                fields["first"],
                fields.get("dev", "sres0"),
                fields.get("veth", ""),
                fields.get("bridge", ""),
            )
            ipaddress.IPv4Address(layout.host), ipaddress.IPv4Address(layout.first)
        except (ValueError, KeyError) as err:
            raise ConfigError(f"{VARIABLE}={text!r}: expected prefix=,host=,first=[,dev=] ({err})") from None
        return layout

    def namespace(self, node: int) -> str:
        return f"{self.prefix}{node}"

    def address(self, node: int) -> str:
        return str(ipaddress.IPv4Address(self.first) + node)


NOWHERE = "02:00:00:00:00:01"
"""A locally administered hardware address no interface here has: frames to it are dropped."""
FLAP_S = 0.2


def ip(*argv: str) -> None:
    """One ``ip``/``tc`` command; a failure is the run's error in one line (a test's layout broke)."""
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", "") or str(err)
        raise SresError(f"network fault: {' '.join(argv)} failed: {detail.strip()}") from None


class LinkFaults:
    """The faults of the links of a :class:`NetnsLayout`'s nodes."""

    def __init__(
        self,
        layout: NetnsLayout,
        run: Callable[..., None] = ip,
        spawn: Callable[..., subprocess.Popen[str]] = subprocess.Popen,
    ) -> None:
        self.layout, self.run, self.spawn = layout, run, spawn
        self.forwarders: dict[int, subprocess.Popen[str]] = {}
        """Node -> the process carrying its impaired link (:mod:`.impaired_link`)."""

    def outside(self, node: int) -> str:
        return f"{self.layout.veth}{node}"

    def inside(self, node: int, *argv: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.layout.namespace(node), *argv)

    def cut(self, node: int, down: bool = True) -> None:
        self.run("ip", "link", "set", self.outside(node), "down" if down else "up")

    def drop_out(self, node: int, drop: bool = True) -> None:
        """Node ``node``'s packets to the supervisor go nowhere (or, ``drop=False``, arrive again)."""
        self._neighbour(self.inside(node), self.layout.dev, self.layout.host, drop)

    def cut_supervisor(self, node: int, cut: bool = True) -> None:
        """Node ``node`` and the supervisor lose each other, both ways; its peers still reach it."""
        self.drop_out(node, cut)
        self._neighbour((), self.layout.bridge, self.layout.address(node), cut)

    def slow(self, node: int, mbit: float) -> None:
        rate = f"{mbit:g}mbit"
        for where, dev in ((self.inside(node), self.layout.dev), ((), self.outside(node))):
            self.run(*where, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
                     "burst", "256kb", "latency", "400ms")  # fmt: skip

    def impair(self, node: int, loss: float = 0.0, delay_s: float = 0.0, seconds: float = 0.0) -> None:
        """Both directions of node ``node``'s link lose ``loss`` of their packets and hold each
        ``delay_s`` (a forwarder process in the link's path, :mod:`.impaired_link`), for ``seconds``
        (0: for as long as this process lives). Returns once the forwarder is in the path."""
        if node in self.forwarders:
            raise SresError(f"network fault: node {node}'s link is impaired already")
        argv = [
            sys.executable, "-m", "launcher.placement.impaired_link",
            "--link", self.outside(node), "--bridge", self.layout.bridge,
            "--loss", f"{loss:g}", "--delay-ms", f"{delay_s * 1000:g}", "--for", f"{seconds:g}",
            "--seed", str(node),
            "--node-namespace", self.layout.namespace(node), "--node-dev", self.layout.dev,
        ]  # fmt: skip
        proc = self.spawn(argv, stdout=subprocess.PIPE, text=True)
        ready = proc.stdout.readline() if proc.stdout is not None else ""
        if ready.strip() != "ready":
            proc.wait(timeout=30)
            why = f"exit {proc.returncode}: its error is on the run's console"
            raise SresError(f"network fault: the impaired link of node {node} did not start ({why})")
        self.forwarders[node] = proc

    def flap(self, node: int, seconds: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Down and up every :data:`FLAP_S` for ``seconds``, ending up (call it on a thread)."""
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline:
                self.cut(node, True)
                sleep(FLAP_S)
                self.cut(node, False)
                sleep(FLAP_S)
        finally:
            self.cut(node, False)

    def _neighbour(self, where: tuple[str, ...], dev: str, address: str, drop: bool) -> None:
        if drop:
            self.run(
                *where, "ip", "neigh", "replace", address, "lladdr", NOWHERE, "dev", dev, "nud", "permanent"
            )
        else:
            self.run(*where, "ip", "neigh", "del", address, "dev", dev)

    def undo_after(self, seconds: float, undo: Callable[[], None]) -> None:
        """Heal after ``seconds`` on a thread of its own (0: never)."""
        if seconds > 0:
            timer = threading.Timer(seconds, _said, (undo,))
            timer.daemon = True  # the run may end first: its links go with the test's namespaces
            timer.start()

    def break_link(self, injection: Injection) -> str:
        """Do ``injection`` to its node's link; what was done, in words."""
        kind, node, heal, mbit = injection.kind, injection.node, injection.seconds or 0.0, injection.mbit
        assert node is not None, "a link fault names its node"
        if kind == "cut":
            self.cut(node)
            self.undo_after(heal, lambda: self.cut(node, False))
            return "link down"
        if kind in ("cut-supervisor", "isolate-supervisor"):  # the latter: done to every node
            self.cut_supervisor(node)
            self.undo_after(heal, lambda: self.cut_supervisor(node, False))
            return "cut off from the supervisor's node, not from its peers"
        if kind == "drop-out":
            self.drop_out(node)
            self.undo_after(heal, lambda: self.drop_out(node, False))
            return "its packets to the supervisor dropped"
        if kind == "flap":
            threading.Thread(target=_said, args=(lambda: self.flap(node, heal),), daemon=True).start()
            return f"link flapping every {FLAP_S:g} s"
        if kind == "slow-link":
            assert mbit is not None, "parse() gives every slow-link spec its cap"
            self.slow(node, mbit)
            return f"link capped at {mbit:g} Mbit/s"
        if kind == "lossy":
            assert injection.percent is not None, "parse() gives every lossy spec its share"
            self.impair(node, loss=injection.percent / 100)
            return f"{injection.percent:g}% of its packets lost each way"
        if kind == "delay":
            assert injection.ms is not None, "parse() gives every delay spec its time"
            self.impair(node, delay_s=injection.ms / 1000)
            return f"{injection.ms:g} ms added to each packet each way"
        raise ValueError(f"not a link fault: {kind}")


def _said(work: Callable[[], None]) -> None:
    """Run ``work`` on a helper thread: a failure is one line on stderr, not a thread's traceback."""
    try:
        work()
    except SresError as err:
        print(f"sres: {err}", file=sys.stderr, flush=True)
