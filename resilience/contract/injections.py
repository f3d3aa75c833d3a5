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

from resilience.errors import InjectSpecError

KINDS = (
    "kill",
    "node",
    "raise",
    "hang",
    "kill-during-commit",
    "kill-during-copy",
    "kill-during-capture",
    "stall-capture",
    "kill-all",
    "slow",
    "corrupt-ram",
    "kill-during-transfer",
    "fill-disk",
    "free-disk",
    "kill-supervisor-child",
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

    @property
    def spec(self) -> str:
        when = f"gen={self.generation}" if self.generation is not None else f"step={self.step}"
        if self.kind in ("kill-all", "kill-during-transfer", "kill-supervisor-child"):
            return f"{self.kind}:{when}"
        if self.kind == "slow":
            return f"slow:rank={self.rank}:factor={self.factor:g}:{when}"
        target = f"{self.node}" if self.kind == "node" and self.node is not None else f"rank={self.rank}"
        when = f"gen={self.generation}" if self.generation is not None else f"step={self.step}"
        return f"{self.kind}:{target}:{when}"


_RANK_SPEC = re.compile(
    r"^(kill|raise|hang|kill-during-commit|kill-during-copy|kill-during-capture|stall-capture|corrupt-ram"
    r"|fill-disk|free-disk)"
    r":rank=(\d+):(step|gen)=(\d+)$"
)
_NODE_SPEC = re.compile(r"^node:(\d+):(step|gen)=(\d+)$")
_NODE_OF_RANK_SPEC = re.compile(r"^node:rank=(\d+):step=(\d+)$")
_ALL_SPEC = re.compile(r"^(kill-all|kill-during-transfer|kill-supervisor-child):step=(\d+)$")
_SLOW_SPEC = re.compile(r"^slow:rank=(\d+):factor=(\d+(?:\.\d+)?):step=(\d+)$")


def parse(specs: Iterable[str]) -> tuple[Injection, ...]:
    out = []
    for index, raw in enumerate(s.strip() for s in specs):
        if not raw:
            continue
        if m := _RANK_SPEC.match(raw):
            kind, target, when, value = m.group(1), int(m.group(2)), m.group(3), int(m.group(4))
            if when == "gen" and kind != "kill":
                raise InjectSpecError(f"bad --inject spec {raw!r}: gen= works with kill and node only")
            out.append(_injection(kind, when, value, index, rank=target))
        elif m := _SLOW_SPEC.match(raw):
            if float(m.group(2)) <= 1:
                raise InjectSpecError(f"bad --inject spec {raw!r}: factor must exceed 1")
            out.append(
                Injection(
                    "slow", int(m.group(3)), rank=int(m.group(1)), index=index, factor=float(m.group(2))
                )
            )
        elif m := _ALL_SPEC.match(raw):  # kill-supervisor-child: fired by rank 0
            rank = 0 if m.group(1) == "kill-supervisor-child" else None
            out.append(Injection(m.group(1), int(m.group(2)), rank=rank, index=index))
        elif m := _NODE_SPEC.match(raw):
            out.append(_injection("node", m.group(2), int(m.group(3)), index, node=int(m.group(1))))
        elif m := _NODE_OF_RANK_SPEC.match(raw):  # the node that runs rank R then
            out.append(Injection("node", int(m.group(2)), rank=int(m.group(1)), index=index))
        else:
            kind = raw.split(":", 1)[0]
            hint = f"unknown kind {kind!r}" if kind not in KINDS else "bad form"
            raise InjectSpecError(
                f"bad --inject spec {raw!r} ({hint}): use kill|raise|hang|kill-during-commit|kill-during-copy"
                "|kill-during-capture|stall-capture|corrupt-ram|fill-disk|free-disk:rank=R:step=S "
                "or node:N:step=S (gen=G for kill and node) or node:rank=R:step=S "
                "or kill-all|kill-during-transfer|kill-supervisor-child:step=S "
                "or slow:rank=R:factor=F:step=S or random:seed=S:every=N[:kinds=a,b]"
            )
    return tuple(out)


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
