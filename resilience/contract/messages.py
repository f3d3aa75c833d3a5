"""Every value that crosses between the supervisor and the ranks, as a frozen dataclass with its
encoding. A field renamed on one side is a type error on both, not a ``KeyError`` at run time
in another process; ``tests/unit/test_contract.py`` round-trips each of them.

Encodings are JSON. Decoding leaves out fields this version does not know, so a newer writer's
extra field never breaks an older reader.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple, TypeVar

M = TypeVar("M", bound="Message")

STUCK_EXIT = 75
"""The exit code of a rank that could not leave a generation that had already ended (a call in
torch that the release did not interrupt, past the grace time) and ended itself to be restarted:
the fault that ended the generation was elsewhere, so its node is not blamed for it."""
FENCED_EXIT = 76
"""The exit code of a rank whose lease ran out (:mod:`resilience.contract.lease`): cut off from the
supervisor for longer than the bound, it ended itself rather than act for a run that may have
replaced it."""


class Message:
    """Base of the dataclasses below: JSON of their fields."""

    def encode(self) -> str:
        return json.dumps(asdict(self))  # type: ignore[call-overload]

    @classmethod
    def decode(cls: type[M], raw: str | bytes) -> M:
        return cls.from_mapping(json.loads(raw))

    @classmethod
    def from_mapping(cls: type[M], data: Mapping[str, Any]) -> M:
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class SlotInfo:
    """Where a slot (a rank process) runs: its node index and its place on that node."""

    node: int
    local_rank: int


class _Placing(Message):
    """A plan, or its change: ranks are JSON object keys (strings) on the wire, ints here."""

    members: dict[int, str]

    def encode(self) -> str:
        data = asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass
        data["members"] = {str(k): v for k, v in self.members.items()}
        return json.dumps(data)


def _placing(data: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a plan and its change share, decoded."""
    return {
        "generation": data["generation"],
        "world_size": data["world_size"],
        "members": {int(k): v for k, v in data["members"].items()},
        "slots": {k: SlotInfo(**v) for k, v in data["slots"].items()},
        "procs_per_node": data["procs_per_node"],
        "replaced": tuple(data.get("replaced", ())),
        "reason": data.get("reason", ""),
        "config": data.get("config", {}),
    }


@dataclass(frozen=True)
class Plan(_Placing):
    """Generation G: rank -> slot, and where each slot runs. Only the supervisor writes plans."""

    generation: int
    world_size: int
    members: dict[int, str]
    slots: dict[str, SlotInfo]
    procs_per_node: int
    replaced: tuple[int, ...] = ()
    reason: str = ""
    config: dict[str, object] = field(default_factory=dict)

    def rank_of(self, slot: str) -> int | None:
        for rank, s in self.members.items():
            if s == slot:
                return rank
        return None

    def node_of_rank(self, rank: int) -> int:
        return self.slots[self.members[rank]].node

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "Plan":
        return cls(**_placing(data))


@dataclass(frozen=True)
class PlanChange(_Placing):
    """Plan G as what changed since plan G-1: what a rank that holds G-1 reads instead of G.

    A plan names every member, and every rank reads the next one: whole, that is O(N) bytes and
    objects a rank, O(N^2) for the run (4,096 ranks: 7 ms a rank, 29 s of CPU for one recovery).
    A node fault changes one node's ranks; :meth:`apply` rebuilds the plan from the held one
    with dictionary copies and the changes only."""

    generation: int
    world_size: int
    members: dict[int, str]
    """Ranks whose slot is new or another one."""
    slots: dict[str, SlotInfo]
    """Where those ranks' slots run."""
    dropped: tuple[int, ...]
    """Ranks of G-1 that G does not have (a smaller world)."""
    left: tuple[str, ...]
    """Slots of G-1 that are not members of G."""
    procs_per_node: int
    replaced: tuple[int, ...] = ()
    reason: str = ""
    config: dict[str, object] = field(default_factory=dict)

    @classmethod
    def between(cls, base: Plan, plan: Plan) -> "PlanChange":
        members = {r: s for r, s in plan.members.items() if base.members.get(r) != s}
        return cls(
            generation=plan.generation,
            world_size=plan.world_size,
            members=members,
            slots={s: i for s, i in plan.slots.items() if base.slots.get(s) != i},
            dropped=tuple(r for r in base.members if r not in plan.members),
            left=tuple(s for s in base.slots if s not in plan.slots),
            procs_per_node=plan.procs_per_node,
            replaced=plan.replaced,
            reason=plan.reason,
            config=plan.config,
        )

    def apply(self, base: Plan) -> Plan:
        """Plan G from ``base`` (G-1), which must be the plan this change was made from."""
        members, slots = dict(base.members), dict(base.slots)
        for rank in self.dropped:
            del members[rank]
        for slot in self.left:
            del slots[slot]
        members.update(self.members)
        slots.update(self.slots)
        return Plan(
            generation=self.generation,
            world_size=self.world_size,
            members=members,
            slots=slots,
            procs_per_node=self.procs_per_node,
            replaced=self.replaced,
            reason=self.reason,
            config=self.config,
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "PlanChange":
        return cls(**_placing(data), dropped=tuple(data["dropped"]), left=tuple(data["left"]))


@dataclass(frozen=True)
class Report(Message):
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
    slot: str = ""
    """The slot that wrote it (set when it is written): the supervisor reads reports by number."""


@dataclass(frozen=True)
class RecoveryInfo(Message):
    """Rank 0's account of how generation G got its state: the ``recovered`` event's source."""

    step: int
    """The step restored (-1: none; training starts over)."""
    source: str
    """``self`` | ``peer`` | a tier's name."""
    bytes: int
    recover_s: float
    formed_t: float
    """Wall-clock time the process group was formed."""
    recovered_t: float
    """Wall-clock time the state was in place."""


@dataclass(frozen=True)
class BatchInfo(Message):
    """The global batch generation G trains with (elastic runs)."""

    global_batch: int
    accumulation: int
    lr_scale: float
    kept: bool


@dataclass(frozen=True)
class Progress(Message):
    """The run's newest committed step, and the generation whose rank 0 committed it."""

    step: int
    generation: int = 0


@dataclass(frozen=True)
class RunStats(Message):
    median_step_s: float
    """Commit to commit, each generation's first step left out (rank 0's, at the end)."""


class StepRecord(NamedTuple):
    """One committed step of one rank. A tuple, not a dataclass: the supervisor of a large run
    takes thousands a second (8,192 at 4,096 ranks of half-second steps), and a tuple is made
    five times faster."""

    step: int
    compute_s: float
    """From the step's start to its first gradient collective."""
    step_s: float
    """From the previous commit (or the step's start) to this commit."""
    t: float
    """Wall-clock time of the commit."""
    blocked_s: float
    """Waiting for the previous commit's snapshot and tier copy (at the commit) and buddy round
    (at the end of the step before)."""
    steps: int = 1
    """The steps this record stands for: past 512 ranks, one record per window of
    :func:`record_window` steps up to ``step`` (its times the window's sums, ``t`` its last commit)."""


RECORDS_PER_STEP = 512
"""Step records the supervisor takes per step of the run at most: past 512 ranks each rank sends
one record per window of steps (:func:`record_window`). At 4,096 ranks of half-second steps, a
record per rank and step was 8,192 a second, two thirds of the supervisor's steady CPU."""


def record_window(world_size: int) -> int:
    """Steps per step record at this world size: 1 up to 512 ranks, then ``ceil(N / 512)``. Every
    rank's windows end at the same steps (multiples of it), so a window is judged, as a step is,
    once every member sent it."""
    return max(1, math.ceil(world_size / RECORDS_PER_STEP))


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a step time")


@dataclass(frozen=True)
class RecentSteps(Message):
    """A rank's recent steps in a generation (positional on the wire: a large run's supervisor
    reads thousands a second)."""

    records: tuple[StepRecord, ...]

    def encode(self) -> str:
        return json.dumps(self.records)

    @classmethod
    def decode(cls, raw: str | bytes) -> "RecentSteps":
        """Every value checked here, once: an int step and finite float times (JSON's NaN and
        Infinity are refused), so that whoever writes them as JSON need not look again."""
        rows = json.loads(raw, parse_constant=_no_constant)
        for step, compute_s, step_s, t, blocked_s, steps in rows:  # unrolled: a third of any()'s cost
            if not (
                type(step) is int
                and type(compute_s) is float
                and type(step_s) is float
                and type(t) is float
                and type(blocked_s) is float
                and type(steps) is int
            ):
                raise ValueError(f"a step record of other types: {rows!r:.200}")
        records = tuple(map(StepRecord._make, rows))
        return cls(records)


@dataclass(frozen=True)
class FlushRequest(Message):
    """The supervisor asks every rank to persist: ``step`` None first (report the newest step
    held), then the step to copy."""

    id: int
    step: int | None
    timeout_s: float = 300.0
    generation: int = 0
    """The generation whose ranks answer (0: any): a rank of an older one, cut off and back, or
    dropped by a shrink while it still holds its old rank number, never answers for a member."""


@dataclass(frozen=True)
class RequeueNotice(Message):
    """The supervisor is about to requeue the job (``cause``: ``time-limit`` or ``preemption``),
    its newest commit persisted: ranks run their ``ctx.on_requeue`` hooks within ``timeout_s``."""

    id: int
    cause: str
    timeout_s: float = 60.0


@dataclass(frozen=True)
class FlushDone(Message):
    """A rank's answer to a :class:`FlushRequest`."""

    step: int | None
    error: str | None = None


@dataclass(frozen=True)
class RankEvent(Message):
    """An event from a rank for the supervisor's ``events.jsonl`` (ranks may run where the log
    folder is not). Flat on the wire, as the log line it becomes."""

    event: str
    fields: dict[str, Any]
    t: float

    def encode(self) -> str:
        return json.dumps({"event": self.event, **self.fields, "t": self.t})

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "RankEvent":
        rest = {k: v for k, v in data.items() if k not in ("event", "t")}
        if not isinstance(data["event"], str):
            raise TypeError(f"event name {data['event']!r}: not a string")
        return cls(data["event"], rest, float(data.get("t", 0.0)))

    def record(self) -> dict[str, Any]:
        """The line for the event log."""
        return {"event": self.event, **self.fields, "t": self.t}


MESSAGES: tuple[type[Message], ...] = (
    Plan,
    PlanChange,
    Report,
    RecoveryInfo,
    BatchInfo,
    RunStats,
    Progress,
    RecentSteps,
    FlushRequest,
    FlushDone,
    RankEvent,
)
"""Every message type (the contract test round-trips each)."""
