"""A node's link that loses packets or delays them, on kernels without ``sch_netem``.

netem is the usual tool; the kernels this runs on may lack it and every tc classifier. What every
kernel has is a TAP device and a packet socket. So the impairment is a forwarder process put in
the link's path: the link's host end leaves the bridge, a TAP device takes its place on it, and
this process carries each frame between the two, dropping a share of them at random or holding
each for a while. The node's TCP stack sees real loss (it retransmits) and a real round trip.

Frames travel with their virtio-net header (``PACKET_VNET_HDR`` on the packet socket,
``IFF_VNET_HDR`` on the TAP: the same header, as qemu passes them): a frame whose checksum the
sender left to the hardware keeps that note, and is completed by the kernel on the other side.
The node's end is told to send one packet per frame (``gso_max_segs 1``), so a loss is one packet,
not a burst of 44.

It ends when its time is up (``--for``), when the supervisor that started it is gone, or on
SIGTERM; then the link's host end goes back on the bridge and the TAP device disappears with its
file. ``python -m launcher.placement.impaired_link --help`` for its arguments; it is started by
:class:`launcher.placement.links.LinkFaults`, never by hand on an interface the tests did not make.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import random
import selectors
import signal
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import SresError
from launcher.placement import links

TUNSETIFF = 0x400454CA
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x0002, 0x1000, 0x4000
ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_VNET_HDR, PACKET_IGNORE_OUTGOING = 263, 15, 23
MAX_FRAME = 65536 + 64
"""A frame with its virtio-net header: the largest a GSO packet can be."""


@dataclass(frozen=True)
class Impairment:
    """What happens to each frame, both ways: lost with ``loss`` (0..1), else held ``delay_s``."""

    loss: float = 0.0
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.loss < 1 or self.delay_s < 0:
            raise ValueError(f"an impairment needs 0 <= loss < 1 and delay >= 0: {self}")


class Direction:
    """Frames one way: each dropped or queued until it is due, in order (one delay for all)."""

    def __init__(self, impairment: Impairment, rng: random.Random, send: Callable[[bytes], object]) -> None:
        self.impairment, self.rng, self.send = impairment, rng, send
        self.held: deque[tuple[float, bytes]] = deque()
        self.passed = self.dropped = 0

    def take(self, frame: bytes, now: float) -> None:
        if self.rng.random() < self.impairment.loss:
            self.dropped += 1
            return
        self.held.append((now + self.impairment.delay_s, frame))

    def flush(self, now: float) -> float | None:
        """Send what is due; the time until the next frame is (None: nothing held)."""
        while self.held and self.held[0][0] <= now:
            _, frame = self.held.popleft()
            try:
                self.send(frame)
                self.passed += 1
            except OSError:  # the far end is down (a cut at the same time): the frame is lost
                self.dropped += 1
        return self.held[0][0] - now if self.held else None


def open_tap(pattern: str = "sresi%d") -> tuple[int, str]:
    """A TAP device of this process (gone with its file), named by the kernel after ``pattern``."""
    fd = os.open("/dev/net/tun", os.O_RDWR)
    request = struct.pack("16sH", pattern.encode(), IFF_TAP | IFF_NO_PI | IFF_VNET_HDR)
    name = struct.unpack("16sH", fcntl.ioctl(fd, TUNSETIFF, request))[0].rstrip(b"\0").decode()
    os.set_blocking(fd, False)
    return fd, name


def open_packet_socket(interface: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)  # not the frames this process sends
    sock.bind((interface, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def ip(*argv: str) -> None:
    links.ip("ip", *argv)


def forward(args: argparse.Namespace, impairment: Impairment) -> tuple[Direction, Direction]:
    """Put the forwarder in the link's path, carry frames until told to stop, put the link back."""
    parent, deadline = os.getppid(), (time.monotonic() + args.seconds if args.seconds else None)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    tap, tap_name = open_tap()
    sock = open_packet_socket(args.link)
    rng = random.Random(args.seed)
    out = Direction(impairment, rng, lambda frame: os.write(tap, frame))  # node -> bridge
    back = Direction(impairment, rng, sock.send)  # bridge -> node
    try:
        if args.node_namespace:  # one packet a frame: a loss is one packet, as on a wire
            ip("-n", args.node_namespace, "link", "set", args.node_dev, "gso_max_segs", "1")
        # A bridge whose address nobody set takes the lowest of its ports'; were the TAP's lower,
        # the supervisor's address would move to another MAC under every node's ARP entry, and
        # every node would lose it (seen: every lease ran out). Set, it stays.
        mac = Path(f"/sys/class/net/{args.bridge}/address").read_text().strip()
        ip("link", "set", args.bridge, "address", mac)
        ip("link", "set", tap_name, "master", args.bridge, "up")
        ip("link", "set", args.link, "nomaster")
        print("ready", flush=True)
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ, out)
            sel.register(tap, selectors.EVENT_READ, back)
            wait: float | None = 0.2
            while not stop and os.getppid() == parent and (deadline is None or time.monotonic() < deadline):
                for key, _ in sel.select(min(wait, 0.2) if wait is not None else 0.2):
                    _read_all(key, time.monotonic())
                now = time.monotonic()
                waits = [w for w in (out.flush(now), back.flush(now)) if w is not None]
                wait = min(waits, default=None)
    finally:
        try:
            ip("link", "set", args.link, "master", args.bridge, "up")
        finally:
            os.close(tap)
            sock.close()
    return out, back


def _read_all(key: selectors.SelectorKey, now: float) -> None:
    direction: Direction = key.data
    for _ in range(256):  # what is ready now, then the others' turn
        try:
            source = key.fileobj
            frame = (
                source.recv(MAX_FRAME) if isinstance(source, socket.socket) else os.read(key.fd, MAX_FRAME)
            )
        except BlockingIOError:
            return
        except OSError:  # the link is down (a cut on top of the impairment): nothing to carry now
            return
        direction.take(frame, now)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--link", required=True, help="the link's host end (it leaves the bridge while this runs)")
    p.add_argument("--bridge", required=True)
    p.add_argument("--loss", type=float, default=0.0, help="the share of frames lost, each way (0..1)")
    p.add_argument("--delay-ms", type=float, default=0.0, help="added to each frame, each way")
    p.add_argument("--for", dest="seconds", type=float, default=0.0, help="then heal (0: until stopped)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--node-namespace", default="", help="the node's namespace, whose end sends a packet a frame"
    )
    p.add_argument("--node-dev", default="sres0", help="the link's end in that namespace")
    args = p.parse_args(argv)
    try:
        impairment = Impairment(args.loss, args.delay_ms / 1000)
        out, back = forward(args, impairment)
    except (OSError, ValueError, SresError) as err:  # SresError: an ip command, with its stderr
        print(f"sres: impaired link {args.link}: {err}", file=sys.stderr, flush=True)
        return 1
    print(
        f"impaired link {args.link}: {out.passed + back.passed} frames passed, "
        f"{out.dropped + back.dropped} lost",
        file=sys.stderr,
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
