"""The ``--inject`` spec language: what the supervisor tells ranks to break, and when.

The supervisor parses ``sres run --inject`` (or ``SRES_INJECT``) once, to refuse a bad spec in
one line before anything starts; ranks get the same specs in their environment
(:class:`~resilience.contract.rank_env.RankEnv`). What each kind does is
:mod:`resilience.agent.faults`'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from resilience.contract.fault_kind import FaultKind, Target, Where
from resilience.contract.link_kinds import LINK_KINDS
from resilience.errors import InjectSpecError

_KINDS: tuple[FaultKind, ...] = (
    # The order of the first twelve is the random schedule's (a seed draws from it by position).
    FaultKind("kill", "rank", "step", "sigkill", "SIGKILL rank R as it starts step S", True, "default"),
    FaultKind(
        "raise", "rank", "step", "raise", "raise an exception inside train on rank R", random="default"
    ),
    FaultKind(
        "hang",
        "rank",
        "step",
        "sigstop",
        "freeze rank R (SIGSTOP): no progress, no heartbeat",
        random="default",
    ),
    FaultKind(
        "kill-during-commit",
        "rank",
        "commit",
        "sigkill",
        "SIGKILL rank R inside commit() of step S, after the optimizer step, before the commit is recorded",
        random="default",
    ),
    FaultKind(
        "node",
        "node",
        "step",
        "kill-node",
        "the supervisor SIGKILLs every process of node N (or of the node that runs rank R at step S);"
        " nodes given the same step are lost in one instant",
        True,
        "default",
    ),
    FaultKind(
        "kill-during-copy",
        "rank",
        "copy",
        "sigkill",
        "SIGKILL rank R half-way through sending its buddy copy of commit S (sharded state)",
    ),
    FaultKind(
        "kill-during-capture",
        "rank",
        "capture",
        "sigkill",
        "SIGKILL rank R half-way through its background snapshot of commit S (sharded state, or the "
        "tiers' copy): rank R's shard of commit S then exists nowhere complete",
    ),
    FaultKind(
        "kill-all",
        "job",
        "step",
        "sigkill",
        "SIGKILL every rank process as it starts step S: no peer survives, the RAM tier serves the restart",
    ),
    FaultKind(
        "corrupt-ram",
        "rank",
        "step",
        "corrupt-ram",
        "flip one byte in the middle of rank R's newest RAM-tier copy (found only when it is read)",
    ),
    FaultKind(
        "kill-during-transfer",
        "job",
        "transfer",
        "sigkill",
        "SIGKILL the first rank that sends state to a replaced rank in a recovery at or after step S",
    ),
    FaultKind(
        "fill-disk",
        "rank",
        "step",
        "fill-disk",
        "fill the persistent tier's filesystem (a file of all its free space; refused above 1 GiB free)",
    ),
    FaultKind(
        "kill-supervisor-child",
        "job",
        "step",
        "kill-spare",
        "as rank 0 starts step S, the supervisor SIGKILLs one of its warm spares (its node is drained)",
    ),
    FaultKind(
        "stall-capture",
        "rank",
        "capture",
        "stall",
        "rank R's snapshot of commit S stops half-way for 2 s (memory pressure): step S + 1's optimizer "
        "step must wait for it",
        random="never",
    ),
    FaultKind(
        "slow",
        "rank",
        "step",
        "slow",
        "from step S the node of rank R computes F times slower (a straggler); a rank moved off it is fast",
        random="never",
        options=("factor=F",),
    ),
    FaultKind("free-disk", "rank", "step", "free-disk", "remove fill-disk's file again", random="never"),
    FaultKind(
        "hang-gil",
        "rank",
        "step",
        "hold-gil",
        "rank R blocks in a C call that holds the GIL (a stuck extension): no progress, and its "
        "heartbeat thread cannot run either",
        random="never",
    ),
)
_LINK_KINDS = LINK_KINDS
_KINDS = (*_KINDS, *_LINK_KINDS)
FAULT_KINDS: dict[str, FaultKind] = {kind.name: kind for kind in _KINDS}
"""Every fault kind, by name: the one place a kind is declared."""
KINDS = tuple(FAULT_KINDS)


def kinds_firing(where: Where) -> tuple[str, ...]:
    """The kinds a rank fires at ``where`` (``step``: as it starts a step)."""
    return tuple(k.name for k in _KINDS if k.fires == where)


def kinds_help() -> str:
    """``sres run --inject help``: every kind, its spec and what it does."""
    width = max(len(k.syntax) for k in _KINDS)
    lines = [f"  {k.syntax:<{width}}  {k.doc} [{k.performer}]" for k in _KINDS]
    return "\n".join(
        [
            "fault kinds for --inject SPEC (repeatable; SRES_INJECT='SPEC;SPEC'); each fires once per run:",
            *lines,
            "  random:seed=S:every=N[:kinds=a,b][:from=F][:to=T][:count=C]  a seeded random schedule of "
            f"the kinds above (default kinds: {','.join(k.name for k in _KINDS if k.random == 'default')})",
        ]
    )


@dataclass(frozen=True)
class Injection:
    kind: str
    step: int | None
    rank: int | None = None
    node: int | None = None
    index: int = 0
    generation: int | None = None
    factor: float | None = None
    """``slow``: how many times slower."""
    seconds: float | None = None
    """A link fault's ``for=D`` (0: for good)."""
    mbit: float | None = None
    """``slow-link``: the cap, in Mbit/s."""
    percent: float | None = None
    """``lossy``: the share of packets lost each way, in percent."""
    ms: float | None = None
    """``delay``: the time added to each packet each way, in milliseconds."""

    @property
    def spec(self) -> str:
        when = f"gen={self.generation}" if self.generation is not None else f"step={self.step}"
        kind = FAULT_KINDS[self.kind]
        if kind.target == "job":
            return (
                f"{self.kind}:{when}" if self.seconds is None else f"{self.kind}:for={self.seconds:g}:{when}"
            )
        if self.kind == "slow":
            return f"slow:rank={self.rank}:factor={self.factor:g}:{when}"
        target = f"{self.node}" if self.node is not None else f"rank={self.rank}"
        if self.kind == "slow-link":
            return f"slow-link:{target}:mbit={self.mbit:g}:{when}"
        if self.kind == "lossy":
            return f"lossy:{target}:percent={self.percent:g}:{when}"
        if self.kind == "delay":
            return f"delay:{target}:ms={self.ms:g}:{when}"
        if self.seconds is not None:
            return f"{self.kind}:{target}:for={self.seconds:g}:{when}"
        target = f"{self.node}" if kind.target == "node" and self.node is not None else f"rank={self.rank}"
        return f"{self.kind}:{target}:{when}"


def _names(target: Target, with_options: bool = False) -> str:
    return "|".join(
        re.escape(k.name) for k in _KINDS if k.target == target and bool(k.options) == with_options
    )


_RANK_SPEC = re.compile(rf"^({_names('rank')}):rank=(\d+):(step|gen)=(\d+)$")
_NODE_SPEC = re.compile(r"^node:(\d+):(step|gen)=(\d+)$")
_NODE_OF_RANK_SPEC = re.compile(r"^node:rank=(\d+):step=(\d+)$")
_ALL_SPEC = re.compile(rf"^({_names('job')}):step=(\d+)$")
_SLOW_SPEC = re.compile(r"^slow:rank=(\d+):factor=(\d+(?:\.\d+)?):step=(\d+)$")
_LINK_NAMES = "|".join(re.escape(k.name) for k in _LINK_KINDS if k.target == "node")
_JOB_LINK_NAMES = "|".join(re.escape(k.name) for k in _LINK_KINDS if k.target == "job")
_JOB_LINK_SPEC = re.compile(rf"^({_JOB_LINK_NAMES}):for=(\d+(?:\.\d+)?):step=(\d+)$")
_LINK_SPEC = re.compile(rf"^({_LINK_NAMES}):(\d+|rank=\d+):(for|mbit|percent|ms)=(\d+(?:\.\d+)?):step=(\d+)$")


def parse(specs: Iterable[str]) -> tuple[Injection, ...]:
    out = []
    for index, raw in enumerate(s.strip() for s in specs):
        if not raw:
            continue
        if m := _RANK_SPEC.match(raw):
            kind, target, when, value = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            if when == "gen" and not FAULT_KINDS[kind].generation:
                generational = " and ".join(k.name for k in _KINDS if k.generation)
                raise InjectSpecError(f"bad --inject spec {raw!r}: gen= works with {generational} only")
            out.append(_injection(kind, when, value, index, rank=target))
        elif m := _SLOW_SPEC.match(raw):
            if float(m.group(2)) <= 1:
                raise InjectSpecError(f"bad --inject spec {raw!r}: factor must exceed 1")
            out.append(
                Injection(
                    "slow", int(m.group(3)), rank=int(m.group(1)), index=index, factor=float(m.group(2))
                )
            )
        elif m := _LINK_SPEC.match(raw):
            out.append(_link(raw, m, index))
        elif m := _JOB_LINK_SPEC.match(raw):  # asked for by rank 0, done to every node's link
            out.append(Injection(m.group(1), int(m.group(3)), rank=0, index=index, seconds=float(m.group(2))))
        elif m := _ALL_SPEC.match(raw):  # one the supervisor performs is asked for by rank 0
            rank = 0 if FAULT_KINDS[m.group(1)].performer == "supervisor" else None
            out.append(Injection(m.group(1), int(m.group(2)), rank=rank, index=index))
        elif m := _NODE_SPEC.match(raw):
            out.append(_injection("node", m.group(2), int(m.group(3)), index, node=int(m.group(1))))
        elif m := _NODE_OF_RANK_SPEC.match(raw):  # the node that runs rank R then
            out.append(Injection("node", int(m.group(2)), rank=int(m.group(1)), index=index))
        else:
            kind = raw.split(":", 1)[0]
            if kind not in FAULT_KINDS:
                raise InjectSpecError(
                    f"bad --inject spec {raw!r} (unknown kind {kind!r}): "
                    "'sres run --inject help' lists the kinds"
                )
            raise InjectSpecError(f"bad --inject spec {raw!r} (bad form): use {FAULT_KINDS[kind].syntax}")
    return tuple(out)


def _link(raw: str, m: re.Match[str], index: int) -> Injection:
    kind, where, option = m.group(1), m.group(2), m.group(3)
    value, step = float(m.group(4)), int(m.group(5))
    # node N, or the node that runs rank R then (a random schedule's: nodes change numbers)
    target = {"rank": int(where[5:])} if where.startswith("rank=") else {"node": int(where)}
    wanted = FAULT_KINDS[kind].options[0].split("=")[0]
    if option != wanted:
        raise InjectSpecError(f"bad --inject spec {raw!r} (bad form): use {FAULT_KINDS[kind].syntax}")
    if kind == "slow-link":
        if value <= 0:
            raise InjectSpecError(f"bad --inject spec {raw!r}: mbit must be positive")
        return Injection(kind, step, index=index, mbit=value, **target)
    if kind == "lossy":
        if not 0 < value < 100:
            raise InjectSpecError(f"bad --inject spec {raw!r}: percent must be above 0 and below 100")
        return Injection(kind, step, index=index, percent=value, **target)
    if kind == "delay":
        if value <= 0:
            raise InjectSpecError(f"bad --inject spec {raw!r}: ms must be positive")
        return Injection(kind, step, index=index, ms=value, **target)
    if kind == "flap" and value <= 0:
        raise InjectSpecError(f"bad --inject spec {raw!r}: a flap lasts for=D > 0 seconds")
    return Injection(kind, step, index=index, seconds=value, **target)


def _injection(kind: str, when: str, value: int, index: int, **target: int) -> Injection:
    if when == "gen":
        if value < 2:
            raise InjectSpecError(
                f"gen={value}: generation 1 is the start; a fault during recovery needs gen >= 2"
            )
        return Injection(kind, None, index=index, generation=value, **target)
    return Injection(kind, value, index=index, **target)


def parse_env(value: str | None) -> tuple[Injection, ...]:
    return parse(value.split(";")) if value else ()
