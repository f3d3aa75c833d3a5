"""What the supervisor sees each tick, as one immutable
:class:`~launcher.supervisor.observe.view.Observation`.

The :class:`Observer` reads the world (process exits through the placement, heartbeats,
readiness, first steps, step times, reports and requests on the store, node evidence from
Slurm) and keeps the bookkeeping that reading needs (who is alive, when each heartbeat last
moved) in books of its own; the executor's slots it only reads. It decides nothing, changes
nothing of the run and writes nothing: the steps it read go out in the observation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from launcher.observability.straggler import Straggler
from launcher.placement import JobControl, NodeInspector, NodeSupply, RankProcesses
from launcher.supervisor.config import RunConfig
from launcher.supervisor.observe.report_reader import ReportReader
from launcher.supervisor.observe.step_reports import StepReports, StepSource
from launcher.supervisor.observe.view import Observation, RankStep, Request
from resilience.contract.injections import FAULT_KINDS
from resilience.contract.messages import Report, SlotInfo
from resilience.contract.run_store import RunStore


class LinkReadings(StepSource, Protocol):
    """What ranks sent over their liveness connections (the supervisor's ``LivenessServer``):
    read from memory, no store request per rank."""

    def beats(self, slot: str) -> int | None:
        """Heartbeats received from the slot; None where it has no connection (store beats)."""

    def take_lost(self) -> list[str]:
        """Slots whose connection closed since the last call: their processes are looked at now."""

    def rung(self, what: str) -> int:
        """How many times ranks said they wrote ``what`` (``report``, ``event``) to the store."""


@dataclass
class SlotState:
    """One rank process, as the executor knows it (the executor alone writes it)."""

    info: SlotInfo
    started: float
    started_wall: float = 0.0
    """Wall time just before the start, to compare with the process's own ready time."""
    alive: bool = True
    """False once an observation said its process ended (:attr:`Observation.exited`)."""
    forked: bool = False
    """Forked from its machine's fork server, not started cold."""
    killed_as: str | None = None  # "hang" | "node": why we killed it
    killed_t: float | None = None
    """Wall-clock time we killed it: the fault's time (survivors may report before we look again)."""


@dataclass
class _Watch:
    """What the Observer has read of one process: its own books, so that reading the world
    never writes the executor's."""

    started: float
    """When the executor started the process (a slot name started again is a new process)."""
    heartbeat_changed: float
    alive: bool = True
    heartbeat: int = 0
    ready_t: float | None = None
    """Warmed up and waiting for a plan since then, wall time (its ``ready/<slot>`` key)."""


FULL_SCAN_SLOTS = 128
"""Up to this many slots every process is polled every tick; beyond, :data:`SCAN_SLOTS_PER_TICK`
slots' worth a tick (every slot every ``slots / 32`` ticks: 2.6 s at 4,096) and, every tick, the
slots whose liveness connection closed or that we killed (a process's death closes its
connection: it is still seen in the tick it happens; the scan is for a process that died before
it had one)."""
SCAN_SLOTS_PER_TICK = 32
"""Polls a tick that the scan of a large run amounts to: at 128, 4,096 slots were 6,400 polls a
second, 2% of a core."""
LEND_PERIOD_S = 3.0
"""How often a world below ``--max-nodes`` asks Slurm for idle nodes (one ``sinfo``)."""


class Observer:
    """Reads the world for the supervisor; cheap enough to run every tick."""

    def __init__(
        self,
        config: RunConfig,
        store: RunStore,
        slots: dict[str, SlotState],
        wall: Callable[[], float],
        *,
        processes: RankProcesses,
        inspector: NodeInspector,
        supply: NodeSupply,
        job: JobControl,
        requests: Callable[[], tuple[Request, ...]] = tuple,
        link: LinkReadings | None = None,
        killed: set[str] | None = None,
    ) -> None:
        """What it reads a placement through: process exits (``processes``), node evidence
        (``inspector``), idle nodes to lend (``supply``), the job's time limits (``job``)."""
        self.config, self.store, self.slots, self.wall = config, store, slots, wall
        self.processes, self.inspector, self.supply, self.job = processes, inspector, supply, job
        self._requests = requests
        self.preempted: str | None = None
        """Set by the preemption signal's handler (the batch shell gets it) or a rank's relay."""
        self._link = link
        self._killed = killed if killed is not None else set()
        """The executor's killed slots (read only)."""
        self._gone: set[str] = set()
        """Slots whose process this Observer saw end."""
        self._suspects: set[str] = set()
        """Slots whose connection closed, not yet seen ended: polled every tick."""
        self._ticks = 0
        self._ranks: tuple[int, dict[str, int]] = (-1, {})
        """The generation and its members' slot -> rank (:meth:`_rank_of`)."""
        self.reports = ReportReader(store, config.beat_s / 2, link)
        self._injected = frozenset(FAULT_KINDS[i.kind].effect for i in config.injections)
        """The effects of the run's injected faults: their requests are looked for every tick,
        a round trip a tick that a run without them does not pay."""
        self._next_heartbeat_check = 0.0
        self._node_kills_seen = self._link_faults_seen = 0
        self._limits: tuple[float | None, float | None] | None = None
        self.step_reports = StepReports(store, config.straggler, link)
        self._steps: list[RankStep] = []
        self._stragglers: list[Straggler] = []
        self._reclaims_seen = 0
        self._warm_seen: tuple[frozenset[str], Mapping[str, float]] | None = None
        """The warm slots and when each became so; None once a watch changed (rebuilt then, not
        every tick: 4,096 slots a tick took 4% of a core)."""
        self._reclaimed: set[int] = set()
        self._next_lend_look = 0.0
        self._watched: dict[str, _Watch] = {}
        self._first_steps: dict[int, float] = {}

    def observe(
        self,
        now: float,
        generation: int,
        members: Mapping[int, str],
        spare_slots: set[str],
        dead_nodes: Iterable[int],
    ) -> Observation:
        seen_t = self.wall()
        exited = self._poll_exits()
        spares_exited = tuple((self.slots[s].info.node, s) for s in exited if s in spare_slots)
        hung = self._silent(now, generation, members)
        reports = self.reports.read(now, generation, members)
        lost, seen_t = self._lost(generation, members, reports, seen_t)
        if len(reports) == len(members) and all(r.kind == "done" for r in reports.values()):
            self._read_steps(generation, members)  # the last steps, for the account
        if self.preempted is not None and self._limits is None:
            self._limits = self.job.time_limits()  # once: how near the time limit the signal came
        left, limit = self._limits or (None, None)
        steps, stragglers = self._take_steps()
        warm, warm_at = self._warm()
        return Observation(
            seen_t=seen_t,
            lost=lost,
            reports=reports,
            hung=tuple(hung),
            spares_exited=spares_exited,
            node_kills=self._node_kill_requests(members, set(dead_nodes)),
            link_faults=self._link_fault_requests(),
            child_kill=self._child_kill_request(),
            preempted=self.preempted,
            time_left_s=left,
            time_limit_s=limit,
            stragglers=stragglers,
            steps=steps,
            requests=self._requests(),
            reclaimed=tuple(sorted(self._reclaimed)),
            lendable=self._lendable(now, members),
            exited=exited,
            warm=warm,
            warm_at=warm_at,
            generation=generation,
            first_step_t=self._first_step(generation),
        )

    def _lost(
        self, generation: int, members: Mapping[int, str], reports: dict[str, Report], seen_t: float
    ) -> tuple[dict[int, str], float]:
        """Member rank -> how it was lost, and the fault's time (a kill of ours, if earlier). Only
        slots seen ended or killed are looked at: a few, whatever the number of ranks."""
        lost: dict[int, str] = {}
        rank_of = self._rank_of(generation, members)
        for rank, slot in sorted((rank_of[s], s) for s in self._gone | self._killed if s in rank_of):
            state = self.slots[slot]
            # A process the supervisor killed is lost from that moment, not from when its exit
            # lands (tens of ms for a large process): a node's ranks are one fault at once.
            gone = not self._watch(slot).alive or state.killed_as is not None
            if gone and slot not in reports:  # read in order, reports may wait behind an unwritten one
                self._late_report(slot, reports)
            if gone and not (slot in reports and reports[slot].kind == "done"):
                rc = self.processes.poll(slot)
                lost[rank] = state.killed_as or ("kill" if rc is not None and rc < 0 else f"exit {rc}")
                if state.killed_t is not None:
                    seen_t = min(seen_t, state.killed_t)
        return lost, seen_t

    def _rank_of(self, generation: int, members: Mapping[int, str]) -> dict[str, int]:
        """Slot -> rank of the generation's members, made once per generation."""
        if self._ranks[0] != generation:
            self._ranks = (generation, {slot: rank for rank, slot in members.items()})
        return self._ranks[1]

    def _late_report(self, slot: str, reports: dict[str, Report]) -> None:
        if (report := self.reports.of_slot(slot)) is not None:
            reports[slot] = report

    def with_evidence(
        self,
        obs: Observation,
        node_of: Callable[[int], int],
        dead_nodes: set[int],
        every: Callable[[], set[int]] = set,
    ) -> Observation:
        """Ask about the nodes that lost a process (Slurm, a probe), only at a fault. When none of
        them answers, the others of the run (``every``) are asked until one (not the supervisor's
        own node: it proves nothing) does: if none does, the supervisor's own link is the cut."""
        nodes = ({node_of(rank) for rank in obs.lost} | {node for node, _ in obs.spares_exited}) - dead_nodes
        if not nodes:
            return obs
        evidence = {node: self.inspector.evidence(node) for node in sorted(nodes)}
        if not any(e.reachable for e in evidence.values()):
            for node in sorted(every() - dead_nodes - nodes):
                evidence[node] = self.inspector.evidence(node)
                if evidence[node].reachable and not evidence[node].runs_supervisor:
                    break
        return dataclasses.replace(obs, evidence=evidence)

    def _watch(self, slot: str) -> _Watch:
        """This Observer's record of a slot, begun when it first looks at one the executor started."""
        watch, started = self._watched.get(slot), self.slots[slot].started
        if watch is None or watch.started != started:
            watch = self._watched[slot] = _Watch(started, heartbeat_changed=started)
            self._gone.discard(slot)
            self._warm_seen = None
        return watch

    def _poll_exits(self) -> tuple[str, ...]:
        """Processes that ended since the last look: all of them, or in a large run (see
        :data:`FULL_SCAN_SLOTS`) those whose connection closed or that were killed."""
        self._ticks += 1
        every = 1 if len(self.slots) <= FULL_SCAN_SLOTS else len(self.slots) // SCAN_SLOTS_PER_TICK
        closed = self._link.take_lost() if self._link is not None else []
        if self._link is None or self._ticks % every == 0:
            candidates: Iterable[str] = list(self.slots)
        else:
            self._suspects.update(s for s in closed if s in self.slots)
            candidates = self._suspects | (self._killed - self._gone)
        exited = []
        for slot in candidates:
            watch = self._watch(slot)
            if watch.alive and self.processes.poll(slot) is not None:
                watch.alive = False
                self._warm_seen = None
                self._gone.add(slot)
                exited.append(slot)
        self._suspects -= self._gone
        return tuple(exited)

    def _warm(self) -> tuple[frozenset[str], Mapping[str, float]]:
        if self._warm_seen is None:
            at = MappingProxyType(
                {s: w.ready_t for s, w in self._watched.items() if w.alive and w.ready_t is not None}
            )
            self._warm_seen = (frozenset(at), at)
        return self._warm_seen

    def _first_step(self, generation: int) -> float | None:
        """Once seen, a generation's first step is kept: the store is asked until then, and only
        when ``--standby`` waits for it."""
        if generation not in self._first_steps and self.config.standby:
            t = self.store.progress.first_step_t(generation)
            if t is not None:
                self._first_steps[generation] = t
        return self._first_steps.get(generation)

    def _read_steps(self, generation: int, members: Mapping[int, str]) -> None:
        steps, stragglers = self.step_reports.read(generation, members)
        self._steps += steps
        self._stragglers += stragglers

    def _take_steps(self) -> tuple[tuple[RankStep, ...], tuple[Straggler, ...]]:
        """The steps and stragglers read since the last observation, handed out once."""
        found = tuple(self._steps), tuple(self._stragglers)
        self._steps, self._stragglers = [], []
        return found

    def _replaced(self, slot: str, members: Mapping[int, str]) -> bool:
        """Whether ``slot``'s process left the run's plan lost (it ended, or was killed as hung or
        with its node): what it says now is a stale process's (cut off, then back). A member's
        word counts even when its process has already ended (Slurm's preemption kills it next)."""
        state = self.slots.get(slot)
        lost = slot in self._gone or (state is not None and state.killed_as is not None)
        return lost and slot not in members.values()

    def _silent(self, now: float, generation: int, members: Mapping[int, str]) -> list[str]:
        # Every half period is enough to see a silence of hang_timeout; every tick would cost
        # store round trips that compete with the ranks for CPU (measured: 9% on 2 cores).
        if now < self._next_heartbeat_check:
            return []
        self._next_heartbeat_check = now + self.config.beat_s / 2
        self._read_steps(generation, members)
        by = self.store.signals.preempted_by() if self.preempted is None else None
        if by is not None and not self._replaced(by, members):
            self.preempted = f"preempted (a rank received {self.config.preempt_signal_name})"
        self._read_reclaims()
        alive = [s for s in self.slots if self._watch(s).alive]
        all_linked = self._link is not None
        for slot in alive:
            value, linked = self._beats(slot)
            all_linked &= linked
            watch = self._watched[slot]
            if value > watch.heartbeat:  # only a newer beat (a replayed one is not)
                watch.heartbeat, watch.heartbeat_changed = value, now
            if watch.ready_t is None and value > 0:
                watch.ready_t = self.store.liveness.ready_at(slot)
                self._warm_seen = None
        self.reports.all_linked = all_linked
        member_slots = set(members.values())
        return silent_slots(
            {s: self._watched[s].heartbeat_changed for s in alive if s in member_slots},
            {s: self.slots[s].started for s in alive},
            {s: self._watched[s].heartbeat > 0 for s in alive},
            now,
            self.config.hang_timeout_s,
            self.config.startup_timeout_s,
        )

    def _beats(self, slot: str) -> tuple[int, bool]:
        """The slot's heartbeats, and whether over its liveness connection (else from the store)."""
        beats = self._link.beats(slot) if self._link is not None else None
        if beats is None:
            return self.store.liveness.heartbeats(slot), False
        return beats, True

    def _read_reclaims(self) -> None:
        """Lent nodes Slurm is taking back (their ranks relayed its SIGTERM): read with the
        heartbeats, not every tick, as a grace time is tens of seconds."""
        count = self.store.signals.reclaims()
        if count != self._reclaims_seen:
            self._reclaims_seen = count
            live = [s for s in self.slots if self._watch(s).alive]
            self._reclaimed |= {self.slots[s].info.node for s in self.store.signals.reclaimed_slots(live)}

    def _lendable(self, now: float, members: Mapping[int, str]) -> int | None:
        if now < self._next_lend_look:
            return None
        self._next_lend_look = now + LEND_PERIOD_S  # first: counting the nodes is O(N) too
        if len({self.slots[s].info.node for s in members.values()}) >= self.config.elastic.bounds[1]:
            return None
        return self.supply.lendable()

    def _child_kill_request(self) -> bool:
        return "kill-spare" in self._injected and self.store.faults.take_child_kill()

    def _link_fault_requests(self) -> tuple[str, ...]:
        """Link faults a fault injection (``cut:N:for=D:step=S``, ...) asked the supervisor for."""
        if "break-link" not in self._injected:
            return ()
        self._link_faults_seen, specs = self.store.faults.link_faults_after(self._link_faults_seen)
        return tuple(specs)

    def _node_kill_requests(self, members: Mapping[int, str], dead_nodes: set[int]) -> tuple[int, ...]:
        """Nodes a fault injection (``node:N:step=S``) asked the supervisor to kill."""
        if "kill-node" not in self._injected:
            return ()
        count = self.store.faults.node_kill_requests()
        if count == self._node_kills_seen:
            return ()
        self._node_kills_seen = count
        nodes = sorted({self.slots[s].info.node for s in members.values()} - dead_nodes)
        return tuple(node for node in nodes if self.store.faults.take_node_kill(node))


def silent_slots(
    last_change: Mapping[str, float],
    started: Mapping[str, float],
    seen: Mapping[str, bool],
    now: float,
    hang_timeout_s: float,
    startup_timeout_s: float,
) -> list[str]:
    """Slots whose heartbeat stopped: a hung process. Pure."""
    out = []
    for slot, changed in last_change.items():
        limit = hang_timeout_s if seen.get(slot) else startup_timeout_s
        since = changed if seen.get(slot) else started[slot]
        if now - since > limit:
            out.append(slot)
    return out
