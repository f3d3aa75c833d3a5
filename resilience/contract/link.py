"""A rank's liveness connection as its control channel, both ways: heartbeats, step times and
doorbells (a report or an event written to the store) up to the supervisor, notices of a new
plan, a pause or the run's end down to the rank.

At thousands of ranks the run's one store cannot carry what every rank says every half second
(a heartbeat, a look for a newer plan, its step times: about 12 requests a second a rank, 49,000
at 4,096 ranks). Each rank already holds one TCP connection to the supervisor for its life (the
liveness connection, proven with the run's secret at its hello); what is periodic goes over it,
and the store keeps what must be shared and durable (plans, reports, join counts, state).

A notice or a doorbell is a hint, never the truth: a rank woken by one still reads the plan from
the store (sealed), the supervisor rung by one reads the reports there, and without a connection
(tests' bare stores) everything works by polling as before.
Every line is ``<kind> <seq> <mac> <payload>``: an HMAC under a key derived from the run's secret,
bound to the slot, the direction's sequence number (which must grow) and the kind, so no line is
accepted twice, from the other direction, or for another slot. Nothing is unpickled: payloads are
numbers or a message's JSON.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import threading
import time
from dataclasses import dataclass

from resilience.contract.lease import Lease
from resilience.contract.messages import RecentSteps

BEAT, STEPS, WROTE, EXITING = "b", "t", "w", "x"
"""Up, rank to supervisor: a heartbeat; new step records (``<generation> <RecentSteps JSON>``); it
wrote a report or an event to the store (``report`` or ``event``: the supervisor reads the store's
counter of them when told, not every tick); it is ending itself with this exit code (its last
line: under Slurm the supervisor sees the connection close before srun reports the code)."""
DOORBELLS = ("report", "event")
PLANNED, PAUSE, SHUTDOWN, ECHO = "g", "p", "s", "e"
"""Down, supervisor to rank: generation G was planned (``<G>``, or ``<G> <PlanChange JSON>``: what
changed since G-1, so that a rank holding G-1 reads nothing from the store); a pause of G was
asked; the run is over; the newest of the rank's lines it read (its sequence number: the rank's
lease, :mod:`resilience.contract.lease`)."""
CHANGE_IN_NOTICE_MAX = 4096
"""A plan's change rides in its notice up to this many bytes (a node fault's at 8 ranks a node:
about 650); a larger one (an elastic resize) is read from the store. Small, because a notice
that a connection cannot take whole mutes that connection."""
ACCEPTED = "a"
"""Down, once, the first line: the hello was proven (a rank whose hello is refused learns it at once)."""
UP, DOWN = frozenset((BEAT, STEPS, WROTE, EXITING)), frozenset((PLANNED, PAUSE, SHUTDOWN, ECHO))
BEATS_PER_S = 1024
"""Heartbeats a second the supervisor is sent at most, all ranks together: past 512 ranks at the
default half second, each rank beats less often (:func:`beat_period`). A beat only proves that a
process is not hung (a death closes the connection, seen within a tick), and at 4,096 ranks
beating every half second the supervisor spent 40% of a core reading beats."""
MAX_LINE = 64 * 1024
"""Longer than any line a rank sends (64 step records are about 6 KiB)."""
_MAC_HEX = 32


def beat_period(heartbeat_s: float, processes: int, hang_timeout_s: float) -> float:
    """Seconds between a rank's beats in a run of ``processes`` rank processes: ``heartbeat_s``,
    or longer where that would send more than :data:`BEATS_PER_S`; never longer than a quarter
    of the hang timeout, so a hung rank is still killed after the hang timeout (give it a longer
    hang timeout past ~7,000 ranks for fewer beats than that)."""
    return max(heartbeat_s, min(processes / BEATS_PER_S, hang_timeout_s / 4))


def link_key(secret: str) -> bytes:
    """The MAC key of link lines: derived, so the run's secret itself signs nothing here."""
    return hmac.new(bytes.fromhex(secret), b"sres liveness link", hashlib.sha256).digest()


def _mac(key: bytes, slot: str, seq: int, kind: str, payload: str) -> str:
    message = f"{slot}\0{seq}\0{kind}\0{payload}".encode()
    return hmac.digest(key, message, "sha256").hex()[:_MAC_HEX]  # one call in C: ~2 us less a line


def line(key: bytes, slot: str, seq: int, kind: str, payload: str = "") -> bytes:
    return f"{kind} {seq} {_mac(key, slot, seq, kind, payload)} {payload}\n".encode()


@dataclass(frozen=True)
class Line:
    kind: str
    seq: int
    payload: str


def parse(key: bytes, slot: str, raw: bytes, kinds: frozenset[str], after: int) -> Line | None:
    """``raw`` (one line, without its newline) as a line of ``kinds`` newer than sequence number
    ``after``, or None when it is not one: malformed, another direction's, replayed, forged."""
    parts = raw.decode("ascii", errors="replace").split(" ", 3)
    if len(parts) != 4 or parts[0] not in kinds or not parts[1].isdigit() or len(parts[1]) > 18:
        return None
    kind, seq, mac, payload = parts[0], int(parts[1]), parts[2], parts[3]
    if seq <= after or not hmac.compare_digest(_mac(key, slot, seq, kind, payload), mac):
        return None
    return Line(kind, seq, payload)


class Notices:
    """What the supervisor announced to this rank, and a wait for the next announcement."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self.planned = 0
        """The newest generation announced (0: none yet)."""
        self.change: tuple[int, str] | None = None
        """The newest announced plan's change from the one before it (generation, its JSON), when
        its notice carried it."""
        self.paused: set[int] = set()
        self.shut_down = False
        self.version = 0
        """Bumped by every notice (and :meth:`poke`): what :meth:`wait_change` waits on."""

    def heard(self, notice: Line) -> None:
        with self._changed:
            self.version += 1
            if notice.kind == PLANNED:
                number, _, change = notice.payload.partition(" ")
                if int(number) > self.planned:
                    self.planned = int(number)
                    self.change = (self.planned, change) if change else None
            elif notice.kind == PAUSE:
                self.paused.add(int(notice.payload))
            elif notice.kind == SHUTDOWN:
                self.shut_down = True
            self._changed.notify_all()

    def wait(self, past: int, timeout_s: float) -> None:
        """Until a generation after ``past`` is announced, or the run's end, or ``timeout_s``."""
        with self._changed:
            self._changed.wait_for(lambda: self.planned > past or self.shut_down, timeout_s)

    def wait_change(self, seen: int, timeout_s: float) -> None:
        """Until a notice after version ``seen`` (or a :meth:`poke`), or ``timeout_s``: the
        heartbeat's sleep, which a new plan ends at once instead of at its next poll."""
        with self._changed:
            self._changed.wait_for(lambda: self.version != seen, timeout_s)

    def poke(self) -> None:
        with self._changed:
            self.version += 1
            self._changed.notify_all()

    def change_to(self, generation: int) -> str | None:
        """Plan ``generation``'s change from the one before it, as its notice carried it (JSON)."""
        with self._changed:
            change = self.change
        return change[1] if change is not None and change[0] == generation else None

    def pause_asked(self, generation: int) -> bool:
        with self._changed:
            return generation in self.paused


class RankLink:
    """This process's end of its liveness connection, after the hello."""

    def __init__(self, sock: socket.socket, secret: str, slot: str, lease_s: float | None = None) -> None:
        self.sock, self.slot = sock, slot
        self.lease = Lease(lease_s) if lease_s else None
        """Renewed by the supervisor's echoes of this process's lines; None: never runs out."""
        self._key = link_key(secret)
        self._send_lock = threading.Lock()
        self._sent = 0
        self._sent_t = 0.0
        self._heard = 1  # the acceptance, read by hello.announce
        self.notices = Notices()

    def beat(self) -> None:
        self._send(BEAT, "")

    def quiet_for(self) -> float:
        """Seconds since this process last sent a line: any line proves it is not hung, so a
        beat is due only after a period of silence (step records stand in for beats)."""
        return time.monotonic() - self._sent_t

    def steps(self, generation: int, steps: RecentSteps) -> None:
        self._send(STEPS, f"{generation} {steps.encode()}")

    def wrote(self, what: str) -> None:
        """Ring the supervisor's doorbell for ``what`` (one of :data:`DOORBELLS`) just written to
        the store. Best effort: a closed connection is this process's death, seen anyway."""
        assert what in DOORBELLS, what
        try:
            self._send(WROTE, what)
        except OSError:
            pass

    def exiting(self, code: int) -> None:
        """Say this process is about to ``os._exit(code)``: a deliberate exit (a rank stuck in an
        ended generation) is then not taken for a kill. Best effort, like :meth:`wrote`."""
        try:
            self._send(EXITING, str(code))
        except OSError:
            pass

    def _send(self, kind: str, payload: str) -> None:
        with self._send_lock:
            self._sent += 1
            now = time.monotonic()
            if self.lease is not None:
                self.lease.sent(self._sent, now)
            self.sock.sendall(line(self._key, self.slot, self._sent, kind, payload))
            self._sent_t = now

    def listen(self) -> None:
        """Read the supervisor's notices until its end of the connection closes (returns then)."""
        buffer = b""
        self.sock.settimeout(None)
        while True:
            try:
                data = self.sock.recv(4096)
            except OSError:
                return
            if not data:
                return
            buffer += data
            while b"\n" in buffer:
                raw, buffer = buffer.split(b"\n", 1)
                notice = parse(self._key, self.slot, raw, DOWN, self._heard)
                if notice is None:  # it cannot be the supervisor's: ignored
                    continue
                self._heard = notice.seq
                if notice.kind != ECHO:
                    self.notices.heard(notice)
                elif self.lease is not None and notice.payload.isdigit():
                    self.lease.echoed(int(notice.payload))
            if len(buffer) > MAX_LINE:
                buffer = b""
