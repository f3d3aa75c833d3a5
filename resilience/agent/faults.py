"""Fault injection for tests, the demo and benchmarks: real faults at chosen steps.

Specs (``sres run --inject SPEC`` or ``SRES_INJECT="SPEC;SPEC"`` under sbatch): every kind is
declared once, with its syntax, where it fires and what it does, in
:data:`resilience.contract.injections.FAULT_KINDS`; ``sres run --inject help`` lists them. This
module carries out each kind's effect in the rank that fires it.

``gen=G`` in place of ``step=S`` (the kinds declared with ``generation``) fires when the target enters
generation G, that is while the job re-forms after an earlier fault: a fault during recovery.

Each spec fires once per run: the coordination store records that it fired, so a rank that
replays step S after recovery does not fault again.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from resilience.contract.injections import FAULT_KINDS, Injection, kinds_firing
from resilience.errors import InjectedFault

if TYPE_CHECKING:  # the CLI parses specs before torch is imported
    from resilience.contract.run_store import RunStore

AT_STEP_START = kinds_firing("step")
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
            (
                FAULT_KINDS[i.kind].target == "node"
                and (i.node == node if i.node is not None else i.rank == rank)
            )
            or (FAULT_KINDS[i.kind].target == "job" and i.rank is None)  # every rank (kill-all)
            or (FAULT_KINDS[i.kind].target != "node" and i.rank == rank)
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
        if self.delay_s is None and (factor := self.store.faults.slow_factor(self.node)) is not None:
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
    together: Iterable[Injection] = (),
) -> None:
    """Carry out ``injection`` where it is due, once per run (``kill-all``: once on every rank).
    ``together``: the run's other injections, for node losses due at the same step, which happen
    in one instant (:func:`_lose_nodes_together`)."""
    if not store.faults.first_to_fire(injection.index, f"/{rank}" if injection.kind == "kill-all" else ""):
        return
    if injection.kind == "kill-all":
        # Die together: no rank is lost (and no survivor released) before all got here. A rank
        # that another fault killed on its way never comes: once its loss ends the generation,
        # who got here dies now (found by the soak: they waited, past the release grace).
        _arrive_and_wait(store, injection.index, world_size, generation, 60.0)
    effect = FAULT_KINDS[injection.kind].effect
    if effect == "kill-spare":  # the supervisor's to do
        store.faults.request_child_kill(injection.spec)
        return
    if effect == "break-link":  # the supervisor's to do; this rank trains on through it
        store.faults.request_link_fault(dataclasses.replace(injection, node=node, rank=None).spec)
        return
    if effect == "slow":  # the node is slow from now on, for every rank it runs
        assert injection.factor is not None, "parse() gives every slow spec its factor"
        store.faults.mark_slow(node, injection.factor)
        return
    if effect == "kill-node":
        # A node dies as a whole: the supervisor SIGKILLs every process of it.
        _lose_nodes_together(injection, store, node, generation, together)
        time.sleep(3600)
    perform(injection)


def _lose_nodes_together(
    injection: Injection, store: RunStore, node: int, generation: int | None, others: Iterable[Injection]
) -> None:
    """Node losses due at one step are one correlated fault: each node is marked, and the
    supervisor is told once all of them are (or a new plan, or 10 s, says one never comes). Told
    one by one, a loaded supervisor saw the first, re-formed and recovered before the second came:
    two faults, where the test meant the loss of both holders of a shard (seen in CI)."""
    group = [
        i
        for i in others
        if FAULT_KINDS[i.kind].effect == "kill-node"
        and (i.step, i.generation) == (injection.step, injection.generation)
    ] or [injection]
    store.faults.mark_node_kill(node, injection.spec)
    _arrive_and_wait(store, min(i.index for i in group), len(group), generation, 10.0)
    store.faults.announce_node_kills()


def _arrive_and_wait(store: RunStore, key: int, count: int, generation: int | None, timeout_s: float) -> None:
    """Count this rank in at ``key``, then wait until ``count`` are in, a newer plan than
    ``generation`` ends the wait (one who was to come was lost on the way), or ``timeout_s``."""
    store.faults.arrive(key)
    deadline = time.monotonic() + timeout_s
    while store.faults.arrived(key) < count and time.monotonic() < deadline:
        if generation is not None and store.plans.has(generation + 1):
            break
        time.sleep(0.005)


def copy_hook(
    injections: Iterable[Injection],
    store: RunStore,
    rank: int,
    node: int,
    world_size: int,
    kinds: tuple[str, ...] = kinds_firing("copy"),
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
        i
        for i in injections
        if i.kind in kinds_firing("transfer") and i.step is not None and recovered_step + 1 >= i.step
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
    """Carry out a rank-local fault on this process (what the supervisor does, :func:`fire` asks for)."""
    effect = FAULT_KINDS[injection.kind].effect
    if effect in ("corrupt-ram", "fill-disk", "free-disk"):
        assert injection.rank is not None, "their kinds target a rank"
        filler = disk_filler(injection.rank)
        if effect == "corrupt-ram":
            path = corrupt_newest_ram_copy(injection.rank)
            what = f"flipped a byte of {path or 'nothing (no RAM-tier copy yet)'}"
        elif filler is None:
            what = "nothing: no persistent tier"
        elif effect == "fill-disk":
            what = fill_disk(filler)
        else:
            filler.unlink(missing_ok=True)
            what = f"freed {filler.parent}"
        print(f"sres: injected {injection.spec}: {what}", file=sys.stderr, flush=True)
    elif effect == "stall":
        print(
            f"sres: injected {injection.spec}: the snapshot waits {STALL_CAPTURE_S:g} s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(STALL_CAPTURE_S)
    elif effect == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif effect == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif effect == "hold-gil":
        print(f"sres: injected {injection.spec}: pause() holding the GIL", file=sys.stderr, flush=True)
        libc = ctypes.PyDLL(None)  # a PyDLL's calls keep the GIL: no other thread of ours runs
        while True:
            libc.pause()
    elif effect == "raise":
        raise InjectedFault(f"injected fault {injection.spec}")
