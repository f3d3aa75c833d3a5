"""Performs the policy's actions: processes through the placement, Slurm through it, events.

The executor owns the run's mutable books (the plan, spare and dead nodes, fault counters);
:meth:`Executor.view` freezes them into the :class:`~launcher.supervisor.policy.RunState`
that the policy decides on. Each action has one handler; a handler returns an
:class:`Outcome` when the run ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from launcher.errors import SresError
from launcher.events import EventLog, summary
from launcher.placement import NewNode, Placement
from launcher.supervisor import actions as act
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe import SlotState
from launcher.supervisor.policy import ErrorAt, FaultState, RunState, error_at, requeues_counted
from launcher.supervisor.recovery import RecoveryWatch
from launcher.supervisor.resize import ResizeState, node_slots
from resilience import tiers
from resilience.contract.messages import Plan, Report, SlotInfo
from resilience.contract.run_store import RunStore


REFILL_PERIOD_S = 3.0
"""How often a job short of spares asks its placement for a node that came back."""


@dataclass
class Outcome:
    ok: bool
    reason: str = ""
    events: list[dict] = field(default_factory=list)
    requeued: bool = False


@dataclass
class Books:
    """The run's mutable facts, changed only by the executor."""

    slots: dict[str, SlotState] = field(default_factory=dict)
    plan: Plan | None = None
    spare_nodes: list[int] = field(default_factory=list)
    dead_nodes: set[int] = field(default_factory=set)
    process_faults: dict[int, int] = field(default_factory=dict)
    origin: dict[int, str] = field(default_factory=dict)  # node -> how it joined after the start
    faults: int = 0
    restarts: int = 0
    respawns: int = 0
    collateral_since: float | None = None
    fault: FaultState | None = None
    first_culprit: Report | None = None
    resize: ResizeState | None = None
    last_resize: dict | None = None
    next_refill: float = 0.0
    standby: set[str] = field(default_factory=set)
    """Slots of standby processes that have not taken over a rank (alive or not)."""
    standbys_started: int = 0
    announced: set[str] = field(default_factory=set)
    finished: bool = False
    settled: int = 0
    """The newest generation seen to make its first step."""
    changed_at: float = 0.0
    asked_nodes: int | None = None
    errors_seen: set[ErrorAt] = field(default_factory=set)
    """Every fault's own exception, where it was raised (a recurrence fails the run)."""


class Executor:
    def __init__(self, config: RunConfig, placement: Placement, store: RunStore, events: EventLog,
                 env: Callable[[str, int, int], dict[str, str]], recovery: RecoveryWatch,
                 flush: Callable[[float], int | None], clock: Callable[[], float], wall: Callable[[], float],
                 sleep: Callable[[float], None], out: TextIO,
                 answer: Callable[..., None] = lambda request, ok, message, **extra: None) -> None:
        self.config, self.placement, self.store, self.events = config, placement, store, events
        self.answer = answer
        self.env, self.recovery, self.flush = env, recovery, flush
        self.clock, self.wall, self.sleep, self.out = clock, wall, sleep, out
        self.books = Books(spare_nodes=list(range(config.nodes, config.nodes + config.spares)))
        self._handlers: dict[type, Callable[[Any], Outcome | None]] = {
            act.KillSlot: self._kill_slot, act.KillNode: self._kill_node, act.DropSpare: self._drop_spare,
            act.HoldForCulprit: self._hold, act.OpenFault: self._open_fault, act.Drain: self._drain,
            act.NoteStraggler: self._note_straggler,
            act.UseIdleNode: self._use_idle_node, act.RefillSpare: self._refill_spare,
            act.StartStandby: self._start_standby,
            act.AcquireNode: self._acquire_node, act.Publish: self._publish,
            act.WaitForNode: self._wait_for_node, act.Answer: self._answer, act.ReportStatus: self._status,
            act.BeginResize: self._begin_resize, act.AddNodes: self._add_nodes, act.Pause: self._pause,
            act.AbandonResize: self._abandon_resize, act.Resize: self._resize, act.Release: self._release,
            act.Requeue: self._requeue, act.Finish: self._finish, act.Fail: self._fail,
        }

    def perform(self, action: act.Action) -> Outcome | None:
        return self._handlers[type(action)](action)

    def view(self) -> RunState:
        b = self.books
        return RunState(
            members=dict(b.plan.members), slots={s: st.info for s, st in b.slots.items()},
            hosts={st.info.node: self.placement.host(st.info.node) for st in b.slots.values()},
            spare_nodes=tuple(b.spare_nodes), dead_nodes=frozenset(b.dead_nodes),
            process_faults=dict(b.process_faults), restarts=b.restarts, respawns=b.respawns,
            requeueable=self.placement.requeueable, collateral_since=b.collateral_since, fault=b.fault,
            resize=b.resize, warm=frozenset(s for s, st in b.slots.items() if st.alive and st.ready),
            next_refill=b.next_refill, standby=self._standby_by_node(), settled=self._settled(),
            lent=frozenset(n for n, how in b.origin.items() if how == "satellite"), changed_at=b.changed_at,
            asked_nodes=b.asked_nodes, errors_seen=frozenset(b.errors_seen))

    def _standby_by_node(self) -> dict[int, tuple[str, ...]]:
        """Live standbys by node; a dead one is forgotten (then replaced), a newly warm one announced."""
        b = self.books
        b.standby = {s for s in b.standby if b.slots[s].alive}
        by_node: dict[int, tuple[str, ...]] = {}
        for slot in sorted(b.standby):
            state = b.slots[slot]
            by_node[state.info.node] = (*by_node.get(state.info.node, ()), slot)
            if state.ready and slot not in b.announced:
                b.announced.add(slot)
                self.events.emit("standby-ready", node=state.info.node, host=self.placement.host(state.info.node),
                                 slot=slot, seconds=self.clock() - state.started)
        return by_node

    def _settled(self) -> bool:
        b = self.books
        if b.plan is None or not self.config.standby:
            return False
        if b.settled < b.plan.generation and self.store.first_step_t(b.plan.generation) is not None:
            b.settled = b.plan.generation
        return b.settled == b.plan.generation

    # --- processes -----------------------------------------------------------------------------

    def spawn(self, slot: str, node: int, local: int) -> None:
        self.placement.spawn(slot, node, self.config.command, self.env(slot, node, local))
        now = self.clock()
        self.books.slots[slot] = SlotState(SlotInfo(node, local), started=now, heartbeat_changed=now)

    def spare_slots(self) -> set[str]:
        return {slot for node in self.books.spare_nodes for slot in node_slots(node, self.config.procs_per_node)}

    def _kill_slot(self, a: act.KillSlot) -> None:
        self.books.slots[a.slot].killed_as, self.books.slots[a.slot].killed_t = a.as_, self.wall()
        self.placement.kill(a.slot)

    def _kill_node(self, a: act.KillNode) -> None:
        b = self.books
        b.dead_nodes.add(a.node)
        if a.node in b.spare_nodes:
            b.spare_nodes.remove(a.node)
        for slot, state in b.slots.items():
            if state.info.node == a.node and state.alive:
                state.killed_as, state.killed_t = "node", self.wall()
                self.placement.kill(slot)
        if a.why is None:
            # An injected kill: wait for it to land, so that one node loss is one fault.
            deadline = self.clock() + 5
            while any(self.placement.poll(s) is None for s, st in b.slots.items() if st.info.node == a.node) \
                    and self.clock() < deadline:
                self.sleep(0.005)

    def _note_straggler(self, a: act.NoteStraggler) -> None:
        host = self.placement.host(a.node)
        action = "replace" if a.replaced else ("none" if self.config.straggler.action == "none" else "kept: no spare")
        self.events.emit("straggler", rank=a.rank, node=a.node, host=host, score=a.score, step=a.step,
                         steps=self.config.straggler.steps, action=action)
        self.say(f"straggler: rank {a.rank} on {host} computes {a.score:.2f}x the median for "
                 f"{self.config.straggler.steps} steps (step {a.step}); {action}")

    def _drop_spare(self, a: act.DropSpare) -> None:
        if a.node in self.books.spare_nodes:
            self.books.spare_nodes.remove(a.node)
            self.events.emit("spare-lost", node=a.node, slot=a.slot)

    # --- a fault -------------------------------------------------------------------------------

    def _hold(self, a: act.HoldForCulprit) -> None:
        self.books.collateral_since = a.since

    def _open_fault(self, a: act.OpenFault) -> None:
        b = self.books
        b.collateral_since = None
        t = a.t
        progress = self._progress()
        generation = b.plan.generation
        for rank, how in sorted(a.lost.items()):
            node = b.slots[b.plan.members[rank]].info.node
            why = a.bad_nodes.get(node)
            self.events.emit("fault", kind=how, rank=rank, node=node, host=self.placement.host(node),
                             step=progress + 1, generation=generation, t=t, **({"why": why} if why else {}))
            self.say(f"fault: {how} of rank {rank} (node {self.placement.host(node)}"
                     f"{': ' + why if why else ''}) at step {progress + 1}")
        if a.culprit is not None:
            c = a.culprit
            node = b.slots[b.plan.members[c.rank]].info.node
            self.events.emit("fault", kind="exception", rank=c.rank, node=node, host=self.placement.host(node),
                             step=progress + 1, generation=generation, message=c.message, t=t,
                             **({"recurred": True} if a.recurred else {}))
            self.say(f"fault: exception in rank {c.rank}: {c.message}")
            b.first_culprit = b.first_culprit or c
            if (where := error_at(c)) is not None:
                b.errors_seen.add(where)
        b.process_faults = dict(a.process_faults)
        if b.resize is not None:
            b.resize = dataclasses.replace(b.resize, pausing_since=None)  # pause again in the next generation
        b.faults += 1
        b.restarts += 1
        node_fault = bool(a.bad_nodes) or any(how == "node" for how in a.lost.values())
        self.recovery.fault("node" if node_fault else "process", t, progress, generation)
        b.fault = FaultState(dict(a.lost), dict(a.bad_nodes))

    def _drain(self, a: act.Drain) -> None:
        b = self.books
        if b.fault is not None:
            b.fault = dataclasses.replace(b.fault, drained=b.fault.drained | {a.node})
        host = self.placement.host(a.node)
        t0 = self.clock()
        try:
            self.placement.retire(a.node, a.why)
        except SresError as err:
            self.events.emit("drain-failed", node=a.node, host=host, why=a.why, error=str(err))
            self.say(f"warning: could not drain {host}: {err}")
            return
        self.events.emit("drained", node=a.node, host=host, why=a.why, seconds=self.clock() - t0)
        self.events.emit("node-released", node=a.node, host=host, why="fault", detail=a.why)
        self.say(f"drained {host}: sres: {a.why}")

    def _release(self, a: act.Release) -> None:
        b = self.books
        if b.fault is not None:
            b.fault = dataclasses.replace(b.fault, drained=b.fault.drained | {a.node})
        self._give_back(a.node, a.why)

    def _give_back(self, node: int, why: str) -> None:
        """A node leaves the run, not drained: a satellite's job is cancelled (``why``:
        preempted or request)."""
        job = self.placement.release(node, why)
        host = self.placement.host(node)
        self.events.emit("node-released", node=node, host=host, why=why, **({"job": job} if job else {}))
        self.say(f"released {host} ({why}{f', job {job} cancelled' if job else ''})")

    def _use_idle_node(self, a: act.UseIdleNode) -> None:
        self._add_node(self.placement.idle_node(), "idle-node")

    def _refill_spare(self, a: act.RefillSpare) -> None:
        self.books.next_refill = self.clock() + REFILL_PERIOD_S
        new = self.placement.idle_node()
        if new is not None:
            self._start_node(new)
            self.books.spare_nodes.append(new.node)

    def _start_standby(self, a: act.StartStandby) -> None:
        b = self.books
        b.standbys_started += 1
        slot = f"n{a.node}s{b.standbys_started}"
        self.spawn(slot, a.node, 0)  # its local rank is the one it takes over (Publish.promoted)
        b.standby.add(slot)

    def _acquire_node(self, a: act.AcquireNode) -> None:
        self._add_node(self.placement.grow(), "new-node")

    def _add_node(self, new: NewNode | None, source: str) -> None:
        b = self.books
        if new is None:
            b.fault = dataclasses.replace(b.fault, tried=b.fault.tried | {source})
            return
        self._start_node(new)
        b.spare_nodes.append(new.node)

    def _start_node(self, new: NewNode) -> None:
        """Start a node's rank processes; they warm up and wait for a plan that includes them."""
        for local, slot in enumerate(node_slots(new.node, self.config.procs_per_node)):
            self.spawn(slot, new.node, local)
        self.books.origin[new.node] = new.how
        job = self.placement.job_of(new.node)
        self.events.emit("node-added", node=new.node, host=new.host, how=new.how, seconds=new.seconds,
                         **({"returned": True} if new.returned else {}), **({"job": job} if job else {}))
        self.say(f"added node {new.host} to the run ({new.how}{f' job {job}' if job else ''}, {new.seconds:.2f} s)")

    def _publish(self, a: act.Publish) -> None:
        b = self.books
        for node in a.used_spares:
            b.spare_nodes.remove(node)
        for slot, node, local in a.spawn:
            b.respawns += 1
            self.spawn(slot, node, local)
        for slot, local in a.promoted:
            b.standby.discard(slot)
            b.slots[slot].info = SlotInfo(b.slots[slot].info.node, local)
        promoted = {slot for slot, _ in a.promoted}
        for rank in a.replaced:
            old_node = b.slots[b.plan.members[rank]].info.node
            new_node = b.slots[a.members[rank]].info.node
            how = (b.origin.get(new_node, "spare") if old_node in b.dead_nodes
                   else "standby" if a.members[rank] in promoted else "respawn")
            self.events.emit("replaced", rank=rank, slot=a.members[rank], node=new_node,
                             host=self.placement.host(new_node), how=how)
        self.publish(dict(a.members), a.replaced, a.reason)
        b.fault = None

    def publish(self, members: dict[int, str], replaced: tuple[int, ...], reason: str) -> None:
        b = self.books
        generation = b.plan.generation + 1 if b.plan else 1
        plan = Plan(generation=generation, world_size=len(members), members=dict(members),
                    slots={s: b.slots[s].info for s in members.values()},
                    procs_per_node=self.config.procs_per_node, replaced=replaced, reason=reason)
        self.store.publish_plan(plan)
        b.plan, b.changed_at = plan, self.clock()
        self.placement.echo_slot = members[0]
        self.events.emit("generation", generation=generation, world_size=plan.world_size, replaced=list(replaced))

    # --- resizing ---------------------------------------------------------------------------------

    def _wait_for_node(self, a: act.WaitForNode) -> None:
        b = self.books
        if b.fault.waiting_since is None:
            timeout = self.config.elastic.resize_timeout_s
            self.events.emit("waiting", why="no spare node, and the world may not shrink further",
                             timeout_s=timeout, world_size=len(b.plan.members) - len(b.fault.lost),
                             t=self.wall() - (self.clock() - a.since))  # when the timeout started
            self.say(f"waiting up to {timeout:g} s for a node (sres grow adds one)")
        b.fault = dataclasses.replace(b.fault, waiting_since=a.since)

    def _answer(self, a: act.Answer) -> None:
        self.events.emit("request", request=a.request, ok=a.ok, message=a.message)
        self.say(f"request {a.request}: {a.message}")
        self.answer(a.request, a.ok, a.message)

    def _status(self, a: act.ReportStatus) -> None:
        self.answer(a.request, True, "running", status=self.status())

    def _progress(self) -> int:
        progress = self.store.progress()
        return -1 if progress is None else progress

    def status(self) -> dict:
        b = self.books
        nodes = sorted({b.slots[s].info.node for s in b.plan.members.values()})
        progress = self._progress()
        return {"world_size": b.plan.world_size, "nodes": [self.placement.host(n) for n in nodes],
                "spares": [self.placement.host(n) for n in b.spare_nodes], "generation": b.plan.generation,
                "step": progress, "faults": b.faults, "last_resize": b.last_resize,
                "resizing_to": b.resize.nodes if b.resize is not None else None,
                "min_nodes": self.config.elastic.min_nodes, "max_nodes": self.config.elastic.max_nodes,
                "job_id": self.placement.job_id, "jobs": self._jobs(nodes)}

    def _jobs(self, nodes) -> dict[str, str]:
        """host -> the Slurm job its ranks run in (the job itself or a satellite); empty locally."""
        return {self.placement.host(n): job for n in sorted(nodes) if (job := self.placement.job_of(n))}

    def _begin_resize(self, a: act.BeginResize) -> None:
        under_way = self.books.resize  # Slurm taking back more lent nodes: the same pause serves
        pausing = under_way.pausing_since if under_way is not None and under_way.why == a.why else None
        self.books.resize = ResizeState(a.nodes, a.why, self.clock(), a.request, release=a.release,
                                        pausing_since=pausing)
        if a.why == "request":
            self.books.asked_nodes = a.nodes
        else:
            self.say(f"resizing to {a.nodes} node(s) at the next step boundary ({a.why})")

    def _add_nodes(self, a: act.AddNodes) -> None:
        b = self.books
        added = []
        for _ in range(a.count):
            index = 1 + max(st.info.node for st in b.slots.values())
            new = self.placement.new_node(index)
            if new is None:
                break
            self._start_node(new)
            added.append(new.node)
        if b.fault is not None:
            b.spare_nodes += added  # a node loss waits for them: they take the lost ranks
        elif b.resize is not None:
            b.resize = dataclasses.replace(b.resize, added=True, joining=b.resize.joining + tuple(added))

    def _pause(self, a: act.Pause) -> None:
        b = self.books
        self.store.request_pause(b.plan.generation, b.resize.why)
        b.resize = dataclasses.replace(b.resize, pausing_since=self.clock())

    def _abandon_resize(self, a: act.AbandonResize) -> None:
        b = self.books
        for node in b.resize.joining:
            for slot in node_slots(node, self.config.procs_per_node):
                self.placement.kill(slot)
        self.events.emit("resize-abandoned", to_nodes=b.resize.nodes, why=a.why)
        self.say(f"resize to {b.resize.nodes} node(s) abandoned: {a.why}")
        b.resize = None

    def _resize(self, a: act.Resize) -> None:
        b = self.books
        pausing = b.resize.pausing_since if b.resize is not None and a.why != "fault" else None
        t0 = pausing if pausing is not None else self.clock()  # the pause, or now: the decision to shrink
        for slot, state in b.slots.items():  # respawned ranks and standbys too, not only the first slots
            if state.info.node in a.release and state.alive:
                self.placement.kill(slot)
        for node in a.release:
            self._give_back(node, "preempted" if a.why == "preempted" else "request")
        b.spare_nodes += list(a.to_spares)
        if a.why != "fault":
            b.resize = None  # done; a resize asked for during a fault goes on from the new world
        b.fault = None
        started_t = self.wall() - (self.clock() - t0)
        self.publish(dict(a.members), (), f"resize-{a.why}")
        b.last_resize = {"from_world": a.from_world, "to_world": len(a.members), "why": a.why,
                         "generation": b.plan.generation, "t": started_t}
        jobs = self._jobs({b.slots[s].info.node for s in a.members.values()})
        self.recovery.resized(a.from_world, len(a.members), a.why, started_t, b.plan.generation, jobs or None)
        self.say(f"resizing: world {a.from_world} -> {len(a.members)} ({a.why})"
                 + (f", released {', '.join(self.placement.host(n) for n in a.release)}" if a.release else "")
                 + (f", {', '.join(self.placement.host(n) for n in a.to_spares)} kept as spare" if a.to_spares else ""))

    # --- the end of a run ----------------------------------------------------------------------

    def _requeue(self, a: act.Requeue) -> Outcome:
        """``save``: every rank is alive (preemption), so the newest committed step is persisted
        first; after a node loss the generation is broken and the last periodic save serves."""
        c = self.config
        saved = self.flush(c.preempt_save_timeout_s) if a.save else None
        if a.save and saved is None:
            self.say("warning: nothing was persisted before the requeue (no --persistent-dir, or the save failed): "
                     "the restart resumes from the newest state the tiers still hold")
        self.events.emit("requeue", why=a.why, cause=a.cause, restart_count=c.restart_count, saved_step=saved)
        used, cap, flag = requeues_counted(c, a.cause)
        self.say(f"{a.why}: requeueing the job (restart {c.restart_count + 1}"
                 + (f"; {used + 1} of at most {cap} under {flag})" if cap is not None else ")"))
        self.store.shut_down()
        try:
            self.placement.requeue(a.why)
        except SresError as err:
            return self._fail(act.Fail(f"{a.why}; and the job cannot be requeued: {err}"))
        return Outcome(False, f"requeued: {a.why}", self.events.events, requeued=True)

    def _finish(self, a: act.Finish) -> Outcome:
        self.recovery.check(self.books.plan.generation)
        fields = self.recovery.finished(self.wall())
        self.events.emit("finished", faults=self.books.faults, generations=self.books.plan.generation, **fields,
                         state_digests={str(rank): digest for rank, digest in a.digests})
        self.say(summary(self.events.events))
        self.books.finished = True
        return Outcome(True, events=self.events.events)

    def after_stop(self) -> None:
        """Every process is gone: a finished run's RAM tier goes, as nothing will restart from
        it (removed any earlier, a standby or spare still starting up would write it again)."""
        if self.books.finished and self.config.tiers is not None:
            tiers.remove_job(self.config.tiers.job_id)

    def _fail(self, a: act.Fail) -> Outcome:
        culprit = a.culprit or self.books.first_culprit
        blame = {} if culprit is None else {"rank": culprit.rank, "error_type": culprit.error_type,
                                            "traceback": culprit.traceback}
        self.events.emit("failed", reason=a.reason, faults=self.books.faults, **blame)
        if culprit is not None and culprit.traceback:
            # a.culprit: an error that recurred, the run's first one again unless another came before
            first = a.culprit is None or error_at(a.culprit) == error_at(self.books.first_culprit)
            self.out.write(f"{'first failure' if first else 'failure'} (rank {culprit.rank}):\n{culprit.traceback}")
        for slot in self.books.slots:
            self.placement.kill(slot)
        self.say(f"error: {a.reason}")
        return Outcome(False, a.reason, self.events.events)

    def fail(self, reason: str) -> Outcome:
        return self._fail(act.Fail(reason))

    def say(self, text: str) -> None:
        for line in text.splitlines():
            self.out.write(f"sres: {line}\n")
        self.out.flush()
