"""The heartbeat thread of a rank, and the generation it watches.

The heartbeat tells the supervisor this process is alive; between beats it watches for a
newer plan and, when one appears while the main thread is still inside the old generation,
releases the main thread from its blocked collective (see :mod:`resilience.agent.abort`). The
process ends itself when it stays stuck in a released generation, or when the supervisor's end
of its liveness connection closes (the supervisor is gone: no plan will come).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time

import torch.distributed as dist

from resilience.agent.abort import GroupSockets, release
from resilience.contract.link import RankLink
from resilience.contract.lease import fence
from resilience.contract.messages import STUCK_EXIT
from resilience.contract.run_store import RunStore

log = logging.getLogger("resilience")


class GenerationWatch:
    """The generation this process is in, and how to leave it in a hurry.

    Shared by the main thread (enter/leave) and the heartbeat thread, which releases the
    main thread from a blocked collective as soon as the supervisor publishes a newer plan.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.generation = 0
        self._backend = "gloo"
        self._sockets: GroupSockets | None = None
        self._groups: list[dist.ProcessGroup] = []
        self._released_at: float | None = None
        self.joining = 0
        """The generation whose join barrier the main thread waits in (0: none): a newer plan
        ends that wait too."""

    def enter(
        self, generation: int, backend: str, sockets: GroupSockets, groups: list[dist.ProcessGroup]
    ) -> None:
        with self._lock:
            self.generation, self._backend, self._sockets, self._groups = generation, backend, sockets, groups
            self._released_at = None

    def leave(self) -> None:
        """Forget the generation's groups. The stuck clock restarts now and runs until
        :meth:`left`: destroying the groups must end within the grace too, since a shutdown
        that never returned would leave every peer waiting for this rank at the next join."""
        with self._lock:
            self._sockets, self._groups, self._released_at = None, [], time.monotonic()

    def left(self) -> None:
        with self._lock:
            self._released_at = None

    def release_now(self, generation: int) -> bool:
        """Release the main thread from ``generation``, if it is still in it. The generation is
        checked under the lock: the heartbeat read it before asking the store for a newer plan,
        and the main thread may have entered that newer one meanwhile; releasing then shut the
        new generation's sockets down during its formation (CI: gloo's connectFullMesh failed
        with "Connection closed by peer" in the generation after a resize or a replacement)."""
        with self._lock:
            if self.generation != generation or self._released_at is not None or self._sockets is None:
                return False
            self._released_at = time.monotonic()
            release(self._backend, self._sockets, self._groups)
            return True

    def released(self) -> bool:
        """Whether the heartbeat thread ended this generation under the main thread."""
        with self._lock:
            return self._released_at is not None

    def stuck_for(self) -> float:
        """Seconds since this generation was released while the main thread is still in it."""
        with self._lock:
            return 0.0 if self._released_at is None else time.monotonic() - self._released_at


class Heartbeat:
    """Tells the supervisor this process is alive, and watches for the end of its generation.

    The heartbeat is a line on the liveness connection (a value in the store without one). A
    hung process (stopped, or stuck holding the GIL) stops sending it; the supervisor then kills
    it after the hang timeout, which turns a hang into an ordinary process fault. When the
    supervisor is gone (its end of the liveness connection closed) the process exits at once.
    The supervisor's notice of a newer plan wakes the thread (without a connection it polls the
    store between beats): while this process still runs the old generation, or waits in its join
    barrier, it releases the main thread (see :mod:`resilience.agent.abort`).
    """

    POLL_S = 0.1
    RELEASE_GRACE_S = 2.0
    """A rank still inside a released generation after this long exits (seen once in CI: a gloo
    wait that spun at 100% CPU after its sockets were shut down). The supervisor sees a
    process fault and restarts it; its state comes from peers. Progress is guaranteed."""

    def __init__(
        self,
        store: RunStore,
        own: RunStore,
        slot: str,
        period_s: float,
        watch: GenerationWatch,
        link: RankLink | None = None,
    ) -> None:
        self.store = own
        """The beat thread's own connection (``store.clone()``), made by the caller before the
        hello grants the lease: a new connection can wait seconds on a nameserver (torch's client
        looks up the name of the address it connects to), and made between the hello and
        :meth:`start` that wait ran the lease out before the first beat."""
        self.main_store = store
        """The main thread's connection: a release wakes it from a wait in the ended rendezvous."""
        self.link = link
        """This process's liveness connection: beats go up it, notices come down, and the
        supervisor's end closes when it dies. None: beats go to the store, plans are polled."""
        self.period_s = period_s
        self.watch = watch
        self._stop = threading.Event()
        self.preempted = threading.Event()
        self.reclaimed = threading.Event()
        self.slot = slot
        self._thread = threading.Thread(target=self._beat, name="sres-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if self.link is not None:
            threading.Thread(target=self._watch_supervisor, name="sres-supervisor-link", daemon=True).start()
        if self.link is not None and self.link.lease is not None:
            threading.Thread(target=self._fence_when_cut_off, name="sres-lease", daemon=True).start()

    def _fence_when_cut_off(self) -> None:
        """End this process once its lease runs out: cut off from the supervisor (a partition, a
        dropped direction, a long stop) it may already have been replaced, and a partition must
        heal into one run, never two. Its own thread: the beat may block on a full socket, the
        main thread in a collective. Writes on other threads ask the lease too (the store's
        guard, the tiers): between its expiry and this exit they are refused, not made."""
        assert self.link is not None and self.link.lease is not None
        lease = self.link.lease
        while not self._stop.wait(min(max(lease.left_s(), 0.0), self.POLL_S)):
            if lease.expired():
                fence(f"cut off from the supervisor: {lease.account()}")

    def stop(self) -> None:
        self._stop.set()
        if self.link is not None:
            self.link.notices.poke()
        self._thread.join(timeout=5)

    def _watch_supervisor(self) -> None:
        """Read the supervisor's notices, and exit when its end of the liveness connection closes.
        A store call would notice too, but only after its client's reconnect attempts: the ranks
        of a SIGKILLed supervisor (an out-of-memory kill) kept training for no one for 30-40 s,
        holding their GPUs."""
        assert self.link is not None
        self.link.listen()
        if not self._stop.is_set():
            with contextlib.suppress(OSError):
                os.write(2, b"sres: the supervisor is gone (its liveness connection closed): exiting\n")
            os._exit(3)

    def _planned_after(self, generation: int) -> bool:
        """Whether a generation after ``generation`` was planned: what the supervisor announced
        (no request), or the store where there is no connection to announce it."""
        if self.link is not None:
            return self.link.notices.planned > generation
        return self.store.plans.has(generation + 1)

    def _beat(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            seen = self.link.notices.version if self.link is not None else 0
            try:
                now = time.monotonic()
                if now >= next_beat:
                    if self.link is None:
                        self.store.liveness.beat(self.slot)
                    elif self.link.quiet_for() >= self.period_s / 2:  # else a step record beat for it
                        self.link.beat()
                    next_beat = now + self.period_s
                if self.preempted.is_set():
                    self.store.signals.mark_preempted(self.slot)
                    self.preempted.clear()
                if self.reclaimed.is_set():
                    self.store.signals.report_reclaimed(self.slot)
                    self.reclaimed.clear()
                joining = self.watch.joining
                if joining and self._planned_after(joining):
                    self.store.plans.end_join_wait(joining, self.main_store.plans)
                generation = self.watch.generation
                if generation and self._planned_after(generation):
                    if self.watch.release_now(generation):
                        log.info("generation %d ended: released this rank", generation)
                    if self.watch.released():
                        self.store.plans.end_group_waits(generation, self.main_store.plans)
                if self.watch.stuck_for() > self.RELEASE_GRACE_S:
                    sys.stderr.write(
                        f"sres: rank stuck in ended generation {generation} for "
                        f"{self.RELEASE_GRACE_S:g} s after its release; exiting to be restarted; "
                        f"where each thread was:\n"
                    )
                    sys.stderr.flush()
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                    if self.link is not None:  # else, under Slurm, it reads as a kill
                        self.link.exiting(STUCK_EXIT)
                    os._exit(STUCK_EXIT)
            except Exception:  # noqa: BLE001 - the store is gone: the supervisor ended
                if not self._stop.is_set():
                    os._exit(3)
                return
            if self.link is not None:  # woken by the supervisor's notice of a new plan, or every beat
                self.link.notices.wait_change(seen, min(self.period_s, self.RELEASE_GRACE_S / 4))
            else:
                self._stop.wait(self.POLL_S)
