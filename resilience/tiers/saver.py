"""Asynchronous tiered saves: the training loop pays for one copy into reusable buffers.

``TierSaver.save(step, states)`` copies the state into one of two reusable buffer sets
(``snapshot.capture``; pinned memory where CUDA is present) and returns. Everything else runs
on one background lane per registered tier this job's saves feed (``Tier.saves``), in the
registry's order, cheapest first; each lane writes through its tier's ``Tier.write``
(:mod:`resilience.tiers.lanes`):

    capture -> first lane (RAM tier): write the state from the buffers, release them
            -> each later lane: copy the files the first lane wrote
               neighbour: push them to the next node's server (TCP)
               persistent: every K commits only (``Saving.every_commit``; ranks other than 0
                           leave their replicated state to rank 0's copy: data parallelism
                           writes the model once)

Later lanes read the first tier's files, not the buffers, so a slow shared filesystem never
holds a buffer; the first tier keeps a step (pinned) until they have copied it. Without the
RAM tier the persistent tier is the first lane and writes from the buffers. A failed copy is
a warning (an event; ``Saving``): training goes on, and the next save retries. Flushes (the
supervisor's "persist now", :mod:`resilience.tiers.flush`) go through the persistent lane.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from resilience.errors import Fenced
from resilience.state import snapshot
from resilience.state.snapshot import Snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.base import Tier, Where
from resilience.tiers.budget import CopyCost
from resilience.tiers.lanes import Commit, Emit, Pins, TierLane
from resilience.tiers.layout import NodeKey, TierConfig, own_root
from resilience.tiers.registry import PERSISTENT, TIERS
from resilience.tiers.transport import NeighbourLink

log = logging.getLogger("resilience")


@dataclass(frozen=True)
class TierPlace:
    """Who this rank is in the current generation, and where its neighbour copy goes."""

    rank: int
    world_size: int
    node: NodeKey
    """This rank's node's part of the RAM tier (``tiers.NodeKey``)."""
    neighbour: Callable[[], NeighbourLink | None] = lambda: None
    generation: int = 0


def fed_tiers(config: TierConfig) -> list[Tier]:
    """The tiers this job's saves write, cheapest first: the first writes each commit from the
    capture buffers, every other one copies the first one's files (the contract tests write
    each tier these ways)."""
    return [tier for tier in TIERS if tier.saves(config)]


class TierSaver:
    """The saving side of the tiers for one rank process; lives as long as the process."""

    def __init__(
        self,
        config: TierConfig,
        place: TierPlace,
        emit: Emit,
        node_root: Path | None = None,
        cost: CopyCost | None = None,
    ) -> None:
        self.config = config
        self.place = place
        self.emit = emit
        self._ram_base = node_root  # tests: another RAM root
        self._free: list[dict[str, Snapshot]] = []
        self._buffers_made = 0
        self._pins = Pins()
        self.last_written = -1
        """The newest step the first lane wrote (the RAM tier's)."""
        self.persisted: set[int] = set()
        lanes = [TierLane(tier, config, emit, self._measured) for tier in fed_tiers(config)]
        self._lanes = {lane.tier.name: lane for lane in lanes}
        self._first: TierLane | None = lanes[0] if lanes else None
        self._later = lanes[1:]
        self._persistent = self._lanes.get(PERSISTENT.name)
        """The lane flushes go through."""
        self.commits = 0
        self._carry_force = False
        self.every = config.ram_every
        """The RAM and neighbour tiers take the multiples of this step: ``ram_every``, or what the
        ranks agreed under the protection budget (:mod:`resilience.agent.protection`)."""
        self.cost = cost or CopyCost()
        """What the copies cost: the budget's measure (this node's neighbour server counts the
        copies it receives into it too)."""
        self.guard: Callable[[str], None] | None = None
        """The rank's lease check, asked before each copy and prune: a rank cut off from the
        supervisor past its lease writes and removes nothing (:mod:`resilience.contract.lease`)."""

    def lane(self, tier: str) -> TierLane | None:
        """The lane of tier ``tier``; None when this job's saves do not write it."""
        return self._lanes.get(tier)

    def _where(self) -> Where:
        """The tiers as this rank sees them now (the place changes between generations)."""
        place = self.place
        return Where(self.config, place.node, self._ram_base, place.neighbour, place.generation)

    # --- the blocking part ---------------------------------------------------------------------

    def save(
        self,
        step: int,
        states: Mapping[str, Mapping[str, Any]],
        force_persistent: bool = False,
        midway: Callable[[int], None] | None = None,
        reading: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        """Copy ``states`` (kind -> name -> state) into reusable buffers and queue the tiers.
        Blocks only for the copy; ``midway(step)`` runs half-way through it (fault injection).
        The copy reads ``states`` inside ``reading()`` only (:mod:`resilience.agent.live_read`)."""
        self.commits += 1
        persist = force_persistent or self._on_cadence(step)
        if not self.config.ram and not persist:
            return
        if self.config.ram and step % self.every and not persist:
            return  # by step number, so that every rank saves the same steps
        if self._pins.holding:
            self._first.wait_idle()  # flush mode: this commit must reach the RAM tier
        buffers = self._take_buffers()
        with self.cost.measure():
            try:
                with reading():
                    snaps = {
                        kind: snapshot.capture(states[kind], step, buffers.get(kind), midway)
                        for kind in states
                        if states[kind]
                    }
            except BaseException:  # no copy made (a closed read): its buffers serve the next one
                if buffers:
                    self._free.append(buffers)
                else:
                    self._buffers_made -= 1
                raise
            for kind, snap in snaps.items():
                if kind not in buffers and _pin_memory():
                    snaps[kind] = _pinned(snap)
        self.cost.protected()
        job = Commit(step, snaps=snaps, force=persist or self._carry_force)
        self._carry_force = False
        dropped = self._first.submit(job)
        if dropped is not None:
            job.force = job.force or dropped.force  # a K-th commit not yet written: persist the newer one
            self._release(dropped)

    def _take_buffers(self) -> dict[str, Snapshot]:
        if self._free:
            return self._free.pop()
        if self._buffers_made < 2:
            self._buffers_made += 1
            return {}
        pending = self._first.take_pending()  # newest wins: reuse the pending job's buffers
        if pending is not None:
            self._carry_force = pending.force
            return pending.snaps
        self._first.wait_idle()  # both sets busy: the RAM write is slower than a step
        return self._free.pop()

    def _release(self, job: Commit) -> None:
        if job.snaps is not None:
            self._free.append(job.snaps)
            job.snaps = None

    # --- the lanes ---------------------------------------------------------------------------------

    def _measured(self, lane: TierLane, job: Commit) -> None:
        """The budget counts the tiers it paces; the persistent tier keeps its own cadence."""
        if lane is self._persistent:
            self._run(lane, job)
            return
        with self.cost.measure():
            self._run(lane, job)

    def _run(self, lane: TierLane, job: Commit) -> None:
        """One tier's copy of one commit, on that tier's lane: the write, then what follows a
        copy (its events; from the first lane, the later lanes; retention)."""
        place, where = self.place, self._where()
        try:
            started = time.perf_counter()
            if self._fenced(f"write step {job.step} to the {lane.tier.name} tier"):
                self._release(job)
                return
            path = self._write(lane, job, place, where)
            if path is None or self._fenced(f"prune the {lane.tier.name} tier or feed the next"):
                return
            job.ok = True
            if lane is self._persistent:
                self.persisted.add(job.step)  # a flush of this step need not copy it again
            lane.warnings.succeeded(job.step)
            if lane.tier.saving.announce and place.rank == 0:
                self.emit(
                    "checkpoint-saved",
                    tier=lane.tier.name,
                    step=job.step,
                    seconds=time.perf_counter() - started,
                )
            if job.path is None:  # a commit captured: the later lanes copy this copy
                self._feed(job, path, where, place)
            elif (keep := lane.tier.keep(self.config)) is not None:
                lane.tier.prune(where, keep, owner=place.rank)
        finally:
            if job.path is not None:  # a copy of a copy: its source was pinned for it
                self._pins.unpin(job.step)
            if job.done is not None:
                job.done.set()

    def _fenced(self, what: str) -> bool:
        """Whether the lease forbids ``what`` now (the process is about to end itself)."""
        if self.guard is None:
            return False
        try:
            self.guard(what)
        except Fenced as err:
            log.warning("%s", err)
            return True
        return False

    def _write(self, lane: TierLane, job: Commit, place: TierPlace, where: Where) -> Path | None:
        """``Tier.write`` of the job's commit: the new copy, or None when the tier skipped it or
        the copy failed (a warning)."""
        try:
            share = lane.replicated.share(where, place.rank) if lane.replicated is not None else None
            try:
                path = lane.tier.write(where, job.step, place.world_size, place.rank, job.source, share)
            finally:
                self._release(job)
            if lane.replicated is not None and path is not None:
                lane.replicated.remember(path, job.step)
            return path
        except lane.tier.saving.failures as err:
            lane.warnings.failed(job.step, err)
            return None

    def _feed(self, job: Commit, path: Path, where: Where, place: TierPlace) -> None:
        """After the first tier's copy: each later lane copies it (pinned until that lane is
        done with it), then the first tier keeps its newest copies."""
        self.last_written = job.step
        for lane in self._later:
            if lane.tier.saving.every_commit or job.force:
                self._pins.pin(job.step)
                self._dropped(lane.submit(Commit(job.step, path=path)))
        keep = self._first.tier.keep(self.config)
        if keep is not None:
            self._pins.prune(self._first.tier, where, keep, place.rank)

    def _dropped(self, job: Commit | None) -> None:
        """A later lane's pending job replaced by a newer one: its step no longer pinned for it."""
        if job is not None:
            self._pins.unpin(job.step)
            if job.done is not None:
                job.done.set()

    # --- flush and wait --------------------------------------------------------------------------

    def _on_cadence(self, step: int) -> bool:
        """Whether ``step`` is one of every K-th the persistent tier takes."""
        return bool(self.config.persist_every and step % self.config.persist_every == 0)

    def save_last(self, step: int, states: Mapping[str, Mapping[str, Any]]) -> None:
        """The run's last commit to the persistent tier too, unless its cadence already took it:
        the trained state then exists on shared storage whether or not the script saves it (a
        60-step run persisted every 50th ended with step 50 there, not 59)."""
        if self.config.persistent_dir and not self._on_cadence(step):
            self.save(step, states, force_persistent=True)

    def flush_hold(self, timeout_s: float) -> tuple[int | None, str]:
        """First half of a flush: enter flush mode and return the newest step in this rank's
        RAM tier. In flush mode every commit is written (none dropped for a newer one) and no
        step from the oldest one present on is pruned, so that the step the supervisor then
        asks for (the newest any rank reported; ranks are at most a commit apart) is or will
        be here. Training goes on meanwhile."""
        if self._persistent is None:
            return None, "no persistent tier configured"
        if not self.config.ram:
            return None, "flush needs the RAM tier"
        if not self._first.wait_caught_up(timeout_s):
            return None, "the RAM tier write did not finish in time"
        held = self._pins.hold(self._own_root(), self.place.rank, timeout_s)
        if not held:
            return None, "nothing committed yet"
        return max(held), ""

    def flush_persistent(self, step: int, timeout_s: float) -> tuple[int | None, str]:
        """Second half of a flush: persist ``step`` (waiting for this rank to commit it, when
        it is one behind); (step, "") once it is complete on this rank, (None, why) otherwise.
        Leaves flush mode."""
        deadline = time.monotonic() + timeout_s
        try:
            if self._persistent is None:
                return None, "no persistent tier configured"
            if step in self.persisted and PERSISTENT.path(self._where(), step, self.place.rank).exists():
                return step, ""
            path = mf.rank_dir(self._own_root(), step, self.place.rank)
            while not (path / mf.MANIFEST).exists():
                if self.last_written > step or time.monotonic() > deadline:
                    return None, f"step {step} is not in the RAM tier of rank {self.place.rank}"
                time.sleep(0.02)
            job = Commit(step, path=path, done=threading.Event())
            self._pins.pin(step)
            self._dropped(self._persistent.submit(job))
            if not job.done.wait(max(0.0, deadline - time.monotonic())):
                return None, "the persistent write did not finish in time"
            return (
                (step, "") if job.ok else (None, "the persistent write failed (see the tier-warning event)")
            )
        finally:
            self._pins.end_hold()

    def _own_root(self) -> Path:
        """This rank's node's RAM tier (flushes copy from it)."""
        return own_root(self.config.job_id, self.place.node, self._ram_base)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until every lane is idle (end of training, tests, benchmarks)."""
        ok = True
        for lane in self._lanes.values():
            ok = lane.wait_idle(timeout_s) and ok
        return ok

    def wait_ram(self, timeout_s: float | None = None) -> bool:
        """Wait until the first lane (the RAM tier's) is idle: the capture buffers are free."""
        return self._first.wait_idle(timeout_s) if self._first is not None else True

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.stop()


def _pin_memory() -> bool:
    return torch.cuda.is_available()


def _pinned(snap: Snapshot) -> Snapshot:
    """The same snapshot in page-locked memory: device-to-host copies at full speed. Made once
    per buffer set; later captures reuse it."""
    return Snapshot(snap.step, snap.skeleton, {k: v.pin_memory() for k, v in snap.buffers.items()})
