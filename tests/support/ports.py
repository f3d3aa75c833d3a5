"""Ports for the test daemons (slurmctld, slurmd, sshd): below the kernel's ephemeral range.

A port chosen free and released before the daemon binds it can be taken in between. In the
ephemeral range it is: every outgoing connection of the other lane's tests (gloo, TCPStore, srun)
draws its source port from there, and a slurmd that then finds its port taken exits and leaves its
node UNKNOWN+NOT_RESPONDING (what failed a CI run's whole Slurm lane). Below the range only a
listener that names its port can take it, and tests choose theirs here, at random.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The first port the kernel hands out to ``bind(0)`` and ``connect``; Linux's default when
    unreadable."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_range(count: int, attempts: int = 200, rng: random.Random | None = None) -> list[int]:
    """``count`` contiguous ports, each free now, between :data:`LOWEST` and the ephemeral range."""
    rng = rng or random.Random()
    high = ephemeral_low() - count
    if high <= LOWEST:
        raise RuntimeError(f"no room for {count} ports below the ephemeral range ({EPHEMERAL_RANGE})")
    for _ in range(attempts):
        base = rng.randrange(LOWEST, high)
        ports = list(range(base, base + count))
        if all(port_free(p) for p in ports):
            return ports
    raise RuntimeError(f"no free range of {count} TCP ports below the ephemeral range")


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
