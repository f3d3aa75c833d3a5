"""Generations and their plans: the supervisor writes who holds which rank, ranks wait, join,
pause and learn that the run is over.

Every (re-)formation of the job is a *generation* G with a :class:`~resilience.contract.messages.Plan`.
The world size is a field of the plan, so a later generation may have another size (elastic).
"""

from __future__ import annotations

import time

import torch.distributed as dist

from resilience.contract import keys
from resilience.contract.messages import Plan
from resilience.contract.store_core import Channel


class PlanChannel(Channel):
    """Only the supervisor writes plans, shutdown and pauses; ranks read them."""

    def publish(self, plan: Plan) -> None:
        self._core.put(keys.plan(plan.generation), plan)

    def get(self, generation: int) -> Plan | None:
        return self._core.get(keys.plan(generation), Plan)

    def has(self, generation: int) -> bool:
        """Whether generation G was planned: a rank of G-1 checks for G to know G-1 ended."""
        return self._core.has(keys.plan(generation))

    def newest(self, after: int = 0) -> int:
        """The newest generation planned (``after`` when none is newer; 0: none yet)."""
        while self.has(after + 1):
            after += 1
        return after

    def wait_for(self, slot: str, after: int, poll_s: float = 0.02) -> Plan | None:
        """Block until a generation after ``after`` includes ``slot``; None on shutdown.

        Always the newest such generation: a process that starts late (a cold respawn) must not
        join a generation that a later fault has already ended. Generations that do not include
        this slot (a spare not yet needed) are passed over.
        """
        newest = after
        while True:
            newest = self.newest(newest)
            if newest > after:
                plan = self.get(newest)
                if plan is not None and plan.rank_of(slot) is not None:
                    return plan
                after = newest
            if self.is_shut_down():
                return None
            time.sleep(poll_s)

    def join(self, plan: Plan, timeout_s: float, poll_s: float = 0.005) -> bool:
        """Wait until every member of ``plan`` has joined; False if a newer plan supersedes it;
        TimeoutError after ``timeout_s`` (the rank reports it, and the supervisor recovers).

        ``init_process_group`` would block until its timeout for a member that will never come
        (it died after the plan was made); this barrier notices the newer plan instead, so a
        fault during re-formation costs one poll, not a timeout. The count is an unsigned
        counter anyone who reaches the store can move: a negative ``add`` once held a
        re-formation forever, hence the deadline (a count pushed up early only hands the wait
        to torch's rendezvous, which is signed).
        """
        self._core.add(keys.join(plan.generation))
        deadline = time.monotonic() + timeout_s
        while self._core.count(keys.join(plan.generation)) < plan.world_size:
            if self.has(plan.generation + 1) or self.is_shut_down():
                return False
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"generation {plan.generation}: not every rank joined within {timeout_s:g} s"
                )
            time.sleep(poll_s)
        return True

    def group_store(self, generation: int) -> dist.Store:
        """The store that generation G's process groups rendezvous on (torch's own keys)."""
        return self._core.prefixed(keys.pg_prefix(generation))

    def end_group_waits(self, generation: int, of: "PlanChannel") -> int:
        """Wake ``of``'s thread (the main thread's connection; this one is another thread's) from
        a wait in generation ``generation``'s rendezvous, which a newer plan ended."""
        return self._core.end_waits(keys.pg_prefix(generation), of._core)

    def shut_down(self) -> None:
        self._core.flag(keys.SHUTDOWN)

    def is_shut_down(self) -> bool:
        return self._core.has(keys.SHUTDOWN)

    def request_pause(self, generation: int, why: str) -> None:
        """Supervisor: leave generation G at the next step boundary (a resize)."""
        self._core.put_text(keys.pause(generation), why)

    def pause_before(self, generation: int, step: int) -> bool:
        """Whether a rank about to start ``step`` must leave generation G (a pause was asked).

        Ranks of a synchronous step are never more than one step apart, so the first rank that
        sees the request fixes the boundary at the step after its own: no rank has started that
        one yet, and every rank stops before it. One store round trip per step.
        """
        if not self._core.has(keys.pause(generation)):
            return False
        return step >= self._core.first_int(keys.pause_step(generation), step + 1)
