"""A seeded random fault schedule: ``--inject random:seed=S:every=N[:kinds=a,b][:from=F][:to=T][:count=C]``.

Faults in the field come at random moments and in clusters; a soak needs hundreds of them, and
a failing soak must replay exactly. The schedule is therefore expanded once, before the run,
into ordinary injections (``kill:rank=2:step=41``, ...): the ranks fire them as they fire
hand-written ones, the start event lists them, and ``fault-schedule.json`` in the log dir
keeps them. The same seed, world and node count give the same schedule on any machine
(``random.Random`` is specified to be reproducible across platforms for a given seed).

Each step from ``from`` (default 1: a fault before the first commit only restarts the run)
to ``to`` (default 10000) gets a fault with probability 1/N, at most one per step, of a kind
drawn uniformly from ``kinds`` on a uniformly drawn rank (or the node running it); ``count``
stops the schedule after C faults. A fault of a paired kind (:data:`_PAIRED`) brings its
partner at the same step.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from resilience.contract.injections import FAULT_KINDS, Injection
from resilience.contract.injections import parse as parse_specs
from resilience.errors import InjectSpecError

DEFAULT_KINDS = tuple(k.name for k in FAULT_KINDS.values() if k.random == "default")
"""Kinds any run with a spare survives (``FaultKind.random``). The others are chosen with
``kinds=``: ``kill-during-copy`` and ``kill-during-capture`` need sharded state, ``kill-all``,
``corrupt-ram`` and ``kill-during-transfer`` the RAM tier. A seed draws from these by position:
the registry's order is the schedule's."""
KINDS = tuple(k.name for k in FAULT_KINDS.values() if k.random != "never")
_PAIRED = {"corrupt-ram": ("kill-all", 0), "kill-during-transfer": ("kill", 0), "fill-disk": ("free-disk", 9)}
"""Kinds drawn with a partner (kind, steps later): a corrupt RAM-tier copy is found when
every rank restarts from that tier; a sender dies in the transfer to a rank that was just
killed; a full disk frees up again (on the same rank), after two persistent saves at the default
``persist_every`` of 4 (with one, a save still queued when another fault killed the rank left
the full disk unseen: CI saw it under load)."""
LINK_DEFAULTS = {"cut": 0.0, "cut-supervisor": 0.0, "drop-out": 0.0, "flap": 2.0}
"""A link fault drawn at random: cut for good (the node is replaced), or flapping for 2 s;
``slow-link`` caps its node at :data:`SLOW_LINK_MBIT`."""
SLOW_LINK_MBIT = 20.0
_SPEC = re.compile(
    r"^random:seed=(\d+):every=(\d+(?:\.\d+)?)((?::(?:kinds=[a-z,-]+|from=\d+|to=\d+|count=\d+))*)$"
)


@dataclass(frozen=True)
class RandomFaults:
    seed: int
    every: float
    """One fault on average every ``every`` steps."""
    kinds: tuple[str, ...] = DEFAULT_KINDS
    first: int = 1
    last: int = 10_000
    count: int | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise InjectSpecError(f"random faults: every={self.every:g} must be at least 1 (step)")
        unknown = [k for k in self.kinds if k not in KINDS]
        if unknown or not self.kinds:
            raise InjectSpecError(
                f"random faults: kinds={','.join(self.kinds)}: use some of {','.join(KINDS)}"
            )
        if not 1 <= self.first <= self.last:
            raise InjectSpecError(
                f"random faults: from={self.first} to={self.last} is not a range of steps >= 1"
            )

    @property
    def spec(self) -> str:
        count = f":count={self.count}" if self.count is not None else ""
        return (
            f"random:seed={self.seed}:every={self.every:g}:kinds={','.join(self.kinds)}"
            f":from={self.first}:to={self.last}{count}"
        )


def is_random(spec: str) -> bool:
    return spec.strip().startswith("random:")


def parse(spec: str) -> RandomFaults:
    m = _SPEC.match(spec.strip())
    if m is None:
        raise InjectSpecError(
            f"bad --inject spec {spec!r}: use random:seed=S:every=N[:kinds=a,b][:from=F][:to=T][:count=C]"
        )
    options = dict(part.split("=", 1) for part in m.group(3).split(":") if part)
    kinds = tuple(options["kinds"].split(",")) if "kinds" in options else DEFAULT_KINDS
    return RandomFaults(
        int(m.group(1)),
        float(m.group(2)),
        kinds,
        int(options.get("from", 1)),
        int(options.get("to", 10_000)),
        int(options["count"]) if "count" in options else None,
    )


def expand(faults: RandomFaults, *, world_size: int, first_index: int = 0) -> tuple[Injection, ...]:
    """The schedule as injections, indexed from ``first_index`` (each fires once per run). Pure."""
    rng = random.Random(f"sres-faults:{faults.seed}")
    out: list[Injection] = []
    drawn = 0
    for step in range(faults.first, faults.last + 1):
        if faults.count is not None and drawn == faults.count:
            break
        if rng.random() >= 1 / faults.every:
            continue
        drawn += 1
        kind = rng.choice(faults.kinds)
        if FAULT_KINDS[kind].target == "job":  # every rank / whichever sends / rank 0 asks the supervisor
            rank = 0 if FAULT_KINDS[kind].performer == "supervisor" else None
        else:  # node: the node of a rank, as node indices change when spares replace nodes
            rank = rng.randrange(world_size)
        seconds = LINK_DEFAULTS.get(kind)
        mbit = SLOW_LINK_MBIT if kind == "slow-link" else None
        out.append(Injection(kind, step, rank=rank, index=first_index + len(out), seconds=seconds, mbit=mbit))
        if kind in _PAIRED:
            partner, later = _PAIRED[kind]
            if partner != kind and partner in ("kill-all", "kill"):  # free-disk: the same rank
                rank = None if partner == "kill-all" else rng.randrange(world_size)
            out.append(Injection(partner, step + later, rank=rank, index=first_index + len(out)))
    return tuple(out)


def summary(faults: RandomFaults, schedule: tuple[Injection, ...]) -> str:
    """One line for the start of a run: how many faults of each kind, and over which steps."""
    counts = {kind: sum(1 for i in schedule if i.kind == kind) for kind in dict.fromkeys(KINDS)}
    kinds = ", ".join(f"{kind} x{n}" for kind, n in counts.items() if n)
    last = schedule[-1].step if schedule else faults.first
    return (
        f"random faults (seed {faults.seed}, one per {faults.every:g} steps): {len(schedule)} over steps "
        f"{faults.first}-{last}: {kinds or 'none'}"
    )


def injections_from(specs: list[str], world_size: int) -> tuple[tuple[Injection, ...], list[str]]:
    """Every ``--inject`` spec as injections, random schedules expanded after the others (so
    that indices, which the ranks recompute from the specs, agree), and a summary line for
    each schedule."""
    injections = parse_specs([s for s in specs if not is_random(s)])
    lines = []
    for spec in (s for s in specs if is_random(s)):
        random_faults = parse(spec)
        schedule = expand(random_faults, world_size=world_size, first_index=len(injections))
        injections += schedule
        lines.append(summary(random_faults, schedule))
    return injections, lines
