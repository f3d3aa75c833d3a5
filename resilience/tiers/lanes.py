"""The saver's background lanes: one worker thread per tier a job's saves feed.

A lane runs one job at a time and keeps at most one pending: a newer job replaces the pending
one (the newest state matters, and memory stays bounded), except a flush's copy, which
someone waits for: the newer job queues behind it. What the saver's lanes carry besides
the thread, each in one place here: how a tier's failures are said (:class:`Warnings`), whether
data-parallel ranks store their replicated state once in a shared tier
(:class:`ReplicatedOnce`), and which steps of the first tier pruning must keep while later
lanes copy them or a flush waits for them (:class:`Pins`). What a job does is the saver's
(:mod:`resilience.tiers.saver`); writing the copy is the tier's (``Tier.write``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from resilience.state.snapshot import Snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.base import Source, Tier, Where
from resilience.tiers.layout import TierConfig

log = logging.getLogger("resilience")

REPLICATED = "replicated.bin"

Emit = Callable[..., None]
"""``emit(event, **fields)``: a rank's event, for the supervisor's events.jsonl."""


@dataclass
class Commit:
    """One commit for one lane."""

    step: int
    snaps: dict[str, Snapshot] | None = None
    """A commit captured, for the first lane: the buffers to write (released once written)."""
    path: Path | None = None
    """Else the first tier's copy of it, for a later lane (pinned there until this job ends)."""
    force: bool = False
    """Taken by every tier, also those that take only some commits (a K-th commit, a flush)."""
    done: threading.Event | None = None
    """Set when the job ended; someone waits for this very job (a flush): never replaced."""
    ok: bool = False
    number: int = 0
    """Its place in its lane's submissions (the lane numbers it)."""

    @property
    def source(self) -> Source:
        return self.snaps if self.snaps is not None else self.path


class Lane:
    """A worker thread: one job in flight, one pending; a newer submit replaces the pending job
    (returned to the caller, which releases what it holds) unless someone waits for that one
    (``Commit.done``). CI, 2 cores: a flush's copy queued behind a slow copy was replaced by the
    next K-th commit's, and the flush said the write failed."""

    def __init__(self, name: str, work: Callable[[Commit], None]) -> None:
        self._work = work
        self._cond = threading.Condition()
        self._pending: deque[Commit] = deque()
        self._busy = False
        self._stopped = False
        self._submitted = 0
        self._ended = 0
        """The number of the newest job that ended: jobs run in the order they came."""
        self._thread = threading.Thread(target=self._run, name=f"sres-tier-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: Commit) -> Commit | None:
        with self._cond:
            dropped = self._replaceable()
            self._submitted += 1
            job.number = self._submitted
            self._pending.append(job)
            self._cond.notify_all()
            return dropped

    def take_pending(self) -> Commit | None:
        with self._cond:
            return self._replaceable()

    def _replaceable(self) -> Commit | None:
        """The newest pending job, taken off the queue, unless someone waits for it."""
        if self._pending and self._pending[-1].done is None:
            return self._pending.pop()
        return None

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Until no job runs or waits. Only for a caller that is the lane's one submitter (or
        when no one submits any more): while another thread commits faster than the lane
        writes, the lane is never idle."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._busy or self._pending), timeout_s)

    def wait_caught_up(self, timeout_s: float | None = None) -> bool:
        """Until the newest job submitted so far has ended (or a newer one that replaced it), while
        jobs may keep coming. A flush asked for this on a thread of its own, with ``wait_idle``;
        CI, 2 cores: a RAM write slower than a step left the lane never idle, the flush's
        minute ran out, and the preempted job was requeued a minute late, with nothing saved."""
        with self._cond:
            target = self._submitted
            return self._cond.wait_for(lambda: self._ended >= target, timeout_s)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stopped:
                    self._cond.wait()
                if not self._pending:
                    return
                job, self._busy = self._pending.popleft(), True
            try:
                self._work(job)
            except BaseException as err:  # noqa: BLE001 - a lane must survive one bad job
                log.warning("tier lane %s: %s", self._thread.name, err)
            finally:
                with self._cond:
                    self._busy = False
                    self._ended = job.number
                    self._cond.notify_all()


class Warnings:
    """A tier's failed saves as events: at every failure, or once when the tier starts failing
    and once when it works again (``Saving.warn_each_failure``)."""

    def __init__(self, tier: Tier, emit: Emit) -> None:
        self.tier, self.emit, self.failing = tier.name, emit, False
        self.each = tier.saving.warn_each_failure

    def failed(self, step: int, err: BaseException) -> None:
        error = f"{type(err).__name__}: {err}"
        if self.each:
            self.emit(
                "tier-warning",
                tier=self.tier,
                step=step,
                error=error,
                message=f"{self.tier.upper()} tier save failed",
            )
        elif not self.failing:
            self.failing = True
            self.emit(
                "tier-warning",
                tier=self.tier,
                step=step,
                error=error,
                message=f"{self.tier} tier save failed; training goes on, later saves retry",
            )

    def succeeded(self, step: int) -> None:
        if self.failing:
            self.failing = False
            self.emit("tier-resumed", tier=self.tier, step=step)


class ReplicatedOnce:
    """In a shared tier, data-parallel ranks may leave their replicated state to rank 0's copy
    of the same step: whether this rank still does (``share``), and what its next save checks
    (``remember``)."""

    def __init__(self, tier: Tier, config: TierConfig, emit: Emit) -> None:
        self.tier, self.job_id, self.emit = tier, config.job_id, emit
        self.enabled = config.persist_replicated_once
        self._last_shared: tuple[int, mf.FileEntry] | None = None

    def share(self, where: Where, rank: int) -> dict[str, int]:
        """{REPLICATED: 0}: this rank leaves its replicated state to rank 0's copy of the same
        step (its manifest keeps its own checksum, which the reader checks); {} to write it.

        Nothing waits for rank 0. Instead each save checks the previous shared step: had rank 0's
        copy another checksum, that step will not verify for this rank (a restore falls back
        past it), and from then on this rank writes its own copy and says why, once.
        """
        if not self.enabled or rank == 0:
            return {}
        if self._last_shared is not None:
            shared_step, shared_entry = self._last_shared
            try:
                theirs = mf.read_manifest(
                    mf.rank_dir(self.tier.root(where), shared_step, 0), self.job_id
                ).files.get(REPLICATED)
            except mf.CheckpointInvalid:
                theirs = shared_entry  # not there (failed, pruned, being replaced): nothing learned
            if theirs != shared_entry:
                self.enabled = False
                self.emit(
                    "tier-warning",
                    tier=self.tier.name,
                    step=shared_step,
                    error=f"replicated state of rank {rank} differs from rank 0's",
                    message="data-parallel ranks diverged, or state registered as replicated is per "
                    "rank: that step will not restore; this rank now writes its own copy",
                )
        return {REPLICATED: 0} if self.enabled else {}

    def remember(self, written: Path, step: int) -> None:
        """What the next save checks: this step's shared entry (None when nothing was shared)."""
        try:
            manifest = mf.Manifest.from_json((written / mf.MANIFEST).read_text(), written)
        except (OSError, mf.CheckpointInvalid):
            manifest = None
        shared = manifest is not None and REPLICATED in manifest.shared
        self._last_shared = (step, manifest.files[REPLICATED]) if shared else None


class TierLane(Lane):
    """The lane of one tier: its worker thread and what that tier's saves carry from one job to
    the next."""

    def __init__(
        self, tier: Tier, config: TierConfig, emit: Emit, work: Callable[[TierLane, Commit], None]
    ) -> None:
        self.tier = tier
        self.warnings = Warnings(tier, emit)
        self.replicated = ReplicatedOnce(tier, config, emit) if tier.shared else None
        super().__init__(tier.name, lambda job: work(self, job))


class Pins:
    """The steps of the first tier that pruning must keep: those a later lane is still copying
    (counted), and in flush mode every step from the oldest one present on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[int, int] = {}
        self._hold_from: int | None = None
        self._hold_until = 0.0

    @property
    def holding(self) -> bool:
        """Flush mode: no step from the held one on is pruned, and no commit is dropped."""
        return self._hold_from is not None

    def pin(self, step: int) -> None:
        with self._lock:
            self._counts[step] = self._counts.get(step, 0) + 1

    def unpin(self, step: int) -> None:
        with self._lock:
            n = self._counts.get(step, 0) - 1
            if n <= 0:
                self._counts.pop(step, None)
            else:
                self._counts[step] = n

    def hold(self, root: Path, rank: int, timeout_s: float) -> list[int]:
        """Enter flush mode: the steps ``rank`` has complete under ``root``; from the oldest of
        them on nothing is pruned until ``end_hold``, or the timeout (a flush that never comes
        back ends)."""
        with self._lock:
            held = [s for s in mf.steps_in(root) if (mf.rank_dir(root, s, rank) / mf.MANIFEST).exists()]
            self._hold_from = min(held) if held else None
            self._hold_until = time.monotonic() + timeout_s
        return held

    def end_hold(self) -> None:
        with self._lock:
            self._hold_from = None

    def prune(self, tier: Tier, where: Where, keep: int, owner: int) -> None:
        """``tier.prune`` sparing every pinned and held step, under the lock ``hold`` lists the
        steps with: a step is never listed for a flush and then pruned."""
        with self._lock:
            if self._hold_from is not None and time.monotonic() > self._hold_until:
                self._hold_from = None
            pinned = set(self._counts)
            if self._hold_from is not None:
                pinned |= {s for s in mf.steps_in(tier.root(where)) if s >= self._hold_from}
            tier.prune(where, keep, pinned, owner=owner)
