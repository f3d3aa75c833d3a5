"""Asynchronous tiered saves: the training loop pays for one copy into reusable buffers.

``TierSaver.save(step, states)`` copies the state into one of two reusable buffer sets
(``snapshot.capture``; pinned memory where CUDA is present) and returns. Everything else runs
on one background lane per tier, each with at most one job in flight and one pending (a
newer job replaces a pending one: the newest state matters, and memory stays bounded at two
buffer sets plus the RAM tier's files):

    capture -> RAM lane: write own RAM-tier files (/dev/shm), release the buffers
            -> neighbour lane: push those files to the next node's server (TCP)
            -> persistent lane: copy them to the persistent directory every K commits
                               (ranks other than 0 leave their replicated state to rank
                               0's copy: data parallelism writes the model once)

The neighbour and persistent lanes read the RAM-tier files, not the buffers, so a slow
shared filesystem never holds a buffer. Failures of the neighbour and persistent tiers are
warnings (an event, once per failure streak): training goes on, and the next save retries.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from resilience.contract.messages import FlushDone
from resilience.contract.run_store import RunStore
from resilience.tiers import manifest as mf
from resilience.state import snapshot
from resilience.state.snapshot import Snapshot
from resilience.tiers.transport import push_checkpoint
from resilience.tiers.base import Where
from resilience.tiers.layout import NodeKey, TierConfig, own_root
from resilience.tiers.registry import NEIGHBOUR, PERSISTENT, RAM

log = logging.getLogger("resilience")

REPLICATED = "replicated.bin"

Emit = Callable[..., None]
"""``emit(event, **fields)``: a rank's event, for the supervisor's events.jsonl."""


@dataclass(frozen=True)
class RankPlace:
    """Who this rank is in the current generation, and where its neighbour copy goes."""

    rank: int
    world_size: int
    node: NodeKey
    """This rank's node's part of the RAM tier (``tiers.NodeKey``)."""
    neighbour_address: Callable[[], str | None] = lambda: None


class _Lane:
    """One tier's worker thread: one job in flight, one pending; a newer submit replaces the
    pending job (returned to the caller, which releases what it holds)."""

    def __init__(self, name: str, work: Callable[[Any], None]) -> None:
        self._work = work
        self._cond = threading.Condition()
        self._pending: Any = None
        self._busy = False
        self._stopped = False
        self.done_jobs = 0
        self._thread = threading.Thread(target=self._run, name=f"sres-tier-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: Any) -> Any:
        with self._cond:
            dropped, self._pending = self._pending, job
            self._cond.notify_all()
            return dropped

    def take_pending(self) -> Any:
        with self._cond:
            job, self._pending = self._pending, None
            return job

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._busy or self._pending is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopped:
                    self._cond.wait()
                if self._pending is None:
                    return
                job, self._pending, self._busy = self._pending, None, True
            try:
                self._work(job)
            except BaseException as err:  # noqa: BLE001 - a lane must survive one bad job
                log.warning("tier lane %s: %s", self._thread.name, err)
            finally:
                with self._cond:
                    self._busy = False
                    self.done_jobs += 1
                    self._cond.notify_all()


@dataclass
class _Job:
    step: int
    snaps: dict[str, Snapshot] | None = None  # RAM lane: the buffers to write
    path: Path | None = None  # later lanes: the RAM-tier checkpoint to copy
    force: bool = False  # persistent lane: a flush request (not a K-th commit)
    done: threading.Event | None = None
    ok: bool = False


class _Streak:
    """Warn once when a tier starts failing and once when it works again."""

    def __init__(self, tier: str, emit: Emit) -> None:
        self.tier, self.emit, self.failing = tier, emit, False

    def failed(self, step: int, err: BaseException) -> None:
        if not self.failing:
            self.failing = True
            self.emit("tier-warning", tier=self.tier, step=step, error=f"{type(err).__name__}: {err}",
                      message=f"{self.tier} tier save failed; training goes on, later saves retry")

    def succeeded(self, step: int) -> None:
        if self.failing:
            self.failing = False
            self.emit("tier-resumed", tier=self.tier, step=step)


class TierSaver:
    """The saving side of the tiers for one rank process; lives as long as the process."""

    def __init__(self, config: TierConfig, place: RankPlace, emit: Emit, node_root: Path | None = None) -> None:
        self.config = config
        self._share_replicated = config.persist_replicated_once
        self._last_shared: tuple[int, mf.FileEntry] | None = None
        self.place = place
        self.emit = emit
        self._ram_base = node_root  # tests: another RAM root
        self._where = Where(config, place.node, node_root)
        self._free: list[dict[str, Snapshot]] = []
        self._buffers_made = 0
        self._pin_lock = threading.Lock()
        self._pinned: dict[int, int] = {}
        self.last_written = -1
        self.persisted: set[int] = set()
        self._neighbour_streak = _Streak(NEIGHBOUR.name, emit)
        self._persistent_streak = _Streak(PERSISTENT.name, emit)
        self._ram_lane = _Lane(RAM.name, self._write_ram)
        self._neighbour_lane = _Lane(NEIGHBOUR.name, self._push_neighbour) if config.neighbour else None
        self._persistent_lane = _Lane(PERSISTENT.name, self._write_persistent) if config.persistent_dir else None
        self.commits = 0
        self._carry_force = False
        self._hold_from: int | None = None
        self._hold_until = 0.0
        """Flush mode: no step from this one on is pruned, and no commit is dropped."""

    # --- the blocking part ---------------------------------------------------------------------

    def save(self, step: int, states: Mapping[str, Mapping[str, Any]], force_persistent: bool = False) -> None:
        """Copy ``states`` (kind -> name -> state) into reusable buffers and queue the tiers.
        Blocks only for the copy."""
        self.commits += 1
        persist = force_persistent or bool(self.config.persist_every and step % self.config.persist_every == 0)
        if not self.config.ram and not persist:
            return
        if self.config.ram and step % self.config.ram_every and not persist:
            return  # by step number, so that every rank saves the same steps
        if self._hold_from is not None:
            self._ram_lane.wait_idle()  # flush mode: this commit must reach the RAM tier
        buffers = self._take_buffers()
        snaps = {kind: snapshot.capture(states[kind], step, buffers.get(kind)) for kind in states if states[kind]}
        for kind, snap in snaps.items():
            if kind not in buffers and _pin_memory():
                snaps[kind] = _pinned(snap)
        job = _Job(step, snaps=snaps, force=persist or self._carry_force)
        self._carry_force = False
        dropped = self._ram_lane.submit(job)
        if dropped is not None:
            job.force = job.force or dropped.force  # a K-th commit not yet written: persist the newer one
            self._release(dropped)

    def _take_buffers(self) -> dict[str, Snapshot]:
        if self._free:
            return self._free.pop()
        if self._buffers_made < 2:
            self._buffers_made += 1
            return {}
        pending = self._ram_lane.take_pending()  # newest wins: reuse the pending job's buffers
        if pending is not None:
            self._carry_force = pending.force
            return pending.snaps
        self._ram_lane.wait_idle()  # both sets busy: the RAM write is slower than a step
        return self._free.pop()

    def _release(self, job: _Job) -> None:
        if job.snaps is not None:
            self._free.append(job.snaps)
            job.snaps = None

    # --- background lanes ------------------------------------------------------------------------

    def _own_root(self) -> Path:
        return own_root(self.config.job_id, self.place.node, self._ram_base)

    def _write_ram(self, job: _Job) -> None:
        place = self.place
        try:
            if self.config.ram:
                path = mf.write(self._own_root(), self.config.job_id, job.step, place.world_size, place.rank, job.snaps)
            elif self._persistent_lane is not None:
                self._write_persistent_from(job)
                return
            else:
                return
        except OSError as err:
            self.emit("tier-warning", tier=RAM.name, step=job.step, error=f"{type(err).__name__}: {err}",
                      message="RAM tier save failed")
            return
        finally:
            if job.snaps is not None and self.config.ram:
                self._release(job)
        self.last_written = job.step
        if self._neighbour_lane is not None:
            self._pin(job.step)
            old = self._neighbour_lane.submit(_Job(job.step, path=path))
            if old is not None:
                self._unpin(old.step)
        if self._persistent_lane is not None and job.force:
            self._pin(job.step)
            old = self._persistent_lane.submit(_Job(job.step, path=path, done=job.done))
            if old is not None:
                self._unpin(old.step)
                if old.done is not None:
                    old.done.set()
        with self._pin_lock:  # a flush hold lists and pins steps under the same lock
            if self._hold_from is not None and time.monotonic() > self._hold_until:
                self._hold_from = None
            pinned = set(self._pinned)
            if self._hold_from is not None:
                pinned |= {s for s in mf.steps_in(self._own_root()) if s >= self._hold_from}
            RAM.prune(self._where, self.config.keep_ram, pinned, owner=place.rank)

    def _push_neighbour(self, job: _Job) -> None:
        try:
            address = self.place.neighbour_address()
            if address is None:
                return
            push_checkpoint(address, job.path, self.config.job_id, self.place.rank, job.step)
            self._neighbour_streak.succeeded(job.step)
        except (OSError, ValueError) as err:
            self._neighbour_streak.failed(job.step, err)
        finally:
            self._unpin(job.step)

    def _write_persistent(self, job: _Job) -> None:
        root = PERSISTENT.root(self._where)
        try:
            started = time.perf_counter()
            share = self._share_with_rank0(root)
            written = mf.copy_checkpoint(job.path, root, job.step, self.place.rank, fsync=self.config.fsync,
                                         share=share)
            self._remember_shared(written, job.step)
            self._persisted(job, root, started)
        except OSError as err:
            self._persist_failed(job, root, err)
        finally:
            self._unpin(job.step)
            if job.done is not None:
                job.done.set()

    def _write_persistent_from(self, job: _Job) -> None:
        """Persistent tier without a RAM tier: write straight from the buffers."""
        root = PERSISTENT.root(self._where)
        try:
            started = time.perf_counter()
            written = mf.write(root, self.config.job_id, job.step, self.place.world_size, self.place.rank, job.snaps,
                               fsync=self.config.fsync, share=self._share_with_rank0(root))
            self._remember_shared(written, job.step)
            self._persisted(job, root, started)
        except OSError as err:
            self._persist_failed(job, root, err)
        finally:
            self._release(job)
            if job.done is not None:
                job.done.set()

    def _share_with_rank0(self, root: Path) -> dict[str, int]:
        """{REPLICATED: 0}: this rank leaves its replicated state to rank 0's persistent copy of
        the same step (its manifest keeps its own checksum, which the reader checks); {} to
        write it.

        Nothing waits for rank 0. Instead each save checks the previous shared step: had rank 0's
        copy another checksum, that step will not verify for this rank (a restore falls back
        past it), and from then on this rank writes its own copy and says why, once.
        """
        if not self._share_replicated or self.place.rank == 0:
            return {}
        if self._last_shared is not None:
            shared_step, shared_entry = self._last_shared
            try:
                theirs = mf.read_manifest(mf.rank_dir(root, shared_step, 0), self.config.job_id).files.get(REPLICATED)
            except mf.CheckpointInvalid:
                theirs = shared_entry  # not there (failed, pruned, being replaced): nothing learned
            if theirs != shared_entry:
                self._share_replicated = False
                self.emit("tier-warning", tier=PERSISTENT.name, step=shared_step,
                          error=f"replicated state of rank {self.place.rank} differs from rank 0's",
                          message="data-parallel ranks diverged, or state registered as replicated is per "
                                  "rank: that step will not restore; this rank now writes its own copy")
        return {REPLICATED: 0} if self._share_replicated else {}

    def _remember_shared(self, written: Path, step: int) -> None:
        """What the next save checks: this step's shared entry (None when nothing was shared)."""
        try:
            manifest = mf.Manifest.from_json((written / mf.MANIFEST).read_text(), written)
        except (OSError, mf.CheckpointInvalid):
            manifest = None
        shared = manifest is not None and REPLICATED in manifest.shared
        self._last_shared = (step, manifest.files[REPLICATED]) if shared else None

    def _persisted(self, job: _Job, root: Path, started: float) -> None:
        job.ok = True
        self.persisted.add(job.step)
        self._persistent_streak.succeeded(job.step)
        if self.place.rank == 0:
            self.emit("checkpoint-saved", tier=PERSISTENT.name, step=job.step, seconds=time.perf_counter() - started)
        PERSISTENT.prune(self._where, self.config.keep_persistent, owner=self.place.rank)

    def _persist_failed(self, job: _Job, root: Path, err: OSError) -> None:
        # Leave nothing half-written behind (a full disk must not stay full of our debris).
        for tmp in mf.step_dir(root, job.step).glob(f"rank-{self.place.rank:05d}.tmp-*"):
            shutil.rmtree(tmp, ignore_errors=True)
        self._persistent_streak.failed(job.step, err)

    def _pin(self, step: int) -> None:
        with self._pin_lock:
            self._pinned[step] = self._pinned.get(step, 0) + 1

    def _unpin(self, step: int) -> None:
        with self._pin_lock:
            n = self._pinned.get(step, 0) - 1
            if n <= 0:
                self._pinned.pop(step, None)
            else:
                self._pinned[step] = n

    # --- flush and wait --------------------------------------------------------------------------

    def flush_hold(self, timeout_s: float) -> tuple[int | None, str]:
        """First half of a flush: enter flush mode and return the newest step in this rank's
        RAM tier. In flush mode every commit is written (none dropped for a newer one) and no
        step from the oldest one present on is pruned, so that the step the supervisor then
        asks for (the newest any rank reported; ranks are at most a commit apart) is or will
        be here. Training goes on meanwhile."""
        if self._persistent_lane is None:
            return None, "no persistent tier configured"
        if not self.config.ram:
            return None, "flush needs the RAM tier"
        if not self._ram_lane.wait_idle(timeout_s):
            return None, "the RAM tier write did not finish in time"
        root, rank = self._own_root(), self.place.rank
        with self._pin_lock:
            held = [s for s in mf.steps_in(root) if (mf.rank_dir(root, s, rank) / mf.MANIFEST).exists()]
            self._hold_from = min(held) if held else None
            self._hold_until = time.monotonic() + timeout_s  # a flush that never comes back ends
        if not held:
            return None, "nothing committed yet"
        return max(held), ""

    def flush_persistent(self, step: int, timeout_s: float) -> tuple[int | None, str]:
        """Second half of a flush: persist ``step`` (waiting for this rank to commit it, when
        it is one behind); (step, "") once it is complete on this rank, (None, why) otherwise.
        Leaves flush mode."""
        deadline = time.monotonic() + timeout_s
        try:
            if self._persistent_lane is None:
                return None, "no persistent tier configured"
            if step in self.persisted and PERSISTENT.path(self._where, step, self.place.rank).exists():
                return step, ""
            path = mf.rank_dir(self._own_root(), step, self.place.rank)
            while not (path / mf.MANIFEST).exists():
                if self.last_written > step or time.monotonic() > deadline:
                    return None, f"step {step} is not in the RAM tier of rank {self.place.rank}"
                time.sleep(0.02)
            done = threading.Event()
            job = _Job(step, path=path, done=done)
            self._pin(step)
            old = self._persistent_lane.submit(job)
            if old is not None:
                self._unpin(old.step)
                if old.done is not None:
                    old.done.set()
            if not done.wait(max(0.0, deadline - time.monotonic())):
                return None, "the persistent write did not finish in time"
            return (step, "") if job.ok else (None, "the persistent write failed (see the tier-warning event)")
        finally:
            with self._pin_lock:
                self._hold_from = None

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until every lane is idle (end of training, tests, benchmarks)."""
        ok = self._ram_lane.wait_idle(timeout_s)
        for lane in (self._neighbour_lane, self._persistent_lane):
            if lane is not None:
                ok = lane.wait_idle(timeout_s) and ok
        return ok

    def wait_ram(self, timeout_s: float | None = None) -> bool:
        return self._ram_lane.wait_idle(timeout_s)

    def close(self) -> None:
        for lane in (self._ram_lane, self._neighbour_lane, self._persistent_lane):
            if lane is not None:
                lane.stop()


def _pin_memory() -> bool:
    return torch.cuda.is_available()


def _pinned(snap: Snapshot) -> Snapshot:
    """The same snapshot in page-locked memory: device-to-host copies at full speed. Made once
    per buffer set; later captures reuse it."""
    return Snapshot(snap.step, snap.skeleton, {k: v.pin_memory() for k, v in snap.buffers.items()})


class FlushWatcher:
    """Answers the supervisor's "persist now" requests (``Supervisor.flush_persistent``).

    Polls the store on its own connection, so that a request is served even while training
    is blocked (no commit needed): the newest state in the RAM tier is what gets persisted.
    """

    def __init__(self, store: RunStore, saver: TierSaver, rank: Callable[[], int], poll_s: float = 0.25) -> None:
        self.store = store
        self.saver = saver
        self.rank = rank
        self.poll_s = poll_s
        self.seen = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sres-flush", daemon=True)

    def start(self) -> "FlushWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                request = self.store.flush_request()
                if request is None or request.id <= self.seen or self.rank() < 0:
                    continue
                self.seen = request.id
                if request.step is None:
                    step, why = self.saver.flush_hold(request.timeout_s)
                else:
                    step, why = self.saver.flush_persistent(request.step, request.timeout_s)
                self.store.answer_flush(request.id, self.rank(), FlushDone(step, why))
            except Exception as err:  # noqa: BLE001 - the store is gone: the run ended
                log.debug("flush watcher: %s", err)
                return
