"""In-process recovery: the agent inside each rank process.

Per generation: wait for a plan that includes this process, form the process group on the
supervisor's store, agree with the others on the step to resume and fetch missing state
from peers, then call ``train``. When ``train`` raises (a peer died and the collective
failed, or user code raised), report it, tear the group down and wait for the next plan:
the process, its imported modules and its snapshots stay alive.

A warm spare or standby runs the same code: it imports torch and the user's script, then
waits here for a plan that gives it a rank (and, a standby, its local rank)."""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import signal
import statistics
import threading
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group, _set_pg_timeout

from resilience import fsdp
from resilience.agent import blame, faults
from resilience.agent.abort import GroupSockets
from resilience.agent.commits import CommitPipeline
from resilience.agent.heartbeat import GenerationWatch, Heartbeat
from resilience.agent.rank_parts import RankParts
from resilience.agent.step_timer import StepTimer
from resilience.agent.commits import Paused
from resilience.context import Context
from resilience.ddp import deterministic_by_default
from resilience.errors import RegistrationError
from resilience.contract import liveness
from resilience.contract.messages import Plan, RecoveryInfo, Report, RunStats
from resilience.contract.run_store import RunStore
from resilience.contract.rank_env import RankEnv
from resilience.state import snapshot
from resilience.state.replication import (
    KEEP_OWN, BuddyReplicator, Holdings, RecoveryPlan, SnapshotRing, Unrecoverable, broadcast_snapshot, plan_rank_parts,
    plan_recovery, recv_snapshot, send_snapshot, send_state,
)
from resilience.tiers.agent import TierAgent
from resilience.tiers.restore import Restored

log = logging.getLogger("resilience")


class Agent(CommitPipeline):
    """Lives as long as the process; carries snapshots from one generation to the next."""

    def __init__(self, env: RankEnv) -> None:
        self.env = env
        self.store = RunStore.connect(env.store_host, env.store_port)
        self._liveness = (liveness.announce(env.store_host, env.liveness_port, env.slot, env.step_id)
                          if env.liveness_port else None)
        self.own = {"replicated": SnapshotRing(KEEP_OWN), "sharded": SnapshotRing(KEEP_OWN)}
        self.replicas: dict[int, SnapshotRing] = {}
        self.parts = RankParts()
        self._changed_warned: set[str] = set()
        self.sharded = False
        self._shard_world, self._shard_rank = 0, -1  # where the held shards were made (Holdings)
        self._twins: tuple[int, ...] = ()  # ranks whose shards are this rank's too (HSDP)
        elastic = env.elastic
        self._batch_settings = (elastic.batch_policy, elastic.lr_scaling) if elastic is not None else None
        self._resizable = elastic is not None and elastic.elastic  # only then a pause is asked before each step
        self.plan: Plan | None = None
        self.rank = -1
        self.state_group: dist.ProcessGroup | None = None
        self.replicator: BuddyReplicator | None = None
        self._live: Context | None = None
        self._in_commit = False
        self._capture: threading.Thread | None = None
        self._capture_error: BaseException | None = None
        self._commits_this_generation = 0
        self._step_times: list[float] = []
        """Commit to commit, every generation's first step left out (it pays for warm-up and re-entry)."""
        self._timer = StepTimer(self.store, env.slot, 0)  # one per generation, from its start
        self._slow = faults.SlowNode(self.store, env.node, env.injections)
        self._watch = GenerationWatch()
        self._heartbeat = Heartbeat(self.store, env.slot, env.heartbeat_s, self._watch)
        self.tiers = TierAgent.create(env.tiers, self.store, env.slot, env.node, lambda: self.rank, env.store_host,
                                      env.node_name)

    # --- the generation loop --------------------------------------------------------------

    def run(self, train: Callable[[Context], None]) -> None:
        self._heartbeat.start()
        self._relay_preemption()
        if self.env.deterministic_ddp:
            deterministic_by_default()
        _warm_up()
        # Everything imported so far lives as long as the process: keep it out of the
        # collector's way, so that the collection at each teardown scans only new objects
        # (measured: 0.2-0.3 s per collection without this, on the recovery path).
        gc.freeze()
        self.store.mark_ready(self.env.slot)  # warm: a growing world may take it now
        generation = 0
        try:
            while True:
                plan = self.store.wait_plan(self.env.slot, generation)
                if plan is None:
                    return  # shutdown: a spare that was never needed, or the run ended
                generation = plan.generation
                if self._one_generation(plan, train):
                    return
        finally:
            self._heartbeat.stop()
            if self.tiers is not None:
                self.tiers.close()

    def _relay_preemption(self) -> None:
        """``scancel --signal=USR2``, and a lent node's SIGTERM (Slurm takes it back), reach the steps,
        not the supervisor: pass them on, from the heartbeat thread (not from inside a store call)."""
        relays = {self.env.preempt_signal_name: self._heartbeat.preempted}
        if self.env.reclaim_signal:
            relays[self.env.reclaim_signal_name] = self._heartbeat.reclaimed
        for name, event in relays.items():
            try:
                signal.signal(getattr(signal, name), lambda *_, event=event: event.set())
            except ValueError:  # not the main thread
                log.warning("cannot catch %s here: it reaches this rank unannounced", name)

    def _one_generation(self, plan: Plan, train: Callable[[Context], None]) -> bool:
        """Run ``train`` in this generation; True when training finished everywhere."""
        self.plan, self.rank = plan, plan.rank_of(self.env.slot)
        local_rank = os.environ["LOCAL_RANK"] = str(plan.slots[self.env.slot].local_rank)  # a standby's is new
        self._inject(faults.due(self.env.injections, generation=plan.generation, rank=self.rank,
                                node=self.env.node, kinds=("kill", "node")))
        if not self.store.join(plan):
            return False  # a later fault superseded this generation: go to the newest plan
        failure: Report | None = None
        try:
            self._form(plan)
            recovery, restored = self._recover(plan)
            ctx = Context(rank=self.rank, world_size=plan.world_size, local_rank=int(local_rank),
                          generation=plan.generation, step=recovery.step, restored=restored, runtime=self,
                          log_dir=self.env.log_dir, batch_settings=self._batch_settings,
                          restore_rng=self.env.restore_rng)
            self._live = ctx
            self._timer = StepTimer(self.store, self.env.slot, plan.generation)
            self._timer.activate()
            train(ctx)
            ctx.boundary()
            digest = snapshot.fingerprint({k: v for k, v in ctx.states().items() if k != "rank"})
            self._wait_background()
            if self.tiers is not None:
                self.tiers.saver.wait_idle(self.env.collective_timeout_s)
            dist.barrier()  # every rank finished: nobody will need our state any more
        except Paused:
            failure = self._leave_at_boundary()
        except RegistrationError as err:  # the same on every entry: retrying cannot help
            failure = Report("refused", self.rank, message=str(err), error_type=blame.error_type(err))
        except Unrecoverable as err:
            failure = Report("unrecoverable", self.rank, message=str(err), traceback=traceback.format_exc(),
                             error_type=blame.error_type(err))
        except Exception as err:  # noqa: BLE001 - every failure of a generation is reported
            where = blame.origin(err, released=self._watch.released())
            failure = Report("error", self.rank, message=f"{type(err).__name__}: {err}",
                             traceback=traceback.format_exc(), collateral=where != blame.OWN, origin=where,
                             error_type=blame.error_type(err), step=_failed_at(self._live))
        finally:
            ctx = restored = None  # noqa: F841 - drop references to user objects (DDP holds the group)
        if failure is not None:
            # Report first: the supervisor orders reports, and the first one names the cause.
            self._report(failure)
            self._teardown()
            return False
        if self.rank == 0 and self._step_times:
            self.store.publish_stats(RunStats(statistics.median(self._step_times)))
        self._timer.publish()  # before "done": the supervisor's account reads every step
        self._report(Report("done", self.rank, digest=digest))
        self._teardown()
        return True

    def _leave_at_boundary(self) -> Report:
        """Every rank stopped before the same step: finish background copies, meet once more
        (no collective of this generation is left in flight), then leave."""
        try:
            self._wait_background()
            dist.barrier(group=self.state_group)
        except Exception as err:  # noqa: BLE001 - a fault during the pause: reported as one
            where = blame.origin(err, released=self._watch.released())
            return Report("error", self.rank, message=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(),
                          collateral=where != blame.OWN, origin=where, error_type=blame.error_type(err))
        return Report("paused", self.rank)

    # --- forming a generation -----------------------------------------------------------------

    def _form(self, plan: Plan) -> None:
        store = self.store.group_store(plan.generation)
        sockets = GroupSockets()
        self._watch.enter(plan.generation, self.env.backend, sockets, [])
        with sockets:
            dist.init_process_group(self.env.backend, store=store, rank=self.rank, world_size=plan.world_size,
                                    timeout=timedelta(seconds=self.env.reform_timeout_s))
            # State traffic (recovery, buddy copies) uses its own gloo group: CPU buffers, and a
            # background thread that must not interleave with the training collectives.
            self.state_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=self.env.reform_timeout_s))
        self._watch.enter(plan.generation, self.env.backend, sockets,
                          [_get_default_group(), self.state_group])
        self._commits_this_generation = 0
        self.parts.enter(plan.world_size)
        fsdp.forget_old_meshes()  # this process's rank may have changed
        if self.tiers is not None:
            self.tiers.enter(plan, self.rank)

    def _recover(self, plan: Plan) -> tuple[RecoveryPlan, dict[str, Any] | None]:
        """Agree on the step, move missing state between ranks; return what to load."""
        started, formed_t = time.perf_counter(), time.time()
        self._wait_background(raise_errors=False)
        live_step, live = self._take_live()
        own = self.own["replicated"].steps() or ((live_step,) if live is not None else ())
        mine = Holdings(self.rank, own=own, shards=self.own["sharded"].steps(),
                        replicas={o: r.steps() for o, r in self.replicas.items()}, sharded=self.sharded,
                        shard_world=self._shard_world, shard_rank=self._shard_rank, twins=self._twins,
                        **self.parts.holdings(self.rank, plan.world_size))
        gathered: list[Holdings | None] = [None] * plan.world_size
        dist.all_gather_object(gathered, mine, group=self.state_group)
        recovery, tiered = self._plan(plan, gathered)
        moved = self._transfer(plan, recovery, live)
        if tiered is None:
            mine = self.parts.recover(recovery.rank_parts, recovery.step, self.rank, plan.world_size,
                                      self.state_group)
        else:  # the tiers' copy of this rank's part (adopted by _plan)
            mine = snapshot.materialize(tiered.snaps["rank"]) if "rank" in tiered.snaps else {}
        resharded = self._reshard(recovery) if recovery.reshard else {}
        if tiered is not None and not tiered.snaps:
            restored = dict(tiered.states)  # resharded from another world size
        else:
            restored = self._restored_state(recovery.step, live_step, live)
            if restored is not None:
                restored.update(resharded)
                restored.update(mine)
        _set_pg_timeout(timedelta(seconds=self.env.collective_timeout_s))
        _set_pg_timeout(timedelta(seconds=self.env.collective_timeout_s), self.state_group)
        moved_total = [0] * plan.world_size
        dist.all_gather_object(moved_total, moved, group=self.state_group)
        if self.rank == 0:
            self._publish_recovery(plan, recovery, tiered, sum(moved_total) // 2, started, formed_t)
        return recovery, restored

    def _transfer(self, plan: Plan, recovery: RecoveryPlan, live: dict[str, Any] | None) -> int:
        """Send and receive replicated state and shards as ``recovery`` says; bytes moved here."""
        moved = 0
        midway = faults.transfer_hook(self.env.injections, self.store, self.rank, plan.world_size, recovery.step)
        for t in recovery.transfers:
            if t.src == self.rank:
                ring = self.own[t.part] if t.owner == self.rank else self.replicas[t.owner]
                snap = ring.get(recovery.step)
                if snap is not None:
                    moved += send_snapshot(snap, t.dst, self.state_group, midway)
                else:  # straight from the previous generation's objects: no copy first
                    skeleton, tensors, sizes = snapshot.describe(live)
                    moved += send_state(recovery.step, skeleton, tensors, sizes, t.dst, self.state_group, midway)
            elif t.dst == self.rank:
                snap = recv_snapshot(t.src, self.state_group)
                moved += snap.nbytes
                self.own[t.part].put(snap)
                if t.part == "sharded":
                    self.sharded = True
                    self._shard_world, self._shard_rank = plan.world_size, self.rank
        for ring in self.own.values():
            ring.drop_after(recovery.step)
        return moved

    def _publish_recovery(self, plan: Plan, recovery: RecoveryPlan, tiered: Restored | None, peer_bytes: int,
                          started: float, formed_t: float) -> None:
        """Rank 0 tells the supervisor how the generation recovered (its ``recovered`` event)."""
        inexact = tiered.inexact if tiered is not None else recovery.inexact
        if inexact:
            self.store.push_event("inexact", step=recovery.step, ranks=list(inexact),
                                  why="their random streams and data positions of that step were lost")
        self.store.publish_recovery(plan.generation, RecoveryInfo(
            step=recovery.step,
            source=tiered.source if tiered is not None else ("peer" if recovery.transfers else "self"),
            bytes=tiered.bytes_moved if tiered is not None else peer_bytes,
            recover_s=time.perf_counter() - started, formed_t=formed_t, recovered_t=time.time()))

    def _reshard(self, recovery: RecoveryPlan) -> dict[str, Any]:
        """The world changed since the shards were made: every old shard is broadcast by a
        holder, each rank rebuilds its own from all of them (``ShardedOptimizer`` takes
        ``{"shards": [...]}``). Every rank keeps them all as replicas until its first commit in
        this world, so a fault before then reshards again."""
        self.sharded = True  # a rank that just joined has held no shard yet
        shards: dict[int, snapshot.Snapshot] = {}
        for owner, holder in recovery.reshard:
            mine = None
            if holder == self.rank:
                own = self.own["sharded"].get(recovery.step) if self._shard_rank == owner else None
                mine = own if own is not None else self.replicas[owner].get(recovery.step)
            shards[owner] = broadcast_snapshot(mine, holder, self.state_group)
        self.own["sharded"].clear()
        self.replicas.clear()
        for owner, snap in shards.items():
            self.replicas.setdefault(owner, SnapshotRing()).put(snap)
        self._shard_rank = -1
        states = [snapshot.materialize(shards[o], copy=True) for o in sorted(shards)]
        return {name: {"shards": [s[name] for s in states]} for name in states[0]}

    def _plan(self, plan: Plan, gathered: list[Holdings | None]) -> tuple[RecoveryPlan, Restored | None]:
        """The peers' recovery plan, or a restore from the tiers when they have a newer step.

        Peers' memory first: survivors hold the newest commit. The tiers serve when no peer
        holds any state (every rank process lost, a new job of the same id) or when peers
        cannot serve some rank's shard. Every rank decides alike (same gathered holdings), so
        all of them enter the collective restore or none does.
        """
        holdings = {h.rank: h for h in gathered if h is not None}
        try:
            recovery, peer_error = plan_recovery(plan.world_size, holdings, self.env.replication_factor), None
            parts, inexact = plan_rank_parts(recovery.step, plan.world_size, holdings)
            recovery = dataclasses.replace(recovery, rank_parts=parts, inexact=inexact)
        except Unrecoverable as err:
            recovery, peer_error = RecoveryPlan(-1), err
        tiered = None
        if self.tiers is not None and (peer_error is not None or recovery.step < 0 or recovery.inexact):
            # Some rank's own part of the peers' step is lost: an older step the tiers hold whole is exact.
            tiered = self.tiers.restore(plan, self.state_group, -1 if recovery.inexact else recovery.step)
        if tiered is None:
            if peer_error is not None:
                raise peer_error
            return recovery, None
        for kind, ring in self.own.items():
            ring.clear()
            if kind in tiered.snaps:
                ring.put(tiered.snaps[kind])
        self.parts.adopt(tiered.snaps.get("rank"), self.rank, plan.world_size)
        if "sharded" in tiered.snaps:
            self._shard_world, self._shard_rank = plan.world_size, self.rank
        self.sharded = "sharded" in tiered.snaps or any(
            isinstance(v, dict) and "shards" in v for v in tiered.states.values())
        return RecoveryPlan(tiered.step), tiered

    def _take_live(self) -> tuple[int, dict[str, Any] | None]:
        """The previous generation's registered state, if it is the last clean commit.

        Data-parallel state is not copied at every commit: the registered objects of the
        failed generation hold exactly the last commit, unless the fault cut a commit off
        (then this rank gets the state from a peer). Sharded runs snapshot every commit
        instead, since their buddies may force a rollback to the commit before.
        """
        ctx, self._live = self._live, None
        dirty, self._in_commit = self._in_commit, False
        if self.sharded or ctx is None:
            return -1, None
        self.own["replicated"].clear()
        if dirty or ctx.step < 0 or not ctx.matches_commit():
            return -1, None  # cut off inside a commit, or changed in place since: a peer's copy serves
        return ctx.step, ctx.states()["replicated"]

    def _restored_state(self, step: int, live_step: int, live: dict[str, Any] | None) -> dict[str, Any] | None:
        if step < 0:
            return None
        if live is not None and live_step == step and self.own["replicated"].get(step) is None:
            return dict(live)  # the old objects' own state dicts: no copy at all
        restored: dict[str, Any] = {}
        for ring in self.own.values():
            snap = ring.get(step)
            if snap is not None:
                # Kept snapshots (sharded runs: rollback) are copied; others are used once.
                restored.update(snapshot.materialize(snap, copy=self.sharded))
        if not self.sharded:
            self.own["replicated"].clear()
        return restored

    # --- leaving a generation -------------------------------------------------------------------

    def _report(self, report: Report) -> None:
        try:
            self.store.report(self.plan.generation, self.env.slot, report)
        except Exception as err:  # noqa: BLE001 - the supervisor still sees the process state
            log.warning("could not report %s to the supervisor: %s", report.kind, err)

    def _teardown(self) -> None:
        """Leave the generation's process groups so that peers blocked on us are released.

        Our side of every connection is shut down first (see resilience/abort.py): a gloo
        group that user objects (DDP) still reference keeps its connections open after
        ``destroy_process_group``, and a peer blocked in a collective with us would wait.
        """
        self._watch.release_now()  # peers blocked on us fail now, not at a timeout
        self._timer.publish()
        self._timer.deactivate()
        self._wait_background(raise_errors=False)
        self._watch.leave()
        self.replicator = None
        self.state_group = None
        gc.collect()  # cheap after gc.freeze(): drops the failed train's objects (DDP, graph)
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as err:  # noqa: BLE001
                log.debug("destroy of the process group failed: %s", err)


def _warm_up() -> None:
    """Pay the first-use costs (lazy imports behind the optimizer and autograd, allocator
    growth) now, while nothing waits for this process: a warm spare that pays them after it
    is given a rank makes every survivor wait in DDP's first broadcast (measured: 1.1 s)."""
    import torch

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    opt.zero_grad()
    states = snapshot.materialize(snapshot.capture({"model": model.state_dict(), "opt": opt.state_dict()}, 0))
    model.load_state_dict(states["model"])
    opt.load_state_dict(states["opt"])


def _failed_at(ctx: Context | None) -> int | None:
    """The step a rank's own error belongs to: the one being trained, else the one ``train`` was
    about to start (an error while registering recurs there too); None outside ``train``."""
    if ctx is None:
        return None
    return ctx._current if ctx._current is not None else ctx.step + 1

