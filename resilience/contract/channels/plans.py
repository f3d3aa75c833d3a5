"""Generations and their plans: the supervisor writes who holds which rank, ranks wait, join,
pause and learn that the run is over.

Every (re-)formation of the job is a *generation* G with a :class:`~resilience.contract.messages.Plan`.
The world size is a field of the plan, so a later generation may have another size (elastic).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch.distributed as dist

from resilience.contract import keys, link
from resilience.contract.link import Notices
from resilience.contract.messages import Plan, PlanChange
from resilience.contract.store_core import Channel, StoreCore

WAKE_CHECK_S = 2.0
"""A rank woken by notices still looks at the store this often while it waits (a notice that
could not be written to it, a supervisor that announces nothing)."""
JOIN_WAIT_S = 5.0
"""One blocking wait of the join barrier; a newer plan ends it early (the heartbeat wakes it)."""
PAUSE_CHECKS_PER_STEP = 512
"""At most this many ranks look for a pause request at a step (:func:`pause_check_every`)."""


def pause_check_every(world_size: int) -> int:
    """Steps between a rank's looks for a pause: every step up to 512 ranks, then fewer, so that
    the store answers at most ~512 such requests a step (every rank looks at the same steps, and
    the boundary is the next of them, so a pause still stops every rank before the same step)."""
    return max(1, math.ceil(world_size / PAUSE_CHECKS_PER_STEP))


class PlanChannel(Channel):
    """Only the supervisor writes plans, shutdown and pauses; ranks read them.

    The supervisor's channel also announces each of them over the ranks' liveness connections
    (:attr:`announce`), and a rank's channel waits on what it heard (:attr:`notices`) instead of
    polling the store; both are None where there is no such connection."""

    def __init__(self, core: StoreCore) -> None:
        super().__init__(core)
        self.announce: Callable[[str, int, str], int] | None = None
        self.notices: Notices | None = None
        self._held: Plan | None = None
        """The newest plan this channel read: plan G+1 is read as its change from it."""

    def _announce(self, kind: str, number: int, detail: str = "") -> None:
        if self.announce is not None:
            self.announce(kind, number, detail)

    def publish(self, plan: Plan, base: Plan | None = None) -> None:
        """Plan G, and its change from ``base`` (G-1) before it: whoever sees the plan's key can
        read the change (:meth:`get`). A small change also rides in G's notice, so that a rank
        holding G-1 learns G without a request (three a rank fewer on a recovery's path)."""
        detail = ""
        if base is not None and base.generation == plan.generation - 1:
            change = self._core.put(keys.plan_change(plan.generation), PlanChange.between(base, plan))
            detail = change if len(change) <= link.CHANGE_IN_NOTICE_MAX else ""
        self._core.put(keys.plan(plan.generation), plan)
        self._announce(link.PLANNED, plan.generation, detail)

    def get(self, generation: int) -> Plan | None:
        """Plan G: from its change where this channel holds G-1 (O(changes) to read, not O(N)),
        the change as G's notice carried it or else from the store; else whole. A change that does
        not open is passed over for the whole plan."""
        held = self._held
        if held is not None and held.generation == generation - 1:
            change = self._heard_change(generation)
            if change is None:
                change = self._core.get(keys.plan_change(generation), PlanChange)
            if change is not None and change.generation == generation:
                return self._hold(change.apply(held))
        plan = self._core.get(keys.plan(generation), Plan)
        return self._hold(plan) if plan is not None else None

    def _heard_change(self, generation: int) -> PlanChange | None:
        """G's change as its notice carried it (signed by the supervisor, like every notice)."""
        text = self.notices.change_to(generation) if self.notices is not None else None
        return self._core.parse(text, PlanChange) if text else None

    def _hold(self, plan: Plan) -> Plan:
        if self._held is None or plan.generation > self._held.generation:
            self._held = plan
        return plan

    def has(self, generation: int) -> bool:
        """Whether generation G was planned: a rank of G-1 checks for G to know G-1 ended."""
        return self._core.has(keys.plan(generation))

    def _newest_key(self, after: int) -> int:
        """The newest generation whose plan key is set, without reading the plans (a plan holds
        every member: read by every rank, it is O(N) bytes each, so it is read once, below). A
        generation announced to this rank is known to be set (its key is written before its
        notice): only the ones after it are asked for."""
        if self.notices is not None and self.notices.planned > after:
            after = self.notices.planned
        while self._core.exists(keys.plan(after + 1)):
            after += 1
        return after

    def newest_plan(self, after: int = 0) -> tuple[int, Plan | None]:
        """The newest plan after ``after`` that reads, and its generation (``after``, None: none).
        A newer key whose value does not open (another user wrote it, or replayed one of an earlier
        run) is passed over for the older real one: a run whose second plan key was replayed from
        its previous run waited for it forever (tests/security/test_ports.py)."""
        newest = self._newest_key(after)
        while newest > after:
            plan = self.get(newest)
            if plan is not None:
                return newest, plan
            newest -= 1
        return after, None

    def wait_for(self, slot: str, after: int, poll_s: float = 0.02) -> Plan | None:
        """Block until a generation after ``after`` includes ``slot``; None on shutdown.

        Always the newest such generation: a process that starts late (a cold respawn) must not
        join a generation that a later fault has already ended. Generations that do not include
        this slot (a spare not yet needed) are passed over; a plan that does not read (written by
        someone else) is not: the real one may replace it.
        """
        while True:
            newest, plan = self.newest_plan(after)
            if plan is not None and plan.rank_of(slot) is not None:
                return plan
            if plan is not None:
                after = newest
            if self.is_shut_down():
                return None
            if self.notices is not None:
                self.notices.wait(newest, WAKE_CHECK_S)
            else:
                time.sleep(poll_s)

    def join(self, plan: Plan, timeout_s: float, poll_s: float = 0.005) -> bool:
        """Wait until every member of ``plan`` has joined; False if a newer plan supersedes it;
        TimeoutError after ``timeout_s`` (the rank reports it, and the supervisor recovers).

        ``init_process_group`` would block until its timeout for a member that will never come
        (it died after the plan was made); this barrier notices the newer plan instead (the
        heartbeat ends the wait: :meth:`end_join_wait`). The last member to arrive sets a key
        every other one waits on in the store (two requests a rank, none of them polled; three
        without notices). The count is an unsigned counter anyone who reaches the store can
        move, and the key anyone can set: a negative ``add`` once held a re-formation forever,
        hence the deadline; a count pushed up early, or the key set early, only hands the wait
        to torch's rendezvous, which is signed. So a rank that hears notices takes a wake for
        the last arrival unless a newer plan was announced (the heartbeat ends a wait only
        then), and asks the count only where it has no notices: 4,095 requests fewer in the
        barrier's release at 4,096 ranks, where each came after the wake.
        """
        generation = plan.generation
        if self._core.add(keys.join(generation)) >= plan.world_size:
            self._core.flag(keys.joined(generation))
            return True
        deadline = time.monotonic() + timeout_s
        while True:
            if self._announced_after(generation):  # before the wait: that notice may be older
                return False
            woken = self._core.wait(
                keys.joined(generation), min(JOIN_WAIT_S, max(0.0, deadline - time.monotonic()))
            )
            if woken and self.notices is not None and not self._announced_after(generation):
                return True
            if self._core.count(keys.join(generation)) >= plan.world_size:
                return True
            if self._superseded(generation):
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(f"generation {generation}: not every rank joined within {timeout_s:g} s")
            if woken:
                time.sleep(poll_s)  # set early (by someone else) or ended: do not spin on it

    def _announced_after(self, generation: int) -> bool:
        notices = self.notices
        return notices is not None and (notices.planned > generation or notices.shut_down)

    def _superseded(self, generation: int) -> bool:
        return self._announced_after(generation) or self.has(generation + 1) or self.is_shut_down()

    def end_join_wait(self, generation: int, of: "PlanChannel") -> int:
        """Wake ``of``'s thread from its wait in generation ``generation``'s join barrier, which a
        newer plan ended (the key it waits on is set to a value nobody reads)."""
        return self._core.end_waits(keys.joined(generation), of._core)

    def group_store(self, generation: int) -> dist.Store:
        """The store that generation G's process groups rendezvous on (torch's own keys)."""
        return self._core.prefixed(keys.pg_prefix(generation))

    def end_group_waits(self, generation: int, of: "PlanChannel") -> int:
        """Wake ``of``'s thread (the main thread's connection; this one is another thread's) from
        a wait in generation ``generation``'s rendezvous, which a newer plan ended."""
        return self._core.end_waits(keys.pg_prefix(generation), of._core)

    def shut_down(self) -> None:
        self._core.flag(keys.SHUTDOWN)
        self._announce(link.SHUTDOWN, 0)

    def is_shut_down(self) -> bool:
        return self._core.has(keys.SHUTDOWN)

    def request_pause(self, generation: int, why: str) -> None:
        """Supervisor: leave generation G at the next step boundary (a resize)."""
        self._core.put_text(keys.pause(generation), why)
        self._announce(link.PAUSE, generation)

    def pause_before(self, generation: int, step: int, every: int = 1) -> bool:
        """Whether a rank about to start ``step`` must leave generation G (a pause was asked).

        Ranks look at the same steps, every ``every``-th (:func:`pause_check_every`). Ranks of a
        synchronous step are never more than one step apart, so the first rank that sees the
        request fixes the boundary at the next step they all look at: a rank that looked at this
        one before the request was made looks again there, and every rank stops before it. One
        store round trip per look.
        """
        if step % every or not self._core.has(keys.pause(generation)):
            return False
        return step >= self._core.first_int(keys.pause_step(generation), step + every)
