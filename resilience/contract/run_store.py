"""A run's coordination store, typed: the only code that touches its keys.

The supervisor hosts a ``TCPStore``; losing rank 0 therefore never loses the store. Every
(re-)formation of the job is a *generation* G with a :class:`~resilience.contract.messages.Plan`:
which process (slot) holds which rank. Ranks read plans; only the supervisor writes them. The
world size is a field of the plan, so a later generation may have another size (elastic training).
Each method names who calls it (supervisor or rank) in its section. Keys are spelled in
:mod:`resilience.contract.keys` and nowhere else; values are :mod:`~resilience.contract.messages`:
in the manner of NVIDIA resiliency's ``StoreMixin``, one object, typed accessors, no raw calls.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta

import torch.distributed as dist

from resilience.contract import keys
from resilience.contract.signed_store import SignedStore
from resilience.errors import ForgedValue
from resilience.contract.messages import (
    BatchInfo,
    FlushDone,
    FlushRequest,
    Plan,
    RankEvent,
    RecentSteps,
    RecoveryInfo,
    Report,
    RequeueNotice,
    RunStats,
)


class RunStore:
    """Typed accessors over a ``torch.distributed.Store`` (a client or the supervisor's server).
    Given the run's secret, every value goes through a :class:`SignedStore`: one another user
    wrote reads as absent, and its key is noted in :attr:`forged` for the supervisor to report."""

    def __init__(self, store: dist.Store, secret: str | None = None) -> None:
        self.under = store
        self.raw: dist.Store = SignedStore(store, secret) if secret else store
        self.forged: deque[str] = deque(maxlen=100)  # keys refused (each once); the supervisor empties it
        self._forged_seen: set[str] = set()

    @classmethod
    def host(cls, secret: str, timeout_s: float = 60.0) -> "RunStore":
        """The supervisor's server, on a free port."""
        return cls(
            dist.TCPStore(
                "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
            ),
            secret,
        )

    @classmethod
    def connect(
        cls, host: str, port: int, secret: str, timeout_s: float = 60.0, connect_s: float = 15.0
    ) -> "RunStore":
        """A rank's client. The supervisor's store is up before any rank starts: a connection taking
        over ``connect_s`` means it is gone (a cancelled job), and the rank ends in seconds."""
        store = dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=connect_s), wait_for_workers=False
        )
        store.set_timeout(timedelta(seconds=timeout_s))
        return cls(store, secret)

    @property
    def port(self) -> int:  # the supervisor's server's (a TCPStore, made by host())
        assert isinstance(self.under, dist.TCPStore), type(self.under)
        return self.under.port

    def clone(self) -> "RunStore":
        """A connection of its own, for another thread (a client is not thread-safe)."""
        # torch's stubs (torch/_C/_distributed_c10d.pyi) omit Store.clone, which every store has.
        raw = self.raw.clone()  # type: ignore[attr-defined]
        twin = RunStore(raw.under if isinstance(raw, SignedStore) else raw)
        twin.raw, twin.forged, twin._forged_seen = raw, self.forged, self._forged_seen
        return twin

    def _value(self, key: str) -> bytes | None:
        """The value of ``key``, or None when it is absent or another user wrote it."""
        if not self.raw.check([key]):
            return None
        try:
            return self.raw.get(key)
        except ForgedValue:
            if key not in self._forged_seen:
                self._forged_seen.add(key)
                self.forged.append(key)
            return None

    def _has(self, key: str) -> bool:
        return self._value(key) is not None

    def _text(self, key: str) -> str | None:
        value = self._value(key)
        return value.decode(errors="replace") if value is not None else None

    def _count(self, key: str) -> int:
        return self.raw.add(key, 0)

    # --- plans and generations (supervisor writes, ranks read) ------------------------------

    def publish_plan(self, plan: Plan) -> None:
        self.raw.set(keys.plan(plan.generation), plan.encode())

    def plan(self, generation: int) -> Plan | None:
        text = self._text(keys.plan(generation))
        return Plan.decode(text) if text is not None else None

    def has_plan(self, generation: int) -> bool:
        """Whether generation G was planned: a rank of G-1 checks for G to know G-1 ended."""
        return self._has(keys.plan(generation))

    def newest_generation(self, after: int = 0) -> int:
        """The newest generation planned (``after`` when none is newer; 0: none yet)."""
        while self.has_plan(after + 1):
            after += 1
        return after

    def wait_plan(self, slot: str, after: int, poll_s: float = 0.02) -> Plan | None:
        """Block until a generation after ``after`` includes ``slot``; None on shutdown.

        Always the newest such generation: a process that starts late (a cold respawn) must not
        join a generation that a later fault has already ended. Generations that do not include
        this slot (a spare not yet needed) are passed over.
        """
        newest = after
        while True:
            newest = self.newest_generation(newest)
            if newest > after:
                plan = self.plan(newest)
                if plan is not None and plan.rank_of(slot) is not None:
                    return plan
                after = newest
            if self.is_shut_down():
                return None
            time.sleep(poll_s)

    def join(self, plan: Plan, poll_s: float = 0.005) -> bool:
        """Wait until every member of ``plan`` has joined; False if a newer plan supersedes it.

        ``init_process_group`` would block until its timeout for a member that will never come
        (it died after the plan was made); this barrier notices the newer plan instead, so a
        fault during re-formation costs one poll, not a timeout.
        """
        self.raw.add(keys.join(plan.generation), 1)
        while self._count(keys.join(plan.generation)) < plan.world_size:
            if self.has_plan(plan.generation + 1) or self.is_shut_down():
                return False
            time.sleep(poll_s)
        return True

    def group_store(self, generation: int) -> dist.Store:
        """The store that generation G's process groups rendezvous on (torch's own keys)."""
        return dist.PrefixStore(keys.pg_prefix(generation), self.raw)

    def shut_down(self) -> None:
        self.raw.set(keys.SHUTDOWN, "1")

    def is_shut_down(self) -> bool:
        return self._has(keys.SHUTDOWN)

    def request_pause(self, generation: int, why: str) -> None:
        """Supervisor: leave generation G at the next step boundary (a resize)."""
        self.raw.set(keys.pause(generation), why)

    def pause_before(self, generation: int, step: int) -> bool:
        """Whether a rank about to start ``step`` must leave generation G (a pause was asked).

        Ranks of a synchronous step are never more than one step apart, so the first rank that
        sees the request fixes the boundary at the step after its own: no rank has started that
        one yet, and every rank stops before it. One store round trip per step.
        """
        if not self._has(keys.pause(generation)):
            return False
        stop = int(self.raw.compare_set(keys.pause_step(generation), "", str(step + 1)))
        return step >= stop

    # --- a rank's life: warm, alive, reporting ---------------------------------------------

    def mark_ready(self, slot: str, at: float) -> None:
        """Set once by a warm rank waiting for a plan, with the time it was (not when we looked)."""
        self.raw.set(keys.ready(slot), repr(at))

    def ready_at(self, slot: str) -> float | None:
        return float(text) if (text := self._text(keys.ready(slot))) is not None else None

    def beat(self, slot: str) -> None:
        self.raw.add(keys.heartbeat(slot), 1)

    def heartbeats(self, slot: str) -> int:
        return self._count(keys.heartbeat(slot))

    def report(self, generation: int, slot: str, rep: Report) -> Report:
        """Record a rank's report with its order among this generation's reports (the first
        error is the cause; later ones are its consequences)."""
        seq = self.raw.add(keys.report_seq(generation), 1)
        rep = replace(rep, seq=seq, t=time.time())
        self.raw.set(keys.report(generation, slot), rep.encode())
        self.raw.add(keys.report_ready(generation), 1)
        return rep

    def reports_written(self, generation: int) -> int:
        """How many reports of G exist: read them only when this moves."""
        return self._count(keys.report_ready(generation))

    def report_of(self, generation: int, slot: str) -> Report | None:
        text = self._text(keys.report(generation, slot))
        return Report.decode(text) if text is not None else None

    # --- progress and how a generation started (rank 0 writes, supervisor reads) ------------

    def set_progress(self, step: int) -> None:
        self.raw.set(keys.PROGRESS, str(step))

    def progress(self) -> int | None:
        """The newest committed step; None before the first."""
        text = self._text(keys.PROGRESS)
        return int(text) if text is not None else None

    def mark_first_step(self, generation: int, t: float) -> None:
        self.raw.set(keys.first_step(generation), repr(t))

    def first_step_t(self, generation: int) -> float | None:
        text = self._text(keys.first_step(generation))
        return float(text) if text is not None else None

    def publish_recovery(self, generation: int, info: RecoveryInfo) -> None:
        self.raw.set(keys.recovery(generation), info.encode())

    def recovery(self, generation: int) -> RecoveryInfo | None:
        text = self._text(keys.recovery(generation))
        return RecoveryInfo.decode(text) if text is not None else None

    def publish_batch(self, generation: int, batch: BatchInfo) -> None:
        self.raw.set(keys.batch(generation), batch.encode())

    def batch(self, generation: int) -> BatchInfo | None:
        text = self._text(keys.batch(generation))
        return BatchInfo.decode(text) if text is not None else None

    def publish_stats(self, stats: RunStats) -> None:
        self.raw.set(keys.STATS, stats.encode())

    def stats(self) -> RunStats | None:
        text = self._text(keys.STATS)
        return RunStats.decode(text) if text is not None else None

    def publish_steps(self, generation: int, slot: str, steps: RecentSteps) -> None:
        self.raw.set(keys.compute(generation, slot), steps.encode())

    def recent_steps(self, generation: int, slot: str) -> RecentSteps | None:
        text = self._text(keys.compute(generation, slot))
        return RecentSteps.decode(text) if text is not None else None

    # --- signals a rank relays (preemption, a lent node taken back) -------------------------

    def mark_preempted(self, by: str) -> None:
        self.raw.set(keys.PREEMPT, by)

    def preempted(self) -> bool:
        return self._has(keys.PREEMPT)

    def report_reclaimed(self, slot: str) -> None:
        """A rank on a lent node got Slurm's signal that the node is being taken back (the
        ``reclaim-signal`` event's time is when the rank passed it on, within a heartbeat poll)."""
        self.raw.set(keys.reclaim(slot), "1")
        self.raw.add(keys.RECLAIMS, 1)
        self.push_event("reclaim-signal", slot=slot)

    def reclaims(self) -> int:
        """How many reclaim notices ranks wrote: read the slots' keys only when it moves."""
        return self._count(keys.RECLAIMS)

    def reclaimed_slots(self, slots: Iterable[str]) -> list[str]:
        return [s for s in slots if self._has(keys.reclaim(s))]

    # --- rank events ----------------------------------------------------------------------

    def push_event(self, event: str, **fields: object) -> None:
        """An event from a rank for the supervisor's events.jsonl (ranks may run where the log
        folder is not)."""
        index = self.raw.add(keys.RANK_EVENTS, 1)
        self.raw.set(keys.rank_event(index), RankEvent(event, dict(fields), time.time()).encode())

    # --- checkpoint tiers -------------------------------------------------------------------

    def publish_tier_address(self, slot: str, address: str) -> None:
        """host:port of a rank process's neighbour-copy server (resilience.tiers.transport)."""
        self.raw.set(keys.tier_address(slot), address)

    def tier_address(self, slot: str) -> str | None:
        return self._text(keys.tier_address(slot))

    def request_flush(self, step: int | None, timeout_s: float) -> int:
        """Supervisor: ask every rank to persist now; returns the request's id."""
        request = self.raw.add(keys.FLUSH_SEQ, 1)
        self.raw.set(keys.FLUSH_REQUEST, FlushRequest(request, step, timeout_s).encode())
        return request

    def flush_request(self) -> FlushRequest | None:
        text = self._text(keys.FLUSH_REQUEST)
        return FlushRequest.decode(text) if text is not None else None

    def answer_flush(self, request: int, rank: int, done: FlushDone) -> None:
        self.raw.set(keys.flush_done(request, rank), done.encode())

    def flush_answers(self, request: int, ranks: Iterable[int]) -> list[FlushDone] | None:
        """Every rank's answer, or None while one is missing."""
        names = [keys.flush_done(request, rank) for rank in ranks]
        if not self.raw.check(names):
            return None
        values = [self._value(k) for k in names]
        return [FlushDone.decode(v) for v in values if v is not None] if None not in values else None

    # --- the batch cache's producers (resilience.data) ------------------------------------------

    def want_batch_producer(self, node: int) -> None:
        """Rank: this node's ranks read batches from a cache; the supervisor keeps its producer running."""
        self.raw.set(keys.batch_producer(node), "1")

    def batch_producers_wanted(self, nodes: Iterable[int]) -> list[int]:
        return [node for node in nodes if self._has(keys.batch_producer(node))]

    # --- before a requeue: the ranks' ctx.on_requeue hooks -------------------------------------

    def mark_requeue_hooked(self, slot: str) -> None:
        """Rank: this process runs hooks before a requeue; the supervisor waits for its answer."""
        self.raw.set(keys.requeue_hooked(slot), "1")

    def requeue_hooked(self, slots: Iterable[str]) -> list[str]:
        return [slot for slot in slots if self.raw.check([keys.requeue_hooked(slot)])]

    def announce_requeue(self, cause: str, timeout_s: float) -> int:
        """Supervisor: the job is about to be requeued; returns the notice's id."""
        notice = self.raw.add(keys.REQUEUE_SEQ, 1)
        self.raw.set(keys.REQUEUE_NOTICE, RequeueNotice(notice, cause, timeout_s).encode())
        return notice

    def requeue_notice(self) -> RequeueNotice | None:
        text = self._text(keys.REQUEUE_NOTICE)
        return RequeueNotice.decode(text) if text is not None else None

    def answer_requeue(self, notice: int, slot: str, error: str) -> None:
        """Rank: its hooks ran (``error``: empty, or what one of them raised)."""
        self.raw.set(keys.requeue_done(notice, slot), json.dumps(error))

    def requeue_answers(self, notice: int, slots: Iterable[str]) -> dict[str, str]:
        """The answers that arrived so far, by slot (empty: every hook ran)."""
        answers = {slot: self._text(keys.requeue_done(notice, slot)) for slot in slots}
        return {slot: json.loads(text) for slot, text in answers.items() if text is not None}

    # --- fault injection (tests, the demo, chaos) -------------------------------------------

    def first_to_fire(self, index: int, suffix: str = "") -> bool:
        """Whether this call is the first for injection ``index`` (each fires once per run)."""
        return self.raw.add(keys.fired(index) + suffix, 1) == 1

    def arrive(self, index: int) -> None:
        self.raw.add(keys.fired(index) + "/arrived", 1)

    def arrived(self, index: int) -> int:
        return self._count(keys.fired(index) + "/arrived")

    def request_node_kill(self, node: int, spec: str) -> None:
        self.raw.set(keys.node_kill(node), spec)
        self.raw.add(keys.NODE_KILLS, 1)

    def node_kill_requests(self) -> int:
        return self._count(keys.NODE_KILLS)

    def take_node_kill(self, node: int) -> bool:
        """Supervisor: whether node N was asked to be killed (the request is consumed)."""
        if not self._has(keys.node_kill(node)):
            return False
        self.raw.delete_key(keys.node_kill(node))
        return True

    def request_child_kill(self, spec: str) -> None:
        self.raw.set(keys.CHILD_KILL, spec)

    def take_child_kill(self) -> bool:
        if not self._has(keys.CHILD_KILL):
            return False
        self.raw.delete_key(keys.CHILD_KILL)
        return True

    def mark_slow(self, node: int, factor: float) -> None:
        self.raw.set(keys.slow(node), str(factor))

    def slow_factor(self, node: int) -> float | None:
        text = self._text(keys.slow(node))
        return float(text) if text is not None else None
