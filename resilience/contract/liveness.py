"""Process liveness through one TCP connection per rank: a death is seen at once; the connection
also carries the rank's heartbeats and step times up, and notices down (:mod:`.link`).

Under Slurm a rank runs behind ``srun``, and srun reports a lost node only when slurmctld
declares it dead (measured: 16.7 s after the kill at SlurmdTimeout=10). A rank instead holds
one connection to the supervisor for its whole life; when the process dies, its kernel
closes the socket and the supervisor reads end-of-file within a tick. A node that loses
power sends nothing; the heartbeat timeout covers that case.
"""

from __future__ import annotations

import re
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from resilience.contract import link, run_secret, slots
from resilience.contract.hello import GREETING, MAX_HELLO
from resilience.contract.messages import RecentSteps, StepRecord

MAX_PENDING = 8192
"""Connections that have not proved the run's secret yet; past it the oldest one is closed (a
rank proves it within milliseconds, so a flood of silent connections cannot keep one out). Sized
for every rank of a large job connecting at once: at 256, 1,024 ranks starting together had
proven ranks' connections closed before their hello was read (the harness of
``benchmarks/control_plane.py``), and each such rank ended itself."""
HELLO_TIMEOUT_S = 10.0
"""An unproven connection is closed after this long."""
GATHER_S = 0.005
"""After reading what was ready, the server waits this long before it looks again, so that one
look reads many ranks' lines: at 4,096 ranks a look per line was 15% of the supervisor's CPU. A
closed connection is still read within a tick (20 ms)."""
ECHO_EVERY_S = 0.25
"""The newest line read from a rank is echoed at most this often (its lease: :mod:`.lease`): a
rank's lines come every beat period or step, and the echo of a batch of them renews as much."""
_STEP = re.compile(r"[0-9]{0,20}")


ANNOUNCE_CHUNK = 128
"""Notices written under one taking of the lock: one taking a line, the serving thread (reading
the lines of ranks already told) took the lock and the GIL back between every two sends, and a
notice to 4,096 ranks took 2.3 s of wall time for 0.13 s of the loop's CPU (measured on 2 cores
with the harness). 128 sends hold the serving thread off for about 2 ms, well within a tick."""
KEEP_STEPS = 64
"""Step records kept per slot and generation until the supervisor's reader takes them (its newest)."""


@dataclass
class Peer:
    slot: str
    step_id: str  # SLURM_STEP_ID of the rank's srun step ("" outside Slurm)
    connected_t: float
    lost_t: float | None = None
    beats: int = 0
    """Heartbeats received over the connection (a larger number than before: alive)."""
    said_exit: int | None = None
    """The exit code the process said it was ending itself with (its last line), if it did."""


@dataclass
class _Link:
    """A proven connection's reading and writing state."""

    slot: str
    buffer: bytes = b""
    heard: int = 0
    said: int = 0
    mute: bool = False
    """A notice could not be written whole: no more are (nor echoes: the rank's lease runs out)."""
    echoed_t: float = float("-inf")


@dataclass
class _Pending:
    challenge: str
    since: float
    buffer: bytes = b""


class LivenessServer:
    """Accepts hellos (``slot step_id proof``, the proof answering the challenge it sent) and
    records when each proven connection ends.

    Anyone on the network can connect; only the run's processes know the secret. A connection
    that does not prove it in one short line is closed and noted in :meth:`take_dropped`: it
    can neither claim a slot nor end one, and no input stops the server's thread.
    """

    def __init__(
        self,
        secret: str,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not run_secret.is_secret(secret):
            raise ValueError("the liveness server needs the run's secret")
        self.secret, self.clock = secret, clock
        self._sock = socket.create_server((host, port), backlog=4096)
        self._sock.setblocking(False)
        self.port = self._sock.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._peers: dict[str, Peer] = {}
        self._pending: dict[socket.socket, _Pending] = {}
        self._links: dict[socket.socket, _Link] = {}
        self._key = link.link_key(secret)
        self._dropped: deque[str] = deque(maxlen=100)
        self._lost_since: list[str] = []
        self._rung = dict.fromkeys(link.DOORBELLS, 0)
        self._fresh: dict[tuple[int, str], list[StepRecord]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="sres-liveness", daemon=True)
        self._thread.start()

    def peer(self, slot: str) -> Peer | None:
        with self._lock:
            return self._peers.get(slot)

    def rung(self, what: str) -> int:
        """How many times ranks rang the doorbell for ``what`` (a report, an event) written to the
        store: the supervisor reads the store's counter of them only when this moves (and, for
        writers without a connection, every half beat period)."""
        with self._lock:
            return self._rung[what]

    def lost_at(self, slot: str) -> float | None:
        """When ``slot``'s process closed its connection; None while it is connected (or never was)."""
        peer = self.peer(slot)
        return peer.lost_t if peer else None

    def lost_as(self, slot: str, killed: int) -> int | None:
        """How ``slot``'s process ended, seen from its connection alone: None while it is
        connected (or never was); the exit code it said it was ending itself with; else
        ``killed`` (a process that said nothing died of something: a signal, its node)."""
        peer = self.peer(slot)
        if peer is None or peer.lost_t is None:
            return None
        return killed if peer.said_exit is None else peer.said_exit

    def beats(self, slot: str) -> int | None:
        """Lines the slot's process sent over its connection (beats, and step records, which
        stand in for beats); None while it has none (a process that beats through the store,
        or not connected yet)."""
        peer = self.peer(slot)
        return peer.beats if peer is not None and peer.lost_t is None else None

    def take_steps(self) -> dict[tuple[int, str], list[StepRecord]]:
        """(generation, slot) -> the step records that came since the last call, each handed out
        once: a reader's look costs what is new, not one lookup per rank (at 4,096 ranks, 1,000
        lines a second came among 4,096 slots asked after twice a second)."""
        with self._lock:
            fresh, self._fresh = self._fresh, {}
        return fresh

    def unlinked(self, slots: Iterable[str]) -> list[str]:
        """Those of ``slots`` that never proved a connection: their steps are in the store."""
        with self._lock:
            return [s for s in slots if s not in self._peers]

    def announce(self, kind: str, number: int = 0, detail: str = "") -> int:
        """Tell every connected rank (a hint: they read the store for the truth); returns to how
        many it was written. Never blocks: a connection that cannot take a short line whole is
        not written to again. ``detail`` follows the number (a plan's change: :data:`link.PLANNED`)."""
        assert kind in link.DOWN, kind
        assert "\n" not in detail and len(detail) <= link.CHANGE_IN_NOTICE_MAX, len(detail)
        payload = f"{number} {detail}" if detail else str(number)
        with self._lock:
            links = [(conn, state) for conn, state in self._links.items() if not state.mute]
        said = 0
        for first in range(0, len(links), ANNOUNCE_CHUNK):
            with self._lock:
                said += sum(
                    self._said(conn, state, kind, payload)
                    for conn, state in links[first : first + ANNOUNCE_CHUNK]
                )
        return said

    def _say(self, conn: socket.socket, state: _Link, kind: str, payload: str) -> bool:
        with self._lock:
            return self._said(conn, state, kind, payload)

    def _said(self, conn: socket.socket, state: _Link, kind: str, payload: str) -> bool:
        """Write one line down ``conn`` whole, or mark it mute; the caller holds the lock. Numbered
        and sent under the lock: the serving thread's echoes and the supervisor's notices share the
        sequence, and a line sent after a higher-numbered one would be refused by the rank as a
        replay."""
        if state.mute:
            return False
        state.said += 1
        data = link.line(self._key, state.slot, state.said, kind, payload)
        try:
            whole = conn.send(data) == len(data)
        except OSError:
            whole = False
        state.mute = not whole
        return whole

    def take_lost(self) -> list[str]:
        """Slots whose connection closed since the last call (their process ended, or is ending)."""
        with self._lock:
            lost, self._lost_since = self._lost_since, []
        return lost

    def take_dropped(self) -> list[str]:
        """Why each connection closed since the last call was refused (at most the last 100)."""
        with self._lock:
            out = list(self._dropped)
            self._dropped.clear()
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for key in list(self._selector.get_map().values()):
            _socket(key).close()
        self._selector.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            ready = self._selector.select(timeout=0.05)
            for key, _ in ready:
                conn = _socket(key)
                if conn is self._sock:
                    self._accept()
                    continue
                try:
                    self._read(key, conn)
                except Exception as err:  # our bug: that connection goes, the server stays
                    self._drop(conn, f"dropped on an error of sres: {type(err).__name__}: {err}")
            if ready:
                self._stop.wait(GATHER_S)

    def _read(self, key: selectors.SelectorKey, conn: socket.socket) -> None:
        try:
            data = conn.recv(MAX_HELLO if key.data is None else link.MAX_LINE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._lost(key, conn)
        elif key.data is None:
            self._hello(conn, data)
        else:
            self._lines(conn, data)

    def _lines(self, conn: socket.socket, data: bytes) -> None:
        """A proven rank's heartbeats and step records; a line that is not one is dropped."""
        state = self._links[conn]
        state.buffer += data
        while b"\n" in state.buffer:
            raw, state.buffer = state.buffer.split(b"\n", 1)
            got = link.parse(self._key, state.slot, raw, link.UP, state.heard)
            if got is None:
                with self._lock:
                    self._dropped.append(f"a line from {state.slot} that is not one of its own")
                continue
            state.heard = got.seq
            with self._lock:  # any of its lines proves the process is not hung
                self._peers[state.slot].beats += 1
            if got.kind == link.STEPS:
                self._took_steps(state.slot, got.payload)
            elif got.kind == link.WROTE and got.payload in self._rung:
                with self._lock:
                    self._rung[got.payload] += 1
            elif got.kind == link.EXITING and got.payload.lstrip("-").isdigit():
                with self._lock:
                    self._peers[state.slot].said_exit = int(got.payload)
        now = self.clock()
        if state.heard and now - state.echoed_t >= ECHO_EVERY_S:  # renews the rank's lease
            state.echoed_t = now
            self._say(conn, state, link.ECHO, str(state.heard))
        if len(state.buffer) > link.MAX_LINE:
            self._drop(conn, f"a line from {state.slot} longer than {link.MAX_LINE} bytes")

    def _took_steps(self, slot: str, payload: str) -> None:
        generation, _, records = payload.partition(" ")
        try:
            key, new = (int(generation), slot), RecentSteps.decode(records).records
        except (ValueError, TypeError) as err:  # signed, so ours: a bug, not a reason to drop the rank
            with self._lock:
                self._dropped.append(f"step records from {slot} that do not read: {err}")
            return
        with self._lock:
            kept = self._fresh.setdefault(key, [])
            kept += new
            del kept[:-KEEP_STEPS]

    def _accept(self) -> None:
        try:
            client, address = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return  # e.g. out of file descriptors: the next try may succeed
        challenge = run_secret.new_challenge()
        try:
            client.sendall(f"{GREETING} {challenge}\n".encode())  # a fresh socket's buffer takes it
            client.setblocking(False)
        except OSError:
            client.close()
            return
        now = self.clock()
        for conn in [c for c, p in self._pending.items() if now - p.since > HELLO_TIMEOUT_S]:
            self._drop(conn, f"no hello within {HELLO_TIMEOUT_S:g} s")
        if len(self._pending) >= MAX_PENDING:
            self._drop(
                next(iter(self._pending)), f"too many unproven connections (the newest from {address[0]})"
            )
        self._pending[client] = _Pending(challenge, now)
        self._selector.register(client, selectors.EVENT_READ, data=None)

    def _hello(self, conn: socket.socket, data: bytes) -> None:
        pending = self._pending[conn]
        pending.buffer += data
        if b"\n" not in pending.buffer:
            if len(pending.buffer) > MAX_HELLO:
                self._drop(conn, "hello longer than a hello")
            return
        line = pending.buffer.split(b"\n", 1)[0]
        parts = line.decode("ascii", errors="replace").split(" ")
        if len(parts) != 3 or not slots.NAME.fullmatch(parts[0]) or not _STEP.fullmatch(parts[1]):
            self._drop(conn, "not a hello")
            return
        slot, step, answer = parts
        if not run_secret.verify(self.secret, pending.challenge, answer, slot, step):
            self._drop(conn, f"hello for {slot} without the run's secret")
            return
        accepted = link.line(self._key, slot, 1, link.ACCEPTED)
        try:
            if conn.send(accepted) != len(accepted):
                raise OSError("the acceptance did not fit")
        except OSError as err:
            self._drop(conn, f"hello for {slot} could not be answered: {err}")
            return
        del self._pending[conn]
        self._selector.modify(conn, selectors.EVENT_READ, data=slot)
        with self._lock:
            self._peers[slot] = Peer(slot, step, self.clock())
            self._links[conn] = _Link(slot, said=1)
        rest = pending.buffer.split(b"\n", 1)[1]
        if rest:  # its first heartbeat may come in the same read
            self._lines(conn, rest)

    def _drop(self, conn: socket.socket, why: str) -> None:
        self._pending.pop(conn, None)
        with self._lock:
            was = self._links.pop(conn, None)
            if was is not None:  # a rank's own connection: closing it is losing the rank
                self._peers[was.slot].lost_t = self.clock()
                self._lost_since.append(was.slot)
        if conn.fileno() >= 0 and conn in {key.fileobj for key in self._selector.get_map().values()}:
            self._selector.unregister(conn)
        conn.close()
        with self._lock:
            self._dropped.append(why)

    def _lost(self, key: selectors.SelectorKey, conn: socket.socket) -> None:
        self._selector.unregister(conn)
        self._pending.pop(conn, None)
        conn.close()
        if key.data is not None:
            with self._lock:
                self._links.pop(conn, None)
                self._peers[key.data].lost_t = self.clock()
                self._lost_since.append(key.data)


def _socket(key: selectors.SelectorKey) -> socket.socket:
    """The socket ``key`` was registered with: this selector holds sockets only."""
    assert isinstance(key.fileobj, socket.socket), key.fileobj
    return key.fileobj
