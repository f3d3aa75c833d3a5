"""Connections that have not proved the run's secret yet, for servers with a thread per
connection (the control port, the neighbour-copy port).

Anyone on the network can connect to a run's ports. A connection that proves nothing must
cost the server a bounded share of its threads and descriptors for a bounded time, and must
never keep a run's own process out: about 1,100 idle connections to the control port made the
supervisor die of ``EMFILE``, and 16 silent ones held the neighbour server's slots for a whole
run. So at most ``limit`` unproven connections live at once, each at most ``deadline_s`` (from
its accept, however slowly it drips bytes); past the limit the *oldest* is cut, not the
newest: a run's process proves itself within milliseconds of its accept, so a flood cannot
outlast it. Cutting is ``shutdown()``: the connection's own thread wakes from its read and
ends. The liveness server does the same in its selector loop.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable


_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class UnprovenConnections:
    def __init__(self, limit: int, deadline_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or not deadline_s > 0:
            raise ValueError("an unproven-connection budget needs limit >= 1 and a positive deadline")
        self.limit, self.deadline_s, self.clock = limit, deadline_s, clock
        self._since: dict[socket.socket, float] = {}  # in accept order: the oldest first
        self._lock = threading.Lock()
        self.cut = 0
        """Connections cut so far (past the deadline, or the oldest past the limit)."""

    def admit(self, conn: socket.socket) -> None:
        """A new connection: cut those past their deadline, then the oldest while over the limit."""
        with self._lock:
            now = self.clock()
            late = [c for c, t in self._since.items() if now - t > self.deadline_s]
            over = len(self._since) - len(late) + 1 - self.limit
            for c in late + [c for c in self._since if c not in late][: max(over, 0)]:
                del self._since[c]
                _cut(c)
                self.cut += 1
            self._since[conn] = now
            conn.settimeout(self.deadline_s)  # a silent one ends by itself too

    def accept(
        self, server: socket.socket, sleep: Callable[[float], None] = time.sleep
    ) -> socket.socket | None:
        """The listening socket's next connection, admitted; None once the socket is closed.

        Out of descriptors (``EMFILE``, ...) is waited out rather than ending the server: the
        budget cuts the oldest unproven connections, which frees them."""
        while True:
            try:
                conn, _ = server.accept()
            except OSError as err:
                if err.errno in _OUT_OF_DESCRIPTORS:
                    sleep(0.05)
                    continue
                return None  # closed: the server stops
            self.admit(conn)
            return conn

    def proved(self, conn: socket.socket) -> None:
        """It proved the secret: it no longer counts, and is never cut."""
        with self._lock:
            self._since.pop(conn, None)

    forget = proved
    """It ended (proved or not): forget it."""

    def __len__(self) -> int:
        with self._lock:
            return len(self._since)


def _cut(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # closed already
