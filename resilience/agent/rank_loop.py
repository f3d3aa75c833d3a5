"""In-process recovery: the agent inside each rank process.

Per generation: wait for a plan that includes this process, form the process group on the
supervisor's store, agree with the others on the step to resume and fetch missing state
from peers, then call ``train``. When ``train`` raises (a peer died and the collective
failed, or user code raised), report it, tear the group down and wait for the next plan:
the process, its imported modules and its snapshots stay alive. A ``RegistrationError`` (state
sres could not bring back) is reported as ``refused``: it would be the same on every entry, so the
run stops at once.

A warm spare or standby runs the same code: it imports torch and the user's script, then
waits here for a plan that gives it a rank (and, a standby, its local rank)."""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
import traceback
from collections.abc import Callable

import torch.distributed as dist

from resilience.agent import blame, formation, group_guard, recovery
from resilience.agent.commits import CommitPipeline, Paused
from resilience.agent.heartbeat import GenerationWatch, Heartbeat
from resilience.agent.kept import Kept
from resilience.agent.requeue_hooks import RequeueHook, RequeueHooks
from resilience.agent.states import RankState
from resilience.agent.warm_up import warm_up
from resilience.context import Context, dtensors_loaded
from resilience import fork_server
from resilience.contract import hello, run_secret
from resilience.contract.lease import fence
from resilience.contract.link import RankLink
from resilience.contract.messages import Plan, Report
from resilience.contract.rank_env import RankEnv
from resilience.contract.run_store import RunStore
from resilience.open_files import raise_open_files_limit
from resilience.ddp import deterministic_by_default
from resilience.errors import CommitOrderError, Fenced, RegistrationError, Unrecoverable
from resilience.rank_place import RankPlace, place_of, torch_variables
from resilience.data.batch_link import BatchLink
from resilience.data.producer import node_cache
from resilience.tiers.agent import TierAgent

log = logging.getLogger("resilience")


class Agent:
    """Lives as long as the process; carries snapshots from one generation to the next."""

    def __init__(self, env: RankEnv, batches: bool = False) -> None:
        self.env = env
        raise_open_files_limit()  # gloo's listener accepts anyone: room before EMFILE ends the rank
        self._batches = batches
        """``resilience.run(train, batches=...)``: a batch cache of this node has a producer."""
        key = run_secret.store_key(env.run_secret, env.store_nonce) if env.run_secret else ""
        self.store = RunStore.connect(env.store_host, env.store_port, key)
        # Every store connection first, then the hello: the lease it grants runs out unless lines
        # are echoed, and a connection can wait 5 s on a silent nameserver (torch's client asks the
        # name of the address it connects to), which fenced healthy ranks before their first step.
        beats = self.store.clone()
        self._liveness = self._link(env, beats)
        self._watch = GenerationWatch()
        self._heartbeat = Heartbeat(self.store, beats, env.slot, env.heartbeat_s, self._watch, self._liveness)
        self._heartbeat.start()  # beat from here: on a loaded machine what follows takes seconds
        self.state = RankState.STARTING
        self.kept = Kept()
        elastic = env.elastic
        self._batch_settings = (elastic.batch_policy, elastic.lr_scaling) if elastic is not None else None
        self.plan: Plan | None = None
        self.rank = -1
        self.place: RankPlace | None = None
        self.state_group: dist.ProcessGroup | None = None
        self._live: Context | None = None
        self._requeue_hooks = RequeueHooks(self.store, env.slot)
        self.tiers = TierAgent.create(
            env.tiers,
            self.store,
            env.slot,
            env.node,
            lambda: self.rank,
            env.run_secret,
            env.store_host,
            env.node_name,
        )
        if self.tiers is not None and self._liveness is not None and self._liveness.lease is not None:
            self.tiers.saver.guard = self._liveness.lease.check  # so does every copy to a tier
        self.commits = CommitPipeline(
            env,
            self.store,
            self.kept,
            self.tiers,
            self._watch,
            elastic is not None and elastic.elastic,
            self._liveness,
        )

    def _link(self, env: RankEnv, beats: RunStore) -> RankLink | None:
        """This process's liveness connection (None: the supervisor gave it none). Waits are
        woken by the supervisor's notices, not polled, and every write to the store first asks
        the lease the supervisor's echoes renew (:mod:`resilience.contract.lease`)."""
        if not env.liveness_port:
            return None
        sock = hello.announce(env.store_host, env.liveness_port, env.slot, env.run_secret, env.step_id)
        link = RankLink(sock, env.run_secret, env.slot, env.lease_s)
        self.store.plans.notices = link.notices
        self.store.liveness.doorbell = self.store.events.doorbell = link.wrote
        if link.lease is not None:
            self.store.core.guard = beats.core.guard = link.lease.check  # each connection made before
        return link

    # --- the hooks ``Context`` calls: the commit pipeline's ---------------------------------------

    def before_step(self, step: int) -> None:
        self.commits.before_step(step)

    def before_commit(self) -> None:
        self.commits.before_commit()

    def after_commit(self, step: int, ctx: Context) -> None:
        self.commits.after_commit(step, ctx)

    def committed(self, step: int, ctx: Context, changed: list[str]) -> None:
        self.commits.committed(step, ctx, changed)

    # --- the generation loop --------------------------------------------------------------

    def run(self, train: Callable[[Context], None]) -> None:
        """Every generation given to this process; a write the lease refused ends it, as its thread would."""
        try:
            self._run(train)
        except Fenced as err:
            fence(str(err))

    def _run(self, train: Callable[[Context], None]) -> None:
        self._relay_preemption()
        if self.env.deterministic_ddp:
            deterministic_by_default()
        group_guard.install()
        if not self._awaited():
            warm_up()
        # Everything imported so far lives as long as the process: keep it out of the
        # collector's way, so that the collection at each teardown scans only new objects
        # (measured: 0.2-0.3 s per collection without this, on the recovery path).
        gc.freeze()
        self.store.liveness.mark_ready(self.env.slot, time.time())  # warm: a growing world may take it now
        generation = 0
        try:
            while True:
                self._enter(RankState.WAITING)
                plan = self.store.plans.wait_for(self.env.slot, generation)
                if plan is None:
                    return  # shutdown: a spare that was never needed, or the run ended
                generation = plan.generation
                if self._one_generation(plan, train):
                    return
        finally:
            self._enter(RankState.DONE)
            self._heartbeat.stop()
            if self.tiers is not None:
                self.tiers.close()

    def _awaited(self) -> bool:
        """Whether a published generation already gives this process a rank (a member at the
        start, a cold replacement): its peers wait for it now, and its first step pays the
        first-use costs (0.9 s) as a warm-up would. Only a spare or a standby, which nothing waits
        for yet, warms up: a job whose function needs no optimizer never pays them."""
        _, plan = self.store.plans.newest_plan()
        return plan is not None and plan.rank_of(self.env.slot) is not None

    def on_requeue(self, hook: RequeueHook) -> None:
        self._requeue_hooks.add(hook)

    def batch_link(self) -> BatchLink:
        """For a ``BatchCache`` registered by ``train``: its node's cache, whose producer the
        supervisor keeps running from the first ask on."""
        if self._batches:
            self.store.producers.want(self.env.node)
        root, job = node_cache(self.env)
        return BatchLink(root, job, self._batches, self.store.events.push)

    def _enter(self, state: RankState) -> None:
        log.debug("rank process %s: %s -> %s", self.env.slot, self.state.value, state.value)
        self.state = state

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
        for signum in fork_server.early_signals():  # came between the fork and now
            name = signal.Signals(signum).name
            if name in relays:
                relays[name].set()

    def _one_generation(self, plan: Plan, train: Callable[[Context], None]) -> bool:
        """Run ``train`` in this generation; True when training finished everywhere."""
        local_rank = self._take_rank(plan)
        self._enter(RankState.JOINING)
        failure: Report | None = None
        try:
            self._watch.joining = plan.generation
            try:
                joined = self.store.plans.join(plan, self.env.reform_timeout_s)
            finally:
                self._watch.joining = 0
            if not joined:
                return False  # a later fault superseded this generation: go to the newest plan
            digest = self._train_generation(plan, local_rank, train)
        except Paused:
            failure = self._leave_at_boundary()
        except Fenced:
            raise  # not a fault to report: nothing may be written any more
        except Exception as err:  # noqa: BLE001 - every failure of a generation is reported
            failure = self._failure(err)
        self._enter(RankState.LEAVING)
        if failure is not None:
            # Report first: the supervisor orders reports, and the first one names the cause.
            self._report(failure)
            self._teardown()
            return False
        self.commits.publish_times()  # before "done": the supervisor's account reads every step
        self._report(Report("done", self.rank, digest=digest))
        self._teardown()
        return True

    def _take_rank(self, plan: Plan) -> int:
        """This process's rank and local rank in ``plan`` (a standby's local rank is new); the
        injections due as it joins fire here."""
        self.place = place_of(plan, self.env.slot)  # wait_plan gave a plan that holds this slot
        self.plan, self.rank = plan, self.place.rank
        os.environ.update(torch_variables(self.place, self.env.store_host, self.env.store_port))
        self.commits.take(plan, self.rank)
        return self.place.local_rank

    def _train_generation(self, plan: Plan, local_rank: int, train: Callable[[Context], None]) -> str:
        """Form, recover, run ``train`` and wait for every rank to finish; the fingerprint of
        the state this rank ends with."""
        ctx = restored = None
        try:
            self._enter(RankState.FORMING)
            state_group = self._form(plan)
            self._enter(RankState.RECOVERING)
            step, restored = self._recover(plan, state_group)
            self._requeue_hooks.clear()  # this entry of train adds its own
            ctx = Context(
                rank=self.rank,
                world_size=plan.world_size,
                local_rank=local_rank,
                generation=plan.generation,
                step=step,
                restored=restored,
                runtime=self,
                log_dir=self.env.log_dir,
                batch_settings=self._batch_settings,
                restore_rng=self.env.restore_rng,
                place=self.place,
                resizable=self.env.elastic is not None and self.env.elastic.elastic,
            )
            self._live = ctx
            self.commits.start_training()
            self._enter(RankState.TRAINING)
            with group_guard.training():
                train(ctx)
            ctx.boundary()
            digest = ctx.state_digest()
            self.commits.wait_background()
            if self.tiers is not None:
                if ctx.step >= 0:
                    self.tiers.saver.save_last(ctx.step, ctx.states())
                self.tiers.saver.wait_idle(self.env.collective_timeout_s)
            dist.barrier()  # every rank finished: nobody will need our state any more
            return digest
        finally:
            ctx = restored = None  # noqa: F841 - drop references to user objects (DDP holds the group)

    def _failure(self, err: Exception) -> Report:
        """The report of a generation that ended with ``err`` (called while it is handled)."""
        if isinstance(err, (RegistrationError, CommitOrderError)):  # the same on every entry: no retry
            return Report("refused", self.rank, message=str(err), error_type=blame.error_type(err))
        if isinstance(err, Unrecoverable):
            return Report(
                "unrecoverable",
                self.rank,
                message=str(err),
                traceback=traceback.format_exc(),
                error_type=blame.error_type(err),
            )
        return self._error_report(err, step=_failed_at(self._live))

    def _error_report(self, err: Exception, step: int | None = None) -> Report:
        """An ``error`` report: whose fault ``err`` is, and the step it belongs to."""
        where = blame.origin(err, released=self._watch.released())
        return Report(
            "error",
            self.rank,
            message=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(),
            collateral=where != blame.OWN,
            origin=where,
            error_type=blame.error_type(err),
            step=step,
        )

    def _leave_at_boundary(self) -> Report:
        """Every rank stopped before the same step: finish background copies, meet once more
        (no collective of this generation is left in flight), then leave."""
        try:
            self.commits.wait_background()
            dist.barrier(group=self.state_group)
        except Exception as err:  # noqa: BLE001 - a fault during the pause: reported as one
            return self._error_report(err)
        return Report("paused", self.rank)

    # --- forming a generation -----------------------------------------------------------------

    def _form(self, plan: Plan) -> dist.ProcessGroup:
        self.state_group = formation.form(plan, self.rank, self.env, self.store, self._watch)
        self.commits.enter(self.state_group)
        self.kept.parts.enter(plan.world_size)
        if dtensors_loaded():
            from resilience import fsdp

            fsdp.forget_old_meshes()  # this process's rank may have changed
        if self.tiers is not None:
            self.tiers.enter(plan, self.rank)
        return self.state_group

    def _recover(self, plan: Plan, state_group: dist.ProcessGroup) -> tuple[int, recovery.State | None]:
        """Agree on the step and move what is missing (:mod:`resilience.agent.recovery`)."""
        self.commits.wait_background(raise_errors=False)
        ctx, self._live = self._live, None
        live = recovery.take_live(ctx, self.commits.cut_off(), self.kept)
        ctx = None
        scene = recovery.Scene(plan, self.rank, state_group, self.env, self.store, self.tiers)
        return recovery.recover(scene, self.kept, live)

    # --- leaving a generation -------------------------------------------------------------------

    def _report(self, report: Report) -> None:
        assert self.plan is not None, "only a process that took a rank reports"
        try:
            self.store.liveness.report(self.plan.generation, self.env.slot, report)
        except Exception as err:  # noqa: BLE001 - the supervisor still sees the process state
            log.warning("could not report %s to the supervisor: %s", report.kind, err)

    def _teardown(self) -> None:
        """Leave the generation's process groups so that peers blocked on us are released.

        Our side of every connection is shut down first (see resilience/abort.py): a gloo
        group that user objects (DDP) still reference keeps its connections open after
        ``destroy_process_group``, and a peer blocked in a collective with us would wait.
        """
        self._watch.release_now(self._watch.generation)  # peers blocked on us fail now, not at a timeout
        self.commits.leave()
        self._watch.leave()
        self.commits.forget_generation()
        self.state_group = None
        gc.collect()  # cheap after gc.freeze(): drops the failed train's objects (DDP, graph)
        formation.destroy()
        self._watch.left()


def _failed_at(ctx: Context | None) -> int | None:
    """The step a rank's own error belongs to: the one being trained, else the one ``train`` was
    about to start (an error while registering recurs there too); None outside ``train``."""
    if ctx is None:
        return None
    return ctx._current if ctx._current is not None else ctx.step + 1
