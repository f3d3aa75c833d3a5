"""The commit pipeline of a rank: the hooks ``Context`` calls around each step and commit.

Before a step: a resize's pause, injected faults. At a commit: this rank's own part goes to its
buddies at once; at the step boundary after it (``committed``), what the commit protects is
final, and the background copies start: sharded snapshots and the tiers' copies, which read
live state and are joined before the next commit changes it; then the buddy copies, which read
the snapshot and are joined at the end of the next step. The pipeline owns what it needs: the
process's store, kept snapshots and tiers (given once), this generation's plan, rank and state
group (given by :meth:`CommitPipeline.take` and :meth:`CommitPipeline.enter`), and its own
background copies, step timer and step times; the agent (:mod:`resilience.agent.rank_loop`) holds one.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from resilience.agent import faults
from resilience.agent.heartbeat import GenerationWatch
from resilience.agent.kept import Kept
from resilience.agent.live_read import LiveRead
from resilience.agent.protection import Protection
from resilience.agent.step_timer import StepTimer
from resilience.contract.channels.plans import pause_check_every
from resilience.contract.link import RankLink
from resilience.context import Context
from resilience.contract.injections import FAULT_KINDS, Injection, kinds_firing
from resilience.contract.messages import BatchInfo, Plan, RunStats, record_window
from resilience.contract.rank_env import RankEnv
from resilience.contract.run_store import RunStore
from resilience.errors import ResilienceError
from resilience.state import committed, pacing, snapshot
from resilience.state.replication import BuddyReplicator
from resilience.state.snapshot import Snapshot

if TYPE_CHECKING:
    import torch.distributed as dist

    from resilience.tiers.agent import TierAgent

log = logging.getLogger("resilience")


class Paused(BaseException):
    """Leaving the generation at a step boundary for a resize (a BaseException, so that user
    code's ``except Exception`` does not swallow it)."""


class CommitPipeline:
    """The hooks ``Context`` calls around each step and commit, with the state they keep."""

    def __init__(
        self,
        env: RankEnv,
        store: RunStore,
        kept: Kept,
        tiers: TierAgent | None,
        watch: GenerationWatch,
        resizable: bool,
        link: RankLink | None = None,
    ) -> None:
        self.env, self.store, self.kept, self.tiers = env, store, kept, tiers
        self._link = link
        """Step times go up the liveness connection where there is one."""
        self._watch = watch
        self._resizable = resizable  # only then a pause is asked before each step
        self._slow = faults.SlowNode(store, env.node, env.injections)
        self.plan: Plan | None = None
        self.rank = -1
        self.state_group: dist.ProcessGroup | None = None
        self.replicator: BuddyReplicator | None = None
        self._capture_hook: Callable[[int], None] | None = None
        """``kill-during-capture`` and ``stall-capture`` in this generation's background snapshots."""
        self._in_commit = False
        """Inside a ``commit()`` block: a fault now cut the commit off (recovery asks :meth:`cut_off`)."""
        self._capture: threading.Thread | None = None
        self._live_read = LiveRead()
        """The last capture's reading of the live objects, closed when the generation ends."""
        self._capture_error: BaseException | None = None
        self._commits_this_generation = 0
        self.step_times: list[float] = []
        """Commit to commit, every generation's first step left out (it pays for warm-up and re-entry)."""
        self._changed_warned: set[str] = set()
        self.protection = Protection(tiers.saver, store.events.push) if tiers is not None else None
        self._timer = StepTimer(store, env.slot, 0, link=link, every_s=env.heartbeat_s)  # one a generation

    # --- the generation it serves --------------------------------------------------------------

    def take(self, plan: Plan, rank: int) -> None:
        """This process holds ``rank`` in ``plan``: the faults injected as it joins fire here."""
        self.plan, self.rank = plan, rank
        self._inject(
            faults.due(
                self.env.injections,
                generation=plan.generation,
                rank=rank,
                node=self.env.node,
                kinds=[k.name for k in FAULT_KINDS.values() if k.generation],
            )
        )

    def enter(self, state_group: dist.ProcessGroup) -> None:
        """The generation formed: its state group carries the buddy copies."""
        assert self.plan is not None
        self.state_group = state_group
        self._capture_hook = faults.copy_hook(
            self.env.injections,
            self.store,
            self.rank,
            self.env.node,
            self.plan.world_size,
            kinds=kinds_firing("capture"),
        )
        self._commits_this_generation = 0
        if self.protection is not None:
            self.protection.enter(state_group)

    def start_training(self) -> None:
        assert self.plan is not None
        self._timer = StepTimer(
            self.store,
            self.env.slot,
            self.plan.generation,
            link=self._link,
            every_s=self.env.heartbeat_s,
            window=record_window(self.plan.world_size),
        )
        self._timer.activate()

    def publish_times(self) -> None:
        """The generation's last step times; from rank 0, the run's median step (``stats/G``)."""
        self._timer.publish()
        if self.rank == 0 and self.step_times and self.plan is not None:
            median = RunStats(statistics.median(self.step_times))
            self.store.progress.publish_stats(self.plan.generation, median)

    def leave(self) -> None:
        """The generation ends: its copies are finished or left behind, its group forgotten."""
        self._timer.publish()
        self._timer.deactivate()
        self.wait_background(raise_errors=False)
        self._live_read.close()

    def forget_generation(self) -> None:
        self.replicator = None
        self.state_group = None

    def cut_off(self) -> bool:
        """Whether a fault cut the last ``commit()`` block off (then the live objects hold no
        clean commit); asked once, as the next generation recovers."""
        cut, self._in_commit = self._in_commit, False
        return cut

    def _formed(self) -> tuple[Plan, dist.ProcessGroup]:
        """``Context`` calls the commit hooks only inside ``train``, in a formed generation."""
        assert self.plan is not None and self.state_group is not None, "no generation formed"
        return self.plan, self.state_group

    # --- the hooks ``Context`` calls ------------------------------------------------------------

    def before_step(self, step: int) -> None:
        assert self.plan is not None
        every = pause_check_every(self.plan.world_size)
        if self._resizable and self.store.plans.pause_before(self.plan.generation, step, every):
            raise Paused(step)
        self._timer.step_started()
        self._inject(
            faults.due(
                self.env.injections, step=step, rank=self.rank, node=self.env.node, kinds=faults.AT_STEP_START
            )
        )
        self._slow.before_step(self._timer.median_compute)

    def _inject(self, due: list[Injection]) -> None:
        """An injected fault lands once this rank's part of the last commit reached its buddy
        (a round of a few KiB, under a millisecond): a real fault in that instant is served
        by the tiers instead, an older step but as exact."""
        plan = self.plan
        assert plan is not None, "faults fire only in a generation this rank took"
        if due and self.kept.parts.in_flight is not None:
            self._join(self.kept.parts.in_flight)
        if any(i.kind == "kill-all" for i in due) and self.tiers is not None:
            # No process survives a kill-all: it tests the restart from the RAM tier, which then
            # holds the last commit (a real loss of every node in that instant gets the one before).
            if self._capture is not None:
                self._join(self._capture)
            self.tiers.saver.wait_ram(60.0)
        for injection in due:
            faults.fire(
                injection,
                self.store,
                self.rank,
                self.env.node,
                plan.world_size,
                plan.generation,
                together=self.env.injections,
            )

    def before_commit(self) -> None:
        # The previous commit's snapshot must be taken before the optimizer changes the state it
        # reads. Its buddy copies read the snapshot, not the live state: they may go on through
        # this optimizer step, to the end of the step (``committed``).
        started = time.perf_counter()
        self._wait_captured()
        self._timer.blocked(time.perf_counter() - started)
        self._in_commit = True

    def after_commit(self, step: int, ctx: Context) -> None:
        step_s = self._timer.step_committed(step)
        plan, group = self._formed()
        # This rank's own part goes to its buddies first: a rank lost from here on is
        # replaced with its part of this step.
        self.kept.parts.commit(
            step,
            ctx.states()["rank"],
            group,
            self.rank,
            plan.world_size,
            plan.procs_per_node,
            self.env.replication_factor,
        )
        self._inject(
            faults.due(
                self.env.injections,
                step=step,
                rank=self.rank,
                node=self.env.node,
                kinds=kinds_firing("commit"),
            )
        )
        self._in_commit = False
        self.kept.sharded = self.kept.sharded or ctx.has_sharded
        if self._commits_this_generation > 0 and step_s is not None:
            self.step_times.append(step_s)
        self._commits_this_generation += 1
        if self.rank == 0:
            self.store.progress.set_step(step, plan.generation)
            if self._commits_this_generation == 1:
                batch = ctx.batch
                if batch is not None:
                    self.store.progress.publish_batch(
                        plan.generation,
                        BatchInfo(batch.global_batch, batch.accumulation, batch.lr_scale, batch.kept),
                    )
                self.store.progress.mark_first_step(plan.generation, time.time())

    def committed(self, step: int, ctx: Context, changed: list[str]) -> None:
        """Step ``step`` is over (the next starts, or the loop ended): what its commit protects
        is final. Copies of it start here, in the background, while the next step computes."""
        if changed:
            self._changed_after_commit(step, ctx, changed)
        if self.protection is not None and self.protection.due(step, self._commits_this_generation):
            self.wait_background()  # nothing else on the state group meanwhile
            plan, group = self._formed()
            self.protection.at_commit(step, self.step_times, group, self.rank)
        if self.kept.sharded:
            # Only sharded runs snapshot at commits; data-parallel state is read at recovery.
            # (The tiers take their own copy in the same background thread.)
            # The previous commit's buddy round ends with the step after it, as it did when the
            # optimizer step waited for it: a lost rank's buddy never holds an older commit.
            started = time.perf_counter()
            self.wait_background()
            self._timer.blocked_at_boundary(time.perf_counter() - started)
            plan, group = self._formed()
            self.kept.shard_as(plan.world_size, self.rank)
            states = ctx.states()
            if self.replicator is None:
                self.kept.twins = ctx.twins()
                hook = faults.copy_hook(
                    self.env.injections, self.store, self.rank, self.env.node, plan.world_size
                )
                self.replicator = BuddyReplicator(
                    group,
                    self.rank,
                    plan.world_size,
                    plan.procs_per_node,
                    self.env.replication_factor,
                    self.kept.replicas,
                    len(self.kept.twins),
                    hook,
                )
            reuse = {kind: self.kept.own[kind].take_oldest() for kind in self.kept.own}
            self._start_capture(self._capture_states, step, states, reuse)
        elif self.tiers is not None:
            # The tiers' copy runs while the next step computes; before_commit waits for it.
            self._start_capture(self._capture_tiers, self.tiers, step, ctx.states())

    def _start_capture(self, target: Callable[..., None], *args: Any) -> None:
        """The commit's copy on a thread, reading the live objects under a LiveRead of its own."""
        self._live_read = LiveRead()
        self._capture = threading.Thread(
            target=target, args=(*args, self._live_read), name="sres-snapshot", daemon=True
        )
        self._capture.start()

    def _changed_after_commit(self, step: int, ctx: Context, changed: list[str]) -> None:
        """The loop changed registered state after the commit block: that belongs to the step
        just committed, and replaces what the commit took. Said once per object, since a fault
        landing between the commit block and the next step misses it."""
        rank_part = ctx.states()["rank"]
        if any(name in rank_part for name in changed):
            if self.kept.parts.in_flight is not None:
                self._join(self.kept.parts.in_flight)
            plan, group = self._formed()
            self.kept.parts.commit(
                step,
                rank_part,
                group,
                self.rank,
                plan.world_size,
                plan.procs_per_node,
                self.env.replication_factor,
            )
        new = [n for n in changed if n not in self._changed_warned and n != committed.RNG]
        if new:
            self._changed_warned.update(new)
            log.warning(
                "registered %s changed after the commit block of step %d: taken again at the next step; "
                "move that change inside `with ctx.commit():` (a fault landing in between would miss it)",
                ", ".join(repr(n) for n in new),
                step,
            )
            self.store.events.push("changed-after-commit", rank=self.rank, step=step, names=new)

    def _capture_states(
        self, step: int, states: dict[str, dict[str, Any]], reuse: dict[str, Snapshot | None], live: LiveRead
    ) -> None:
        try:
            with live.reading():
                snaps = {
                    kind: snapshot.capture(
                        states[kind], step, reuse[kind], self._capture_hook if kind == "sharded" else None
                    )
                    for kind in self.kept.own
                }
                for kind, snap in snaps.items():  # kept before a generation's end reads the rings
                    self.kept.own[kind].put(snap)
            if self.tiers is not None:  # it reads live state too: before anything waits
                self.tiers.saver.save(step, states, midway=self._capture_hook, reading=live.reading)
            if self.replicator is not None and states["sharded"]:
                budget = pacing.round_budget(self.step_times, self.env.copy_pace)
                self.replicator.start(snaps["sharded"], budget)  # once the previous round is done
        except BaseException as err:  # noqa: BLE001 - re-raised on the main thread
            if threading.current_thread() is self._capture:  # not a copy left behind
                self._capture_error = err

    def _capture_tiers(
        self, tiers: TierAgent, step: int, states: dict[str, dict[str, Any]], live: LiveRead
    ) -> None:
        try:
            tiers.saver.save(step, states, midway=self._capture_hook, reading=live.reading)
        except BaseException as err:  # noqa: BLE001 - re-raised on the main thread
            if threading.current_thread() is self._capture:  # not a copy left behind
                self._capture_error = err

    def wait_background(self, raise_errors: bool = True) -> None:
        """Every background copy of the last commit: its capture, its rank part's and its
        sharded state's rounds to the buddies."""
        self._wait_captured(raise_errors, rounds=True)

    def _wait_captured(self, raise_errors: bool = True, rounds: bool = False) -> None:
        """The last commit's capture (and its rank part's round, a few KiB); with ``rounds``
        also the buddy round of its sharded state."""
        error: BaseException | None = None
        try:  # a copy left behind by a release, too: ``leave`` must not raise it (the rank lives on)
            if self._capture is not None:
                self._join(self._capture)
                self._capture = None
            error, self._capture_error = self._capture_error, None
            if self.kept.parts.in_flight is not None:
                self._join(self.kept.parts.in_flight)
            self.kept.parts.wait()
            if rounds and self.replicator is not None:
                if self.replicator.in_flight is not None:
                    self._join(self.replicator.in_flight)
                self.replicator.wait()
        except BaseException as err:  # noqa: BLE001
            error = error or err
        if error is not None and raise_errors:
            raise error

    def _join(self, thread: threading.Thread) -> None:
        """Wait for a background copy unless the generation ends first (a gloo send to a stuck
        peer may never return): the copy is then left behind, and this rank keeps its memory."""
        while thread.is_alive():
            thread.join(0.05)
            if thread.is_alive() and self._watch.released():
                self._capture = None
                self.kept.parts.abandon()
                if self.replicator is not None:
                    self.replicator.abandon()
                raise ResilienceError("the generation ended during a background copy of the last commit")
