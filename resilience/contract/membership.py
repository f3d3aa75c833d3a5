"""Membership by generation, on a store that is not any rank.

The supervisor hosts a ``TCPStore``; losing rank 0 therefore never loses the store. Every
(re-)formation of the job is a *generation* G with a :class:`Plan`: which process (slot)
holds which rank. Ranks read plans; only the supervisor writes them. The world size is a
field of the plan, so a later generation may have another size (elastic training).

All keys live here, so that the supervisor and the ranks cannot disagree on them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta

import torch.distributed as dist

SHUTDOWN = "shutdown"


def plan_key(generation: int) -> str:
    return f"plan/{generation}"


def pg_prefix(generation: int) -> str:
    return f"pg/{generation}/"


def join_key(generation: int) -> str:
    return f"join/{generation}"


def heartbeat_key(slot: str) -> str:
    return f"hb/{slot}"


def ready_key(slot: str) -> str:
    """Set once by a rank process after its warm-up, when it starts waiting for a plan."""
    return f"ready/{slot}"


def report_key(generation: int, slot: str) -> str:
    return f"report/{generation}/{slot}"


def report_seq_key(generation: int) -> str:
    return f"report-seq/{generation}"


def report_ready_key(generation: int) -> str:
    """Bumped after a report is written: what the supervisor polls (the sequence counter
    moves before the report exists)."""
    return f"report-ready/{generation}"


def recovery_key(generation: int) -> str:
    return f"recovery/{generation}"


def first_step_key(generation: int) -> str:
    return f"first-step/{generation}"


def pause_key(generation: int) -> str:
    """Set by the supervisor: leave generation G at the next step boundary (a resize)."""
    return f"pause/{generation}"


def pause_step_key(generation: int) -> str:
    """The first step no rank of generation G may start: fixed by the first rank that saw the pause."""
    return f"pause-step/{generation}"


def batch_key(generation: int) -> str:
    """JSON of the global batch, accumulation and LR scale that generation G trains with."""
    return f"batch/{generation}"


def request_pause(store: dist.Store, generation: int, why: str) -> None:
    store.set(pause_key(generation), why)


def pause_before(store: dist.Store, generation: int, step: int) -> bool:
    """Whether a rank about to start ``step`` must leave generation G (a pause was asked).

    Ranks of a synchronous step are never more than one step apart, so the first rank that
    sees the request fixes the boundary at the step after its own: no rank has started that
    one yet, and every rank stops before it. One store round trip per step.
    """
    if not store.check([pause_key(generation)]):
        return False
    stop = int(store.compare_set(pause_step_key(generation), "", str(step + 1)))
    return step >= stop


def fired_key(index: int) -> str:
    return f"inject-fired/{index}"


def node_kill_key(node: int) -> str:
    return f"inject-node/{node}"


def compute_key(generation: int, slot: str) -> str:
    """A rank's recent steps in generation G: JSON [[step, compute s, step s, wall-clock t, blocked s], ...]."""
    return f"compute/{generation}/{slot}"


def slow_key(node: int) -> str:
    """Set by ``slow:`` injection: the node's ranks run this many times slower."""
    return f"inject-slow/{node}"


def tier_address_key(slot: str) -> str:
    """host:port of a rank process's neighbour-copy server (resilience.tiers.transport)."""
    return f"tier-addr/{slot}"


FLUSH_SEQ = "tier-flush-seq"
FLUSH_REQUEST = "tier-flush"
"""JSON {"id", "step", "timeout_s"}: the supervisor asks every rank to persist now."""


def flush_done_key(request: int, rank: int) -> str:
    return f"tier-flush-done/{request}/{rank}"


RANK_EVENTS = "rank-events"


def rank_event_key(index: int) -> str:
    return f"rank-event/{index}"


def push_event(store: dist.Store, event: str, **fields: object) -> None:
    """An event from a rank for the supervisor's events.jsonl (ranks may run where the log
    folder is not)."""
    index = store.add(RANK_EVENTS, 1)
    store.set(rank_event_key(index), json.dumps({"event": event, **fields, "t": time.time()}))


HOLE_SKIP_S = 2.0
"""How long a reserved but unwritten event may hold up the ones after it."""


class RankEvents:
    """The supervisor's reader of rank events, in order.

    A writer reserves an index, then writes its record. One killed in between (a rank of a
    node that dies while it reports a checkpoint) leaves a hole that no one will fill; waiting
    for it would hold back every later event of the run. A live writer fills its hole within
    microseconds, so a hole still empty after ``HOLE_SKIP_S`` is skipped.
    """

    def __init__(self, store: dist.Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.clock = store, clock
        self.seen = 0
        self._hole_since: float | None = None

    def pop(self, writers_gone: bool = False) -> list[dict]:
        """The events written since the last call; with ``writers_gone`` (every rank process
        has ended) holes are skipped at once."""
        out = []
        count = self.store.add(RANK_EVENTS, 0)
        while self.seen < count:
            key = rank_event_key(self.seen + 1)
            if not self.store.check([key]):
                now = self.clock()
                self._hole_since = now if self._hole_since is None else self._hole_since
                if now - self._hole_since < HOLE_SKIP_S and not writers_gone:
                    break  # still being written, probably
            else:
                out.append(json.loads(self.store.get(key)))
            self._hole_since = None
            self.seen += 1
        return out


NODE_KILLS = "inject-node-count"
CHILD_KILL = "inject-supervisor-child"
"""Set by a rank that fires ``kill-supervisor-child``: the supervisor kills a warm spare's process."""
PREEMPT = "preempt"
"""Set by a rank that received the preemption signal (``scancel --signal`` reaches steps only)."""
RECLAIMS = "reclaim-count"
"""How many reclaim notices ranks wrote: the supervisor reads the slots' keys only when it moves."""
PROGRESS = "progress"


def reclaim_key(slot: str) -> str:
    return f"reclaim/{slot}"


def report_reclaimed(store: dist.Store, slot: str) -> None:
    """A rank on a lent node got Slurm's signal that the node is being taken back (the
    ``reclaim-signal`` event's time is when the rank passed it on, within a heartbeat poll)."""
    store.set(reclaim_key(slot), "1")
    store.add(RECLAIMS, 1)
    push_event(store, "reclaim-signal", slot=slot)


def reclaimed_slots(store: dist.Store, slots: Iterable[str]) -> list[str]:
    return [s for s in slots if store.check([reclaim_key(s)])]
STATS = "stats"


@dataclass(frozen=True)
class SlotInfo:
    node: int
    local_rank: int


@dataclass(frozen=True)
class Plan:
    """Generation G: rank -> slot, and where each slot runs."""

    generation: int
    world_size: int
    members: dict[int, str]
    slots: dict[str, SlotInfo]
    procs_per_node: int
    replaced: tuple[int, ...] = ()
    reason: str = ""
    config: dict = field(default_factory=dict)

    def rank_of(self, slot: str) -> int | None:
        for rank, s in self.members.items():
            if s == slot:
                return rank
        return None

    def node_of_rank(self, rank: int) -> int:
        return self.slots[self.members[rank]].node

    def to_json(self) -> str:
        data = asdict(self)
        data["members"] = {str(k): v for k, v in self.members.items()}
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str | bytes) -> "Plan":
        data = json.loads(text)
        return cls(
            generation=data["generation"],
            world_size=data["world_size"],
            members={int(k): v for k, v in data["members"].items()},
            slots={k: SlotInfo(**v) for k, v in data["slots"].items()},
            procs_per_node=data["procs_per_node"],
            replaced=tuple(data.get("replaced", ())),
            reason=data.get("reason", ""),
            config=data.get("config", {}),
        )


@dataclass(frozen=True)
class Report:
    """What a rank says at the end of its part in a generation."""

    kind: str
    """``done`` | ``error`` | ``unrecoverable`` | ``refused`` (``train`` registered what sres cannot
    protect: the same on every entry) | ``paused`` (left at a step boundary for a resize)."""
    rank: int
    seq: int = 0
    message: str = ""
    traceback: str = ""
    collateral: bool = False
    """The error came from a peer's fault (see ``origin``): the supervisor looks for the culprit."""
    t: float = 0.0
    origin: str = "own"
    """``own`` (this rank's code), ``peer`` (a collective failed) or ``released`` (the generation ended)."""
    error_type: str = ""
    """The exception's class, e.g. ``RuntimeError`` or ``torch.distributed.DistBackendError``."""
    digest: str = ""
    """``done``: the fingerprint of the rank's registered state at the end
    (``snapshot.fingerprint``), which the ``finished`` event lists: runs with and without faults
    are compared by it."""
    step: int | None = None
    """``error``: the step the rank was in when it raised (the one ``ctx.steps()`` last
    yielded); None when it raised outside the step loop. The supervisor stops a run whose own
    error recurs at the same step."""

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Report":
        """Fields this version does not know (a newer writer's) are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in json.loads(text).items() if k in known})


def connect(host: str, port: int, timeout_s: float = 60.0) -> dist.TCPStore:
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def publish_plan(store: dist.Store, plan: Plan) -> None:
    store.set(plan_key(plan.generation), plan.to_json())


def wait_plan(store: dist.Store, slot: str, after: int, poll_s: float = 0.05) -> Plan | None:
    """Block until a generation after ``after`` includes ``slot``; None on shutdown.

    Always the newest such generation: a process that starts late (a cold respawn) must not
    join a generation that a later fault has already ended. Generations that do not include
    this slot (a spare not yet needed) are passed over.
    """
    newest = after
    while True:
        while store.check([plan_key(newest + 1)]):
            newest += 1
        if newest > after:
            plan = Plan.from_json(store.get(plan_key(newest)))
            if plan.rank_of(slot) is not None:
                return plan
            after = newest
        if store.check([SHUTDOWN]):
            return None
        time.sleep(poll_s)


def join(store: dist.Store, plan: Plan, poll_s: float = 0.01) -> bool:
    """Wait until every member of ``plan`` has joined; False if a newer plan supersedes it.

    ``init_process_group`` would block until its timeout for a member that will never come
    (it died after the plan was made); this barrier notices the newer plan instead, so a
    fault during re-formation costs one poll, not a timeout.
    """
    store.add(join_key(plan.generation), 1)
    while store.add(join_key(plan.generation), 0) < plan.world_size:
        if store.check([plan_key(plan.generation + 1)]) or store.check([SHUTDOWN]):
            return False
        time.sleep(poll_s)
    return True


def report(store: dist.Store, generation: int, slot: str, rep: Report) -> Report:
    """Record a report with its order among this generation's reports (the first error is
    the cause; later ones are its consequences)."""
    seq = store.add(report_seq_key(generation), 1)
    rep = Report(**{**asdict(rep), "seq": seq, "t": time.time()})
    store.set(report_key(generation, slot), rep.to_json())
    store.add(report_ready_key(generation), 1)
    return rep
