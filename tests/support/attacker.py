"""What the attacker's processes of tests/security run (as another uid, with the repository on
their path): finding a victim's ports the way any user of a node can."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def listening(uid: int) -> Iterator[tuple[str, int]]:
    """Every listening IPv4 TCP socket of ``uid``: ``/proc/net/tcp`` shows them to all."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[7]) == uid:
            ip, port = f[1].split(":")
            yield ".".join(str(int(ip[i : i + 2], 16)) for i in (6, 4, 2, 0)), int(port, 16)


def greeting(uid: int, prefix: bytes, timeout_s: float = 3.0) -> list[tuple[str, int]]:
    """The ports of ``uid`` whose first line starts with ``prefix`` (sres servers greet first),
    probed side by side: a busy victim may take a while to greet."""

    def greets(address: tuple[str, int]) -> bool:
        try:
            with socket.create_connection(address, timeout=timeout_s) as sock:
                sock.settimeout(timeout_s)
                return sock.makefile("rb").readline().startswith(prefix)
        except OSError:
            return False

    ports = list(listening(uid))
    with ThreadPoolExecutor(max(1, len(ports))) as pool:
        return [address for address, yes in zip(ports, pool.map(greets, ports)) if yes]
