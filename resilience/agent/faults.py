"""Fault injection for tests, the demo and benchmarks: real faults at chosen steps.

Specs (``sres run --inject SPEC`` or ``SRES_INJECT="SPEC;SPEC"`` under sbatch):

=========================== ==================================================
``kill:rank=R:step=S``      SIGKILL rank R when it starts step S
``node:N:step=S``           SIGKILL every process of node N (the supervisor does it)
``node:rank=R:step=S``      the same for the node that runs rank R at step S
``raise:rank=R:step=S``     raise an exception inside ``train`` on rank R
``hang:rank=R:step=S``      freeze rank R (SIGSTOP): no progress, no heartbeat
``kill-during-commit:rank=R:step=S``  SIGKILL rank R inside ``commit()`` of step S,
                            after the optimizer step, before the commit is recorded
``kill-during-copy:rank=R:step=S``  SIGKILL rank R half-way through sending its buddy
                            copy of commit S (sharded state: its buddy holds a partial copy)
``kill-all:step=S``         SIGKILL every rank process when it starts step S (no peer
                            survives: the RAM tier must serve the restart)
``corrupt-ram:rank=R:step=S``  when rank R starts step S, flip one byte in the middle of its
                            newest RAM-tier copy (found only when that copy is read)
``kill-during-transfer:step=S``  SIGKILL the first rank that sends state to a replaced
                            rank in a recovery at or after step S, half-way through it
``kill-supervisor-child:step=S``  when rank 0 starts step S, the supervisor SIGKILLs the
                            process of one of its warm spares (its node is drained; none: no-op)
``fill-disk:rank=R:step=S`` when rank R starts step S, fill the filesystem of the persistent
                            tier (a file of all its free space; refused above 1 GiB free)
``free-disk:rank=R:step=S`` remove that file again
``slow:rank=R:factor=F:step=S``  from step S the node of rank R computes F times slower
                            (a straggler: its ranks sleep before each step); a rank
                            moved to another node is fast again
=========================== ==================================================

``gen=G`` in place of ``step=S`` (``kill`` and ``node`` only) fires when the target enters
generation G, that is while the job re-forms after an earlier fault: a fault during recovery.

Each spec fires once per run: the coordination store records that it fired, so a rank that
replays step S after recovery does not fault again.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from resilience.errors import ResilienceError

KINDS = ("kill", "node", "raise", "hang", "kill-during-commit", "kill-during-copy", "kill-all", "slow", "corrupt-ram",
         "kill-during-transfer", "fill-disk", "free-disk", "kill-supervisor-child")
AT_STEP_START = ("kill", "node", "raise", "hang", "kill-all", "slow", "corrupt-ram", "fill-disk", "free-disk",
                 "kill-supervisor-child")
"""The kinds a rank fires when it starts a step (the others fire inside a commit or a copy)."""
FILL_LIMIT_BYTES = 1 << 30
"""``fill-disk`` fills at most this much: a test's small filesystem, never a real disk."""


class InjectSpecError(ResilienceError, ValueError):
    """An ``--inject`` spec that cannot be parsed; the message names the spec."""


class InjectedFault(ResilienceError, RuntimeError):
    """The exception that ``raise:`` injects."""


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
    r"^(kill|raise|hang|kill-during-commit|kill-during-copy|corrupt-ram|fill-disk|free-disk)"
    r":rank=(\d+):(step|gen)=(\d+)$")
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
            out.append(Injection("slow", int(m.group(3)), rank=int(m.group(1)), index=index, factor=float(m.group(2))))
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
                "|corrupt-ram|fill-disk|free-disk:rank=R:step=S "
                "or node:N:step=S (gen=G for kill and node) or node:rank=R:step=S "
                "or kill-all|kill-during-transfer|kill-supervisor-child:step=S "
                "or slow:rank=R:factor=F:step=S or random:seed=S:every=N[:kinds=a,b]"
            )
    return tuple(out)


def _injection(kind: str, when: str, value: int, index: int, **target: int) -> Injection:
    if when == "gen":
        if value < 2:
            raise InjectSpecError(f"gen={value}: generation 1 is the start; a fault during recovery needs gen >= 2")
        return Injection(kind, None, index=index, generation=value, **target)
    return Injection(kind, value, index=index, **target)


def parse_env(value: str | None) -> tuple[Injection, ...]:
    return parse(value.split(";")) if value else ()


def due(injections: Iterable[Injection], *, rank: int, node: int, kinds: Iterable[str],
        step: int | None = None, generation: int | None = None) -> list[Injection]:
    """Injections that target this rank (or its node) at this step or generation. Pure."""
    kinds = set(kinds)
    return [
        i for i in injections
        if i.kind in kinds
        and ((step is not None and i.step == step) or (generation is not None and i.generation == generation))
        and ((i.kind == "node" and (i.node == node if i.node is not None else i.rank == rank))
             or i.kind == "kill-all" or (i.kind != "node" and i.rank == rank))
    ]


class SlowNode:
    """A ``slow:`` injection as its node lives it: once the store says the node is slow, each
    step of its ranks starts with a sleep of (factor - 1) x the compute time it had before."""

    def __init__(self, store, node: int, injections: Iterable[Injection]) -> None:
        from resilience.contract import membership

        self.store, self.key = store, membership.slow_key(node)
        self.armed = any(i.kind == "slow" for i in injections)
        self.delay_s: float | None = None

    def before_step(self, base_compute_s: Callable[[], float | None]) -> None:
        if not self.armed:
            return
        if self.delay_s is None and self.store.check([self.key]):
            factor = float(self.store.get(self.key))
            self.delay_s = (factor - 1) * (base_compute_s() or 0.01)
        if self.delay_s:
            time.sleep(self.delay_s)


def fire(injection: Injection, store, rank: int, node: int, world_size: int, generation: int | None = None) -> None:
    """Carry out ``injection`` where it is due, once per run (``kill-all``: once on every rank)."""
    from resilience.contract import membership

    key = membership.fired_key(injection.index) + (f"/{rank}" if injection.kind == "kill-all" else "")
    if store.add(key, 1) != 1:
        return
    if injection.kind == "kill-all":
        # Die together: no rank is lost (and no survivor released) before all got here. A rank
        # that another fault killed on its way never comes: once its loss ends the generation,
        # who got here dies now (found by the soak: they waited, past the release grace).
        arrived = membership.fired_key(injection.index) + "/arrived"
        store.add(arrived, 1)
        ended = [membership.plan_key(generation + 1)] if generation is not None else None
        deadline = time.monotonic() + 60
        while store.add(arrived, 0) < world_size and time.monotonic() < deadline:
            if ended is not None and store.check(ended):
                break
            time.sleep(0.005)
    if injection.kind == "kill-supervisor-child":  # the supervisor's to do
        store.set(membership.CHILD_KILL, injection.spec)
        return
    if injection.kind == "slow":  # the node is slow from now on, for every rank it runs
        store.set(membership.slow_key(node), str(injection.factor))
        return
    if injection.kind == "node":
        # A node dies as a whole: the supervisor SIGKILLs every process of it.
        store.set(membership.node_kill_key(node), injection.spec)
        store.add(membership.NODE_KILLS, 1)
        time.sleep(3600)
    perform(injection)


def copy_hook(injections: Iterable[Injection], store, rank: int, node: int,
              world_size: int) -> Callable[[int], None] | None:
    """The buddy replicator's ``sending(step)`` hook that fires ``kill-during-copy``; ``None``
    when none is injected. It runs on the replicator's thread, so it has its own store client."""
    injections = tuple(i for i in injections if i.kind == "kill-during-copy")
    if not injections:
        return None
    own = store.clone()

    def sending(step: int) -> None:
        for injection in due(injections, step=step, rank=rank, node=node, kinds=("kill-during-copy",)):
            fire(injection, own, rank, node, world_size)
    return sending


def transfer_hook(injections: Iterable[Injection], store, rank: int, world_size: int,
                  recovered_step: int) -> Callable[[], None] | None:
    """The ``midway`` hook of this rank's state transfers in a recovery that resumes after
    ``recovered_step``: it fires a due ``kill-during-transfer``. ``None`` when none is due."""
    injections = tuple(i for i in injections if i.kind == "kill-during-transfer" and recovered_step + 1 >= i.step)
    if not injections:
        return None

    def sending() -> None:
        for injection in injections:
            fire(injection, store, rank, -1, world_size)
    return sending


def corrupt_newest_ram_copy(rank: int) -> Path | None:
    """Flip one byte half-way through the newest complete RAM-tier copy of ``rank``'s state on
    this host (its own node's, as the rank's process is the one that fires this)."""
    from resilience.tiers.layout import TierConfig, job_ram_dir

    config = TierConfig.from_environ(os.environ)
    if config is None or not config.ram:
        return None
    copies = job_ram_dir(config.job_id).glob(f"node-*/own/step-*/rank-{rank:05d}/*.bin")
    complete = [p for p in copies if (p.parent / "manifest.json").exists() and p.stat().st_size]
    for path in sorted(complete, key=lambda p: (p.parent.parent.name, p.stat().st_mtime))[-1:]:
        with path.open("r+b") as f:
            f.seek(path.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
        return path
    return None


def disk_filler(rank: int) -> Path | None:
    """Where ``fill-disk`` of ``rank`` puts its file: in the persistent tier's directory."""
    from resilience.tiers.layout import TierConfig

    config = TierConfig.from_environ(os.environ)
    if config is None or not config.persistent_dir:
        return None
    return Path(config.persistent_dir) / f".sres-fill-disk-rank-{rank}"


def fill_disk(path: Path) -> str:
    """Take every free byte of ``path``'s filesystem (up to :data:`FILL_LIMIT_BYTES`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fs = os.statvfs(path.parent)
    free = fs.f_bavail * fs.f_frsize
    if free > FILL_LIMIT_BYTES:
        return (f"not filled: {free / 2**30:.1f} GiB free on {path.parent} (put the persistent tier on a small "
                "filesystem)")
    with path.open("ab") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, free)
        except OSError:  # ENOSPC once the blocks are gone, or no fallocate: fill it by writing
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
    return f"filled {path.parent} ({free / 2**20:.0f} MiB)"


def perform(injection: Injection) -> None:
    """Carry out a rank-local fault on this process. ``node`` faults are the supervisor's."""
    if injection.kind in ("corrupt-ram", "fill-disk", "free-disk"):
        filler = disk_filler(injection.rank)
        if injection.kind == "corrupt-ram":
            path = corrupt_newest_ram_copy(injection.rank)
            what = f"flipped a byte of {path or 'nothing (no RAM-tier copy yet)'}"
        elif filler is None:
            what = "nothing: no persistent tier"
        elif injection.kind == "fill-disk":
            what = fill_disk(filler)
        else:
            filler.unlink(missing_ok=True)
            what = f"freed {filler.parent}"
        print(f"sres: injected {injection.spec}: {what}", file=sys.stderr, flush=True)
    elif injection.kind in ("kill", "kill-during-commit", "kill-during-copy", "kill-all", "kill-during-transfer"):
        os.kill(os.getpid(), signal.SIGKILL)
    elif injection.kind == "hang":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif injection.kind == "raise":
        raise InjectedFault(f"injected fault {injection.spec}")
