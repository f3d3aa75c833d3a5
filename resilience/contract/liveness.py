"""Process liveness through one TCP connection per rank: a death is seen at once.

Under Slurm a rank runs behind ``srun``, and srun reports a lost node only when slurmctld
declares it dead (measured: 16.7 s after the kill at SlurmdTimeout=10). A rank instead holds
one connection to the supervisor for its whole life; when the process dies, its kernel
closes the socket and the supervisor reads end-of-file within a tick. A node that loses
power sends nothing; the heartbeat timeout covers that case.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Peer:
    slot: str
    step_id: str  # SLURM_STEP_ID of the rank's srun step ("" outside Slurm)
    connected_t: float
    lost_t: float | None = None


class LivenessServer:
    """Accepts ``slot step_id\\n`` hellos and records when each connection ends."""

    def __init__(self, host: str = "", port: int = 0, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._sock = socket.create_server((host, port), backlog=1024)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._peers: dict[str, Peer] = {}
        self._buffers: dict[socket.socket, bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sres-liveness", daemon=True)
        self._thread.start()

    def peer(self, slot: str) -> Peer | None:
        with self._lock:
            return self._peers.get(slot)

    def lost_at(self, slot: str) -> float | None:
        """When ``slot``'s process closed its connection; None while it is connected (or never was)."""
        peer = self.peer(slot)
        return peer.lost_t if peer else None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for key in list(self._selector.get_map().values()):
            _socket(key).close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.05):
                conn = _socket(key)
                if conn is self._sock:
                    try:
                        client, _ = self._sock.accept()
                    except BlockingIOError:
                        continue
                    client.setblocking(False)
                    self._buffers[client] = b""
                    self._selector.register(client, selectors.EVENT_READ, data=None)
                    continue
                try:
                    data = conn.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if data:
                    self._hello(key, conn, data)
                else:
                    self._lost(key, conn)

    def _hello(self, key: selectors.SelectorKey, conn: socket.socket, data: bytes) -> None:
        if key.data is not None:
            return  # a rank sends only its hello
        buf = self._buffers[conn] + data
        if b"\n" not in buf:
            self._buffers[conn] = buf
            return
        slot, _, step = buf.split(b"\n", 1)[0].decode().partition(" ")
        self._selector.modify(conn, selectors.EVENT_READ, data=slot)
        with self._lock:
            self._peers[slot] = Peer(slot, step, self.clock())

    def _lost(self, key: selectors.SelectorKey, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        self._buffers.pop(conn, None)
        conn.close()
        if key.data is not None:
            with self._lock:
                self._peers[key.data].lost_t = self.clock()


def _socket(key: selectors.SelectorKey) -> socket.socket:
    """The socket ``key`` was registered with: this selector holds sockets only."""
    assert isinstance(key.fileobj, socket.socket), key.fileobj
    return key.fileobj


def announce(host: str, port: int, slot: str, step_id: str = "", timeout_s: float = 10.0) -> socket.socket:
    """Open this process's liveness connection; keep the returned socket for the process's life."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.sendall(f"{slot} {step_id}\n".encode())
    return sock
