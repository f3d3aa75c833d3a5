"""The per-job supervisor: hosts the store, spawns ranks and spares, sees faults, re-forms.

It is never a rank, so losing rank 0 loses neither the store nor the decisions. A fault
is seen from the supervisor's own watch (a process exit, at once; a silent heartbeat, after
the hang timeout; a rank's report), never from a collective timeout. Each fault ends the
generation: :func:`replace` (pure) decides who takes the lost ranks, the supervisor
publishes the next plan, and the ranks re-form and recover their state from peers.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from launcher.backends import Backend, NodeEvidence
from launcher.backends.local import LocalBackend
from launcher.errors import ConfigError, SresError
from launcher.events import EventLog, summary
from resilience.agent import faults
from resilience.contract import membership
from resilience import tiers
from resilience.contract.liveness import LivenessServer
from resilience.contract.membership import Plan, Report, SlotInfo


@dataclass(frozen=True)
class RunConfig:
    """Everything ``sres run`` was asked to do; validated when built."""

    command: tuple[str, ...]
    nodes: int
    procs_per_node: int = 1
    spares: int = 0
    injections: tuple[faults.Injection, ...] = ()
    log_dir: Path = Path("sres-logs")
    backend: str = "gloo"
    hang_timeout_s: float = 30.0
    heartbeat_s: float = 0.5
    reform_timeout_s: float = 60.0
    startup_timeout_s: float = 120.0
    max_restarts: int = 10
    replication_factor: int = 2
    node_fault_after: int = 2
    """Process faults on one node after which the node itself counts as bad and is replaced."""
    max_requeues: int = 3
    """Requeues of the Slurm job (``SLURM_RESTART_COUNT``) after which a fault ends the job."""
    restart_count: int = 0
    preempt_signal: str = "USR2"
    preempt_save_timeout_s: float = 60.0
    tiers: tiers.TierConfig | None = None
    """Checkpoint tiers (RAM, neighbour, persistent) and the job id they are filed under."""

    def __post_init__(self) -> None:
        if not self.command:
            raise ConfigError("no training command given: sres run --nodes N -- python train.py")
        if self.nodes < 1:
            raise ConfigError(f"--nodes must be at least 1 (got {self.nodes})")
        if self.procs_per_node < 1:
            raise ConfigError(f"--procs-per-node must be at least 1 (got {self.procs_per_node})")
        if self.spares < 0:
            raise ConfigError(f"--spares cannot be negative (got {self.spares})")
        if self.max_restarts < 0:
            raise ConfigError("--max-restarts cannot be negative")
        if self.hang_timeout_s <= 2 * self.heartbeat_s:
            raise ConfigError(f"--hang-timeout must exceed two heartbeats ({2 * self.heartbeat_s:g} s)")
        if self.replication_factor < 1:
            raise ConfigError("the replication factor must be at least 1")
        if self.node_fault_after < 1:
            raise ConfigError("--node-fault-after must be at least 1")
        if self.max_requeues < 0:
            raise ConfigError("--max-requeues cannot be negative")
        if self.preempt_signal_name == "SIGUSR1":
            raise ConfigError("--preempt-signal USR1 is taken: NCCL may use SIGUSR1; use USR2 (the default) or TERM")
        if not hasattr(signal, self.preempt_signal_name):
            raise ConfigError(f"--preempt-signal {self.preempt_signal}: not a signal name")
        if self.backend not in ("gloo", "nccl"):
            raise ConfigError(f"unknown backend {self.backend!r}: gloo or nccl")
        for inj in self.injections:
            if inj.kind == "node" and not 0 <= (inj.node or 0) < self.nodes:
                raise ConfigError(f"--inject {inj.spec}: there are nodes 0..{self.nodes - 1}")
            if inj.kind != "node" and not 0 <= (inj.rank or 0) < self.world_size:
                raise ConfigError(f"--inject {inj.spec}: there are ranks 0..{self.world_size - 1}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def preempt_signal_name(self) -> str:
        return "SIG" + self.preempt_signal.upper().removeprefix("SIG")


# --- pure decisions ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Replacement:
    members: dict[int, str]
    spawn: tuple[tuple[str, int, int], ...] = ()  # (slot, node, local_rank) to start cold
    used_spare_nodes: tuple[int, ...] = ()


def replace(members: Mapping[int, str], slots: Mapping[str, SlotInfo], lost: Mapping[int, bool],
            dead_nodes: set[int], spare_nodes: Sequence[int], spare_slot: Callable[[int, int], str],
            respawn_slot: Callable[[int, int], str]) -> Replacement:
    """Give every lost rank a process. Pure.

    ``lost`` maps a lost rank to whether its node died. A rank whose node is alive (a process
    fault) restarts on its own node; ranks of a dead node move, keeping their ranks and local
    ranks, to one warm spare node. Raises ConfigError when a dead node has no spare left.
    """
    new = dict(members)
    spawn: list[tuple[str, int, int]] = []
    spares = list(spare_nodes)
    used: list[int] = []
    moved: dict[int, int] = {}
    for rank in sorted(lost):
        info = slots[members[rank]]
        if info.node in dead_nodes:
            if info.node not in moved:
                if not spares:
                    raise ConfigError(f"node {info.node} was lost and no spare node is left (start with --spares)")
                moved[info.node] = spares.pop(0)
                used.append(moved[info.node])
            new[rank] = spare_slot(moved[info.node], info.local_rank)
        else:
            slot = respawn_slot(info.node, info.local_rank)
            new[rank] = slot
            spawn.append((slot, info.node, info.local_rank))
    return Replacement(new, tuple(spawn), tuple(used))


def node_verdict(evidence: NodeEvidence, process_faults: int, limit: int) -> str | None:
    """Why a node that just lost a rank must leave the job, or None for a process fault. Pure.

    The returned text becomes the drain reason (after ``sres:``), so it says what was seen.
    """
    if not evidence.slurmd_answers:
        return "slurmd not responding"
    if not evidence.slurm_usable:
        detail = f" ({evidence.slurm_reason})" if evidence.slurm_reason else ""
        return f"slurm reports {evidence.slurm_state or 'node unusable'}{detail}"
    if process_faults >= limit:
        return f"repeated failure: {process_faults} process faults on this node"
    return None


def silent_slots(last_change: Mapping[str, float], started: Mapping[str, float], seen: Mapping[str, bool],
                 now: float, hang_timeout_s: float, startup_timeout_s: float) -> list[str]:
    """Slots whose heartbeat stopped: a hung process. Pure."""
    out = []
    for slot, changed in last_change.items():
        limit = hang_timeout_s if seen.get(slot) else startup_timeout_s
        since = changed if seen.get(slot) else started[slot]
        if now - since > limit:
            out.append(slot)
    return out


COLLATERAL_GRACE_S = 1.0
"""How long reports of collateral errors alone wait for the process death that caused them."""


def await_culprit(lost: Mapping[int, str], errors: Mapping[str, Report], collateral_since: float | None,
                  now: float, grace_s: float = COLLATERAL_GRACE_S) -> bool:
    """Whether to hold a fault that so far is only collateral errors (collectives that lost a
    peer): a rank's SIGKILL reaches its peers' sockets as fast as it reaches us, and a survivor's
    report can come first. Handled as an exception at once, it would cost a generation with no
    one replaced, then a second fault for the real loss. Waits at most ``grace_s``. Pure."""
    if lost or not errors or not all(r.collateral for r in errors.values()):
        return False
    return collateral_since is None or now - collateral_since < grace_s


# --- the executor --------------------------------------------------------------------------------

@dataclass
class _Slot:
    info: SlotInfo
    started: float
    alive: bool = True
    heartbeat: int = 0
    heartbeat_changed: float = 0.0
    killed_as: str | None = None  # "hang" | "node": why we killed it


@dataclass
class _Fault:
    kind: str
    t: float
    progress: int
    generation: int


@dataclass
class Outcome:
    ok: bool
    reason: str = ""
    events: list[dict] = field(default_factory=list)
    requeued: bool = False


class Supervisor:
    def __init__(self, config: RunConfig, backend: Backend | None = None, liveness: LivenessServer | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 out=sys.stderr) -> None:
        self.config = config
        self.backend: Backend = backend or LocalBackend(config.log_dir)
        self.liveness = liveness or LivenessServer()
        self.clock, self.wall, self.out = clock, wall, out
        self.events = EventLog(Path(config.log_dir) / "events.jsonl", wall)
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                   timeout=timedelta(seconds=60))
        self.slots: dict[str, _Slot] = {}
        self.plan: Plan | None = None
        self.dead_nodes: set[int] = set()
        self.spare_nodes: list[int] = list(range(config.nodes, config.nodes + config.spares))
        self.pending: list[_Fault] = []
        self.faults = 0
        self.restarts = 0
        self.first_culprit: Report | None = None
        self._respawns = 0
        self._start_t = 0.0
        self._reports: dict[str, Report] = {}
        self._collateral_since: float | None = None
        self._reports_seen = (0, 0)
        self._next_heartbeat_check = 0.0
        self._node_kills_seen = 0
        self._process_faults: dict[int, int] = {}
        self._preempted: str | None = None
        self._origin: dict[int, str] = {}  # node -> how it joined after the start: allocation | expansion
        self._rank_events_seen = 0

    # --- lifecycle ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        c = self.config
        self.events.emit("start", nodes=c.nodes, procs_per_node=c.procs_per_node, spares=c.spares,
                         world_size=c.world_size, command=list(c.command),
                         injections=[i.spec for i in c.injections], restart_count=c.restart_count,
                         hosts=[self.backend.host(n) for n in range(c.nodes + c.spares)])
        previous = self._catch_preemption()
        for node in range(c.nodes + c.spares):
            for local in range(c.procs_per_node):
                self._spawn(f"n{node}p{local}", node, local)
        members = {node * c.procs_per_node + local: f"n{node}p{local}"
                   for node in range(c.nodes) for local in range(c.procs_per_node)}
        self._publish(members, replaced=(), reason="start")
        try:
            return self._loop()
        except KeyboardInterrupt:
            return self._fail("interrupted")
        except BaseException as err:
            # Our bug: the timeline still ends with a "failed" event, and the traceback shows.
            self._fail(f"internal error of the supervisor: {type(err).__name__}: {err}")
            raise
        finally:
            if previous is not None:
                signal.signal(getattr(signal, self.config.preempt_signal_name), previous)
            self.store.set(membership.SHUTDOWN, "1")
            self.backend.stop_all(timeout_s=30.0)
            self._drain_rank_events()
            self.liveness.close()
            self.events.close()

    def _catch_preemption(self):
        """The batch shell gets the preemption signal (``sbatch --signal=B:USR2@T``); so may ranks."""
        def on_signal(signum: int, _frame) -> None:
            self._preempted = f"preempted ({signal.Signals(signum).name})"
        try:
            return signal.signal(getattr(signal, self.config.preempt_signal_name), on_signal)
        except ValueError:  # not the main thread (an embedding program): ranks still relay it
            return None

    def _loop(self) -> Outcome:
        while True:
            now = self.clock()
            self._kill_requested_nodes()
            self._watch_heartbeats(now)
            if self._preempted:
                return self._requeue(self._preempted, save=True)
            lost, reports = self._observe()
            unrecoverable = [r for r in reports.values() if r.kind == "unrecoverable"]
            if unrecoverable:
                return self._fail(f"the state could not be recovered from peers: {unrecoverable[0].message}")
            errors = {s: r for s, r in reports.items() if r.kind == "error"}
            if await_culprit(lost, errors, self._collateral_since, now):
                if self._collateral_since is None:
                    self._collateral_since = now
            elif lost or errors:
                self._collateral_since = None
                outcome = self._handle_fault(lost, errors)
                if outcome is not None:
                    return outcome
                continue
            if all(r.kind == "done" for r in reports.values()) and len(reports) == len(self.plan.members):
                return self._finish()
            self._check_recovered()
            self._drain_rank_events()
            time.sleep(0.02)

    # --- observing -----------------------------------------------------------------------------

    def _observe(self) -> tuple[dict[int, str], dict[str, Report]]:
        """Lost member ranks (rank -> kind) and every report of the current generation."""
        lost: dict[int, str] = {}
        idle_spares = self.spare_slots_idle()
        for slot, state in self.slots.items():
            if state.alive and self.backend.poll(slot) is not None:
                state.alive = False
                if slot in idle_spares and state.info.node in self.spare_nodes:
                    # A spare node with a dead process cannot take a whole node's ranks.
                    self.spare_nodes.remove(state.info.node)
                    self.events.emit("spare-lost", node=state.info.node, slot=slot)
        members = self.plan.members
        # One counter per generation says how many reports exist: read them only when it moves.
        count = self.store.add(membership.report_ready_key(self.plan.generation), 0)
        if count != self._reports_seen[0] or self.plan.generation != self._reports_seen[1]:
            for slot in members.values():
                key = membership.report_key(self.plan.generation, slot)
                if slot not in self._reports and self.store.check([key]):
                    self._reports[slot] = Report.from_json(self.store.get(key))
            self._reports_seen = (count, self.plan.generation)
        reports = dict(self._reports)
        for rank, slot in members.items():
            state = self.slots[slot]
            if not state.alive and not (slot in reports and reports[slot].kind == "done"):
                rc = self.backend.poll(slot)
                lost[rank] = state.killed_as or ("kill" if rc is not None and rc < 0 else f"exit {rc}")
        return lost, reports

    def _watch_heartbeats(self, now: float) -> None:
        # Every half period is enough to see a silence of hang_timeout; every tick would cost
        # store round trips that compete with the ranks for CPU (measured: 9% on 2 cores).
        if now < self._next_heartbeat_check:
            return
        self._next_heartbeat_check = now + self.config.heartbeat_s / 2
        if self._preempted is None and self.store.check([membership.PREEMPT]):
            self._preempted = f"preempted (a rank received {self.config.preempt_signal_name})"
        alive = [s for s, st in self.slots.items() if st.alive]
        for slot in alive:
            value = self.store.add(membership.heartbeat_key(slot), 0)
            state = self.slots[slot]
            if value != state.heartbeat:
                state.heartbeat, state.heartbeat_changed = value, now
        members = set(self.plan.members.values())
        hung = silent_slots(
            {s: self.slots[s].heartbeat_changed for s in alive if s in members},
            {s: self.slots[s].started for s in alive},
            {s: self.slots[s].heartbeat > 0 for s in alive},
            now, self.config.hang_timeout_s, self.config.startup_timeout_s,
        )
        for slot in hung:
            self.slots[slot].killed_as = "hang"
            self.backend.kill(slot)

    def _kill_requested_nodes(self) -> None:
        count = self.store.add(membership.NODE_KILLS, 0)
        if count == self._node_kills_seen:
            return
        self._node_kills_seen = count
        for node in {self.slots[s].info.node for s in self.plan.members.values()} - self.dead_nodes:
            key = membership.node_kill_key(node)
            if self.store.check([key]):
                self.store.delete_key(key)
                self._kill_node(node)
                # Wait for the kills to land, so that one node loss is one fault.
                deadline = self.clock() + 5
                while any(self.backend.poll(s) is None for s, st in self.slots.items() if st.info.node == node) \
                        and self.clock() < deadline:
                    time.sleep(0.005)

    def spare_slots_idle(self) -> set[str]:
        return {f"n{node}p{local}" for node in self.spare_nodes for local in range(self.config.procs_per_node)}

    # --- deciding and acting -----------------------------------------------------------------

    def _handle_fault(self, lost: dict[int, str], errors: dict[str, Report]) -> Outcome | None:
        t = self.wall()
        progress = int(self.store.get(membership.PROGRESS)) if self.store.check([membership.PROGRESS]) else -1
        generation = self.plan.generation
        bad_nodes = self._classify_nodes(lost)
        if lost:
            for rank, kind in sorted(lost.items()):
                node = self._node_of(rank)
                why = bad_nodes.get(node)
                self.events.emit("fault", kind="node" if why else kind, rank=rank, node=node,
                                 host=self.backend.host(node), step=progress + 1, generation=generation, t=t,
                                 **({"why": why} if why else {}))
                self._say(f"fault: {'node' if why else kind} of rank {rank} (node {self.backend.host(node)}"
                          f"{': ' + why if why else ''}) at step {progress + 1}")
        else:
            culprit = min(errors.values(), key=lambda r: (r.collateral, r.seq))
            node = self._node_of(culprit.rank)
            self.events.emit("fault", kind="exception", rank=culprit.rank, node=node, host=self.backend.host(node),
                             step=progress + 1, generation=generation, message=culprit.message, t=t)
            self._say(f"fault: exception in rank {culprit.rank}: {culprit.message}")
            if self.first_culprit is None:
                self.first_culprit = culprit
        self.faults += 1
        self.restarts += 1
        self.pending.append(_Fault("node" if any(k == "node" for k in lost.values()) or bad_nodes else "process",
                                   t, progress, generation))
        if self.restarts > self.config.max_restarts:
            return self._fail(f"gave up after {self.config.max_restarts} restart(s)")
        homeless = {self._node_of(r) for r in lost} & self.dead_nodes
        # A warm spare needs nothing from Slurm: publish first, drain after. A cold node or an
        # expansion needs the bad node out of the job first (shrink, then grow).
        spares_cover = len(homeless) <= len(self.spare_nodes)
        if not spares_cover:
            self._retire(bad_nodes)
            bad_nodes = {}
            while len(homeless) > len(self.spare_nodes):
                new = self.backend.acquire()
                if new is None:
                    why = (f"node {', '.join(self.backend.host(n) for n in sorted(homeless))} was lost "
                           "and no spare node is left")
                    if not self.backend.requeueable:
                        return self._fail(f"{why} (start with --spares)")
                    return self._requeue(f"{why}, nor an idle node to grow into")
                for local in range(self.config.procs_per_node):
                    self._spawn(f"n{new.node}p{local}", new.node, local)
                self.spare_nodes.append(new.node)
                self._origin[new.node] = new.how
                self.events.emit("node-added", node=new.node, host=new.host, how=new.how, seconds=new.seconds)
                self._say(f"added node {new.host} to the job ({new.how}, {new.seconds:.2f} s)")
        decision = replace(
            self.plan.members, {s: st.info for s, st in self.slots.items()},
            {rank: self._node_of(rank) in self.dead_nodes for rank in lost},
            self.dead_nodes, self.spare_nodes,
            spare_slot=lambda node, local: f"n{node}p{local}",
            respawn_slot=self._respawn_name,
        )
        for node in decision.used_spare_nodes:
            self.spare_nodes.remove(node)
        for slot, node, local in decision.spawn:
            self._spawn(slot, node, local)
        for rank in sorted(lost):
            old_node = self._node_of(rank)
            new_node = self.slots[decision.members[rank]].info.node
            self.events.emit("replaced", rank=rank, slot=decision.members[rank], node=new_node,
                             host=self.backend.host(new_node),
                             how=self._origin.get(new_node, "spare") if old_node in self.dead_nodes else "respawn")
        self._publish(decision.members, replaced=tuple(sorted(lost)), reason="fault")
        self._retire(bad_nodes)
        return None

    def _node_of(self, rank: int) -> int:
        return self.slots[self.plan.members[rank]].info.node

    def _classify_nodes(self, lost: dict[int, str]) -> dict[int, str]:
        """Nodes that lost a rank and must go, with what was seen; their other ranks are killed."""
        bad: dict[int, str] = {}
        for node in sorted({self._node_of(r) for r in lost} - self.dead_nodes):  # injected kills: already dead
            self._process_faults[node] = self._process_faults.get(node, 0) + 1
            why = node_verdict(self.backend.evidence(node), self._process_faults[node], self.config.node_fault_after)
            if why is None:
                continue
            bad[node] = why
            if node in self.spare_nodes:
                self.spare_nodes.remove(node)
            self._kill_node(node)
        for rank in lost:
            if self._node_of(rank) in bad:
                lost[rank] = "node"
        return bad

    def _kill_node(self, node: int) -> None:
        """The node is dead to this run: its remaining processes go, as one node fault."""
        self.dead_nodes.add(node)
        for slot, state in self.slots.items():
            if state.info.node == node and state.alive:
                state.killed_as = "node"
                self.backend.kill(slot)

    def _retire(self, bad_nodes: dict[int, str]) -> None:
        for node, why in sorted(bad_nodes.items()):
            t0 = self.clock()
            try:
                self.backend.retire(node, why)
            except SresError as err:
                self.events.emit("drain-failed", node=node, host=self.backend.host(node), why=why, error=str(err))
                self._say(f"warning: could not drain {self.backend.host(node)}: {err}")
                continue
            self.events.emit("drained", node=node, host=self.backend.host(node), why=why, seconds=self.clock() - t0)
            self._say(f"drained {self.backend.host(node)}: sres: {why}")

    def _requeue(self, why: str, save: bool = False) -> Outcome:
        """The job cannot go on here: requeue it (it resumes from its saved state) or give up.

        ``save``: every rank is alive (preemption), so the newest committed step is persisted
        first; after a node loss the generation is broken and the last periodic save serves.
        """
        c = self.config
        if c.restart_count >= c.max_requeues:
            return self._fail(f"{why}; the job was already requeued {c.restart_count} time(s) "
                              f"(--max-requeues {c.max_requeues})")
        saved = self.flush_persistent(c.preempt_save_timeout_s) if save else None
        if save and saved is None:
            self._say("warning: nothing was persisted before the requeue (no --persistent-dir, or the save failed): "
                      "the restart resumes from the newest state the tiers still hold")
        self.events.emit("requeue", why=why, restart_count=c.restart_count, saved_step=saved)
        self._say(f"{why}: requeueing the job (restart {c.restart_count + 1} of at most {c.max_requeues})")
        self.store.set(membership.SHUTDOWN, "1")
        try:
            self.backend.requeue(why)
        except SresError as err:
            return self._fail(f"{why}; and the job cannot be requeued: {err}")
        return Outcome(False, f"requeued: {why}", self.events.events, requeued=True)

    def _publish(self, members: dict[int, str], replaced: tuple[int, ...], reason: str) -> None:
        generation = self.plan.generation + 1 if self.plan else 1
        plan = Plan(generation=generation, world_size=len(members), members=dict(members),
                    slots={s: self.slots[s].info for s in members.values()},
                    procs_per_node=self.config.procs_per_node, replaced=replaced, reason=reason)
        membership.publish_plan(self.store, plan)
        self.plan = plan
        self._reports = {}
        self.backend.echo_slot = members[0]
        self.events.emit("generation", generation=generation, world_size=plan.world_size, replaced=list(replaced))
        if generation == 1:
            self._start_t = self.wall()

    def _check_recovered(self) -> None:
        if not self.pending:
            return
        g = self.plan.generation
        keys = [membership.first_step_key(g), membership.recovery_key(g)]
        if not self.store.check(keys):
            return
        first_step_t = float(self.store.get(keys[0]))
        info = json.loads(self.store.get(keys[1]))
        for fault in self.pending:
            seconds = first_step_t - fault.t
            self.events.emit("recovered", generation=g, step=info["step"], source=info["source"],
                             bytes=info["bytes"], seconds=seconds, steps_lost=max(0, fault.progress - info["step"]),
                             release_s=self._release_seconds(fault), reform_s=info["formed_t"] - fault.t,
                             transfer_s=info["recovered_t"] - info["formed_t"],
                             first_step_s=first_step_t - info["recovered_t"])
            self._say(f"recovered: generation {g} resumed after step {info['step']} from {info['source']} "
                      f"in {seconds:.2f} s")
        self.pending.clear()

    def _release_seconds(self, fault: _Fault) -> float | None:
        """From the fault to the last survivor leaving the faulted generation (its report)."""
        times = []
        for slot in self.slots:
            key = membership.report_key(fault.generation, slot)
            if self.store.check([key]):
                times.append(Report.from_json(self.store.get(key)).t)
        return max(times) - fault.t if times else None

    def _finish(self) -> Outcome:
        self._check_recovered()
        end = self.wall()
        steps = int(self.store.get(membership.PROGRESS)) + 1 if self.store.check([membership.PROGRESS]) else 0
        goodput = None
        first = membership.first_step_key(1)
        if self.store.check([membership.STATS, first]) and steps > 1:
            median = json.loads(self.store.get(membership.STATS))["median_step_s"]
            window = end - float(self.store.get(first))
            goodput = min(1.0, (steps - 1) * median / window) if window > 0 else None
        self.events.emit("finished", steps=steps, faults=self.faults, goodput=goodput,
                         generations=self.plan.generation, wall_s=end - self._start_t)
        self._say(summary(self.events.events))
        if self.config.tiers is not None:
            tiers.remove_job(self.config.tiers.job_id)  # finished: nothing will restart from its RAM tier
        return Outcome(True, events=self.events.events)

    def _fail(self, reason: str) -> Outcome:
        self.events.emit("failed", reason=reason, faults=self.faults)
        if self.first_culprit is not None and self.first_culprit.traceback:
            self.out.write(f"first failure (rank {self.first_culprit.rank}):\n{self.first_culprit.traceback}")
        for slot in self.slots:
            self.backend.kill(slot)
        self._say(f"error: {reason}")
        return Outcome(False, reason, self.events.events)

    def _spawn(self, slot: str, node: int, local: int) -> None:
        c = self.config
        env = dict(os.environ)
        env.update({
            "SRES_STORE_HOST": self.backend.store_host, "SRES_STORE_PORT": str(self.store.port),
            "SRES_LIVENESS_PORT": str(self.liveness.port), "SRES_SLOT": slot, "SRES_PREEMPT_SIGNAL": c.preempt_signal,
            "SRES_NODE": str(node), "SRES_LOCAL_RANK": str(local), "SRES_BACKEND": c.backend,
            "SRES_INJECT": ";".join(i.spec for i in c.injections), "SRES_HEARTBEAT_S": str(c.heartbeat_s),
            "SRES_REFORM_TIMEOUT_S": str(c.reform_timeout_s), "SRES_REPLICATION_FACTOR": str(c.replication_factor),
            "SRES_LOG_DIR": str(Path(c.log_dir).resolve()), "LOCAL_RANK": str(local),
            "PYTHONUNBUFFERED": "1",
        })
        if c.tiers is not None:
            env[tiers.TIERS_ENV] = c.tiers.to_json()
        self.backend.spawn(slot, node, c.command, env)
        now = self.clock()
        self.slots[slot] = _Slot(SlotInfo(node, local), started=now, heartbeat_changed=now)

    def _drain_rank_events(self) -> None:
        """Copy the ranks' events (tier saves, restores, refused checkpoints) into events.jsonl."""
        records, self._rank_events_seen = membership.pop_events(self.store, self._rank_events_seen)
        for record in records:
            self.events.emit(record.pop("event"), **record)

    def flush_persistent(self, timeout_s: float) -> int | None:
        """Persist the newest committed state to the persistent tier now (preemption, requeue).

        Two rounds through store keys that every rank watches on a thread of its own (no commit
        needed): each rank reports the newest step in its RAM tier and from then on keeps every
        commit there; then every rank copies the newest step reported (ranks are at most a
        commit apart: a rank one behind copies it once it commits it) to the persistent
        directory. Returns that step once it is complete on every rank, or None (no persistent
        tier, nothing committed, a failure, the timeout; a ``flush-failed`` event says why).
        Training goes on meanwhile. Callable from any thread.
        """
        if self.config.tiers is None or not self.config.tiers.persistent_dir or self.plan is None:
            return None
        store = self.store.clone()
        deadline = self.clock() + timeout_s
        answers = self._flush_round(store, None, deadline)
        target = max((a["step"] for a in answers or () if a["step"] is not None), default=None)
        if answers and target is not None and all(a["step"] is not None for a in answers):
            answers = self._flush_round(store, target, deadline)
            if answers and all(a["step"] == target for a in answers):
                self.events.emit("flushed", step=target, tier="persistent")
                return target
        errors = sorted({a["error"] for a in answers or () if a["error"]}) or ["timeout"]
        self.events.emit("flush-failed", errors=errors)
        return None

    def _flush_round(self, store: dist.Store, step: int | None, deadline: float) -> list[dict] | None:
        request = store.add(membership.FLUSH_SEQ, 1)
        store.set(membership.FLUSH_REQUEST, json.dumps({"id": request, "step": step,
                                                        "timeout_s": max(1.0, deadline - self.clock())}))
        keys = [membership.flush_done_key(request, rank) for rank in self.plan.members]
        while not store.check(keys):
            if self.clock() > deadline:
                return None
            time.sleep(0.05)
        return [json.loads(store.get(k)) for k in keys]

    def _respawn_name(self, node: int, local: int) -> str:
        self._respawns += 1
        return f"n{node}p{local}r{self._respawns}"

    def _say(self, text: str) -> None:
        for line in text.splitlines():
            self.out.write(f"sres: {line}\n")
        self.out.flush()
