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
``kill-during-capture:rank=R:step=S``  SIGKILL rank R half-way through its own snapshot of
                            commit S (sharded state, or the tiers' copy), taken in the
                            background while step S + 1 computes: sharded state of rank R at
                            commit S then exists nowhere complete
``stall-capture:rank=R:step=S``  rank R's snapshot of commit S (sharded state, or the tiers'
                            copy) stops half-way for
                            ``STALL_CAPTURE_S`` (memory pressure): the optimizer step of S + 1
                            must wait for it, or that snapshot would hold some of S + 1
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
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from resilience.contract.injections import Injection
from resilience.errors import InjectedFault

if TYPE_CHECKING:  # the CLI parses specs before torch is imported
    from resilience.contract.run_store import RunStore

AT_STEP_START = (
    "kill",
    "node",
    "raise",
    "hang",
    "kill-all",
    "slow",
    "corrupt-ram",
    "fill-disk",
    "free-disk",
    "kill-supervisor-child",
)
"""The kinds a rank fires when it starts a step (the others fire inside a commit or a copy)."""
FILL_LIMIT_BYTES = 1 << 30
"""``fill-disk`` fills at most this much: a test's small filesystem, never a real disk."""


def due(
    injections: Iterable[Injection],
    *,
    rank: int,
    node: int,
    kinds: Iterable[str],
    step: int | None = None,
    generation: int | None = None,
) -> list[Injection]:
    """Injections that target this rank (or its node) at this step or generation. Pure."""
    kinds = set(kinds)
    return [
        i
        for i in injections
        if i.kind in kinds
        and ((step is not None and i.step == step) or (generation is not None and i.generation == generation))
        and (
            (i.kind == "node" and (i.node == node if i.node is not None else i.rank == rank))
            or i.kind == "kill-all"
            or (i.kind != "node" and i.rank == rank)
        )
    ]


class SlowNode:
    """A ``slow:`` injection as its node lives it: once the store says the node is slow, each
    step of its ranks starts with a sleep of (factor - 1) x the compute time it had before."""

    def __init__(self, store: RunStore, node: int, injections: Iterable[Injection]) -> None:
        self.store, self.node = store, node
        self.armed = any(i.kind == "slow" for i in injections)
        self.delay_s: float | None = None

    def before_step(self, base_compute_s: Callable[[], float | None]) -> None:
        if not self.armed:
            return
        if self.delay_s is None and (factor := self.store.slow_factor(self.node)) is not None:
            self.delay_s = (factor - 1) * (base_compute_s() or 0.01)
        if self.delay_s:
            time.sleep(self.delay_s)


def fire(
    injection: Injection,
    store: RunStore,
    rank: int,
    node: int,
    world_size: int,
    generation: int | None = None,
) -> None:
    """Carry out ``injection`` where it is due, once per run (``kill-all``: once on every rank)."""
    if not store.first_to_fire(injection.index, f"/{rank}" if injection.kind == "kill-all" else ""):
        return
    if injection.kind == "kill-all":
        # Die together: no rank is lost (and no survivor released) before all got here. A rank
        # that another fault killed on its way never comes: once its loss ends the generation,
        # who got here dies now (found by the soak: they waited, past the release grace).
        store.arrive(injection.index)
        deadline = time.monotonic() + 60
        while store.arrived(injection.index) < world_size and time.monotonic() < deadline:
            if generation is not None and store.has_plan(generation + 1):
                break
            time.sleep(0.005)
    if injection.kind == "kill-supervisor-child":  # the supervisor's to do
        store.request_child_kill(injection.spec)
        return
    if injection.kind == "slow":  # the node is slow from now on, for every rank it runs
        store.mark_slow(node, injection.factor)
        return
    if injection.kind == "node":
        # A node dies as a whole: the supervisor SIGKILLs every process of it.
        store.request_node_kill(node, injection.spec)
        time.sleep(3600)
    perform(injection)


def copy_hook(
    injections: Iterable[Injection],
    store: RunStore,
    rank: int,
    node: int,
    world_size: int,
    kinds: tuple[str, ...] = ("kill-during-copy",),
) -> Callable[[int], None] | None:
    """A background copy's ``midway(step)`` hook that fires ``kinds`` (``kill-during-copy``: the
    buddy replicator's sends; ``kill-during-capture`` and ``stall-capture``: the snapshot of a
    commit); ``None`` when none is injected. It runs on the copy's thread, so it has its own
    store client."""
    injections = tuple(i for i in injections if i.kind in kinds)
    if not injections:
        return None
    own = store.clone()

    def midway(step: int) -> None:
        for injection in due(injections, step=step, rank=rank, node=node, kinds=kinds):
            fire(injection, own, rank, node, world_size)

    return midway


def transfer_hook(
    injections: Iterable[Injection], store: RunStore, rank: int, world_size: int, recovered_step: int
) -> Callable[[], None] | None:
    """The ``midway`` hook of this rank's state transfers in a recovery that resumes after
    ``recovered_step``: it fires a due ``kill-during-transfer``. ``None`` when none is due."""
    injections = tuple(
        i for i in injections if i.kind == "kill-during-transfer" and recovered_step + 1 >= i.step
    )
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
        return (
            f"not filled: {free / 2**30:.1f} GiB free on {path.parent} (put the persistent tier on a small "
            "filesystem)"
        )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.posix_fallocate(fd, 0, free)
    except OSError:  # ENOSPC: a save took blocks since statvfs; or no fallocate
        pass
    _take_the_rest(fd)
    # Keep it full while this process lives and the file is there (free-disk unlinks it): a
    # checkpoint pruned just after the fill freed room enough for the next save (seen in CI).
    threading.Thread(target=_keep_full, args=(fd,), name="sres-fill-disk", daemon=True).start()
    return f"filled {path.parent} ({free / 2**20:.0f} MiB)"


def _take_the_rest(fd: int) -> None:
    for chunk in (1 << 20, 1 << 16, 1 << 12):
        try:
            while os.write(fd, bytes(chunk)):
                pass
        except OSError:
            pass


def _keep_full(fd: int, period_s: float = 0.01) -> None:
    while os.fstat(fd).st_nlink:
        _take_the_rest(fd)
        time.sleep(period_s)
    os.close(fd)


STALL_CAPTURE_S = 2.0
"""How long ``stall-capture`` holds a snapshot: many steps of the tests' small models."""


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
    elif injection.kind == "stall-capture":
        print(
            f"sres: injected {injection.spec}: the snapshot waits {STALL_CAPTURE_S:g} s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(STALL_CAPTURE_S)
    elif injection.kind in (
        "kill",
        "kill-during-commit",
        "kill-during-copy",
        "kill-during-capture",
        "kill-all",
        "kill-during-transfer",
    ):
        os.kill(os.getpid(), signal.SIGKILL)
    elif injection.kind == "hang":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif injection.kind == "raise":
        raise InjectedFault(f"injected fault {injection.spec}")
