"""Fault injection for tests, the demo and benchmarks: real faults at chosen steps.

Specs (``sres run --inject SPEC`` or ``SRES_INJECT="SPEC;SPEC"`` under sbatch):

=========================== ==================================================
``kill:rank=R:step=S``      SIGKILL rank R when it starts step S
``node:N:step=S``           SIGKILL every process of node N (the supervisor does it)
``raise:rank=R:step=S``     raise an exception inside ``train`` on rank R
``hang:rank=R:step=S``      freeze rank R (SIGSTOP): no progress, no heartbeat
``kill-during-commit:rank=R:step=S``  SIGKILL rank R inside ``commit()`` of step S,
                            after the optimizer step, before the commit is recorded
=========================== ==================================================

Each spec fires once per run: the coordination store records that it fired, so a rank that
replays step S after recovery does not fault again.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass

KINDS = ("kill", "node", "raise", "hang", "kill-during-commit")


class InjectSpecError(ValueError):
    """An ``--inject`` spec that cannot be parsed; the message names the spec."""


class InjectedFault(RuntimeError):
    """The exception that ``raise:`` injects."""


@dataclass(frozen=True)
class Injection:
    kind: str
    step: int
    rank: int | None = None
    node: int | None = None
    index: int = 0

    @property
    def spec(self) -> str:
        target = f"{self.node}" if self.kind == "node" else f"rank={self.rank}"
        return f"{self.kind}:{target}:step={self.step}"


_RANK_SPEC = re.compile(r"^(kill|raise|hang|kill-during-commit):rank=(\d+):step=(\d+)$")
_NODE_SPEC = re.compile(r"^node:(\d+):step=(\d+)$")


def parse(specs: Iterable[str]) -> tuple[Injection, ...]:
    out = []
    for index, raw in enumerate(s.strip() for s in specs):
        if not raw:
            continue
        if m := _RANK_SPEC.match(raw):
            out.append(Injection(m.group(1), int(m.group(3)), rank=int(m.group(2)), index=index))
        elif m := _NODE_SPEC.match(raw):
            out.append(Injection("node", int(m.group(2)), node=int(m.group(1)), index=index))
        else:
            kind = raw.split(":", 1)[0]
            hint = f"unknown kind {kind!r}" if kind not in KINDS else "bad form"
            raise InjectSpecError(
                f"bad --inject spec {raw!r} ({hint}): use kill|raise|hang|kill-during-commit:rank=R:step=S or node:N:step=S"
            )
    return tuple(out)


def parse_env(value: str | None) -> tuple[Injection, ...]:
    return parse(value.split(";")) if value else ()


def due(injections: Iterable[Injection], *, step: int, rank: int, node: int, kinds: Iterable[str]) -> list[Injection]:
    """Injections that target this rank (or its node) at this step. Pure."""
    kinds = set(kinds)
    return [
        i for i in injections
        if i.kind in kinds and i.step == step
        and ((i.kind == "node" and i.node == node) or (i.kind != "node" and i.rank == rank))
    ]


def perform(injection: Injection) -> None:
    """Carry out a rank-local fault on this process. ``node`` faults are the supervisor's."""
    if injection.kind in ("kill", "kill-during-commit"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif injection.kind == "hang":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif injection.kind == "raise":
        raise InjectedFault(f"injected fault {injection.spec}")
