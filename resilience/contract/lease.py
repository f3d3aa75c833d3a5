"""A rank's lease from the supervisor: how long it may still act as a member of its run.

A rank cut off from the supervisor (a NIC down, a switch port gone, one direction dropped) is
alive and still believes it is in the current generation; meanwhile the supervisor, hearing
nothing, replaces it. The lease bounds how long it may believe so. Every line the rank sends
up its liveness connection has a sequence number; the supervisor echoes the newest it read,
and the rank extends its lease to *the time it sent that line* plus the lease length. Both ends
of that sum are the rank's own monotonic clock: no clock skew between machines enters, and an
echo that sat in a buffer through a partition (or a SIGSTOP) renews nothing, since the line it
answers was sent long ago.

The lease is shorter than the supervisor's silence limit (three quarters of the hang timeout:
:func:`lease_s`), so a cut-off rank has stopped writing before the supervisor decides to replace
it; the generation carried by what it wrote before (the run's progress, the tiers' manifests, the
neighbour copies' headers, flush requests) covers a write already in flight.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import NoReturn

from resilience.contract.messages import FENCED_EXIT
from resilience.errors import Fenced

KEEP_SENT = 4096
"""Send times remembered (by sequence number): far more lines than a lease's worth."""


LEASE_OF_HANG = 0.75
"""The lease's share of the hang timeout. Any share below 1 fences a cut-off rank before the
supervisor calls it silent (its last echoed line was sent no later than the supervisor's last
hearing of it); the rest is the margin before its replacement can write. Not lower: a rank
whose heartbeat thread is starved (a loaded machine, a long collective holding the GIL) for the
lease ends itself, and at half the tests' 3 s hang timeout that was 1.5 s of starvation."""


def lease_s(hang_timeout_s: float) -> float:
    """The lease length for a run whose supervisor replaces a silent rank after ``hang_timeout_s``."""
    return hang_timeout_s * LEASE_OF_HANG


class Lease:
    """Until when this process may act for its run (its own monotonic clock)."""

    def __init__(self, length_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if length_s <= 0:
            raise ValueError(f"a lease needs a positive length, not {length_s}")
        self.length_s, self.clock = length_s, clock
        self._lock = threading.Lock()
        self._sent: deque[tuple[int, float]] = deque(maxlen=KEEP_SENT)
        self._until = clock() + length_s
        """Granted at the hello's acceptance, which the supervisor answered just now."""
        self._last_echo: float | None = None

    def sent(self, seq: int, t: float) -> None:
        with self._lock:
            self._sent.append((seq, t))

    def echoed(self, seq: int) -> None:
        """The supervisor read this process's line ``seq``: extend to when it was sent + length."""
        with self._lock:
            self._last_echo = self.clock()
            while self._sent and self._sent[0][0] < seq:
                self._sent.popleft()
            if self._sent and self._sent[0][0] == seq:
                self._until = max(self._until, self._sent[0][1] + self.length_s)

    def left_s(self) -> float:
        with self._lock:
            return self._until - self.clock()

    def expired(self) -> bool:
        return self.left_s() <= 0

    def check(self, what: str) -> None:
        """Raise :class:`Fenced` instead of doing ``what`` once the lease has run out."""
        if self.expired():
            raise Fenced(f"{self.account()}: refused to {what}")

    def account(self) -> str:
        """Why the lease ran out, in words that tell a cut link from a starved process: lines
        sent lately but no echo read points at the link or the supervisor; no line sent for as
        long as the lease points at this process (its threads not scheduled, a stop)."""
        with self._lock:
            # an echo drops only older lines: the newest line sent is always the last one kept
            sent = self._sent[-1][1] if self._sent else None
            now, until, echo = self.clock(), self._until, self._last_echo

        def ago(t: float | None) -> str:
            return "never" if t is None else f"{now - t:.1f} s ago"

        silent = self.length_s + now - until
        return (
            f"no word from the supervisor for {silent:.1f} s (lease {self.length_s:g} s; "
            f"last line sent {ago(sent)}, last echo read {ago(echo)})"
        )


def fence(why: str) -> NoReturn:
    """End this process now, without another write, saying why in one line. ``os._exit``: no
    handler, ``finally`` or atexit of the user's code may write after the lease ran out; the
    supervisor reads :data:`FENCED_EXIT` as a fenced rank, not as a crash of its code."""
    with contextlib.suppress(OSError):
        os.write(2, f"sres: {why}: fenced, exiting without another write\n".encode())
    os._exit(FENCED_EXIT)
