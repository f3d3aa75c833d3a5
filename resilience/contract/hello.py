"""A rank's side of its liveness connection's hello: connect, prove the run's secret, and wait
until the supervisor's server (:class:`~resilience.contract.liveness.LivenessServer`) accepts it.

The server greets with a challenge; the rank answers with its slot, its Slurm step and a proof
that it holds the run's secret; the server accepts with a signed line (:mod:`.link`). A rank
whose hello is refused learns it here, not later from a closed connection.
"""

from __future__ import annotations

import socket

from resilience.contract import link, run_secret

MAX_HELLO = 256
"""A hello is one short line; a longer one is not a rank's."""
GREETING = "sres-liveness"


def announce(
    host: str, port: int, slot: str, secret: str, step_id: str = "", timeout_s: float = 10.0
) -> socket.socket:
    """Open this process's liveness connection, proving the run's secret, and wait until the
    server accepts it (a refused hello is a ``ConnectionError`` here, not a rank that later
    takes the closed connection for the supervisor's end); keep the socket for the process's life."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        greeting = _read_line(sock).decode("ascii", errors="replace").split()
        if len(greeting) != 2 or greeting[0] != GREETING:
            raise ConnectionError(f"{host}:{port} is not the run's liveness server")
        answer = run_secret.proof(secret, greeting[1], slot, step_id)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.sendall(f"{slot} {step_id} {answer}\n".encode())
        accepted = link.parse(link.link_key(secret), slot, _read_line(sock), frozenset(link.ACCEPTED), 0)
        if accepted is None:
            raise ConnectionError(f"the run's liveness server at {host}:{port} did not accept {slot}'s hello")
    except BaseException:
        sock.close()
        raise
    return sock


def _read_line(sock: socket.socket) -> bytes:
    """One line, read a byte at a time: what follows it belongs to whoever reads the socket next."""
    data = b""
    while not data.endswith(b"\n") and len(data) <= MAX_HELLO:
        byte = sock.recv(1)
        if not byte:
            break
        data += byte
    return data.rstrip(b"\n")
