"""What the supervisor sees each tick, as one immutable :class:`Observation`.

The :class:`Observer` reads the world (process exits through the placement, heartbeats,
readiness, first steps, reports and requests on the store, node evidence from Slurm) and keeps
the bookkeeping that reading needs (who is alive, when each heartbeat last moved) in books of
its own; the executor's slots it only reads. It decides nothing and changes nothing of the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from launcher.placement import NodeEvidence, Placement
from launcher.observability.straggler import Straggler
from launcher.supervisor.config import RunConfig
from launcher.supervisor.control import Request
from launcher.supervisor.step_reports import StepReports
from resilience.contract.messages import Report, SlotInfo
from resilience.contract.run_store import RunStore


@dataclass
class SlotState:
    """One rank process, as the executor knows it (the executor alone writes it)."""

    info: SlotInfo
    started: float
    alive: bool = True
    """False once an observation said its process ended (:attr:`Observation.exited`)."""
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
    ready: bool = False
    """Warmed up and waiting for a plan (its ``ready/<slot>`` key)."""


@dataclass(frozen=True)
class Observation:
    """One tick's facts. ``lost``: member rank -> how it was lost; ``reports``: this
    generation's reports by slot; ``evidence``: what can be seen of nodes that lost a rank."""

    seen_t: float = 0.0
    """Wall-clock time of this look: a fault's time, from which its recovery is measured."""
    lost: Mapping[int, str] = field(default_factory=dict)
    reports: Mapping[str, Report] = field(default_factory=dict)
    hung: tuple[str, ...] = ()
    node_kills: tuple[int, ...] = ()
    child_kill: bool = False
    """A fault injection asked the supervisor to kill one of its warm spares' processes."""
    spares_exited: tuple[tuple[int, str], ...] = ()
    preempted: str | None = None
    time_left_s: float | None = None
    """When ``preempted``: the job's time left and limit, as Slurm saw them then (None: no limit)."""
    time_limit_s: float | None = None
    evidence: Mapping[int, NodeEvidence] = field(default_factory=dict)
    stragglers: tuple[Straggler, ...] = ()
    """Ranks whose compute time per step stayed above the others' (reported once per streak)."""
    requests: tuple[Request, ...] = ()
    """Control requests (``sres resize/grow/shrink/status``) that arrived since the last tick."""
    reclaimed: tuple[int, ...] = ()
    """Lent nodes whose ranks got Slurm's signal that the node is being taken back."""
    lendable: int | None = None
    """Idle nodes the run could grow into, when looked at this tick (every ``LEND_PERIOD_S``)."""
    exited: tuple[str, ...] = ()
    """Slots whose process was seen to end in this look (members, spares and standbys alike)."""
    warm: frozenset[str] = frozenset()
    """Live slots that warmed up and wait for a plan (imports and first-use costs paid)."""
    generation: int = 0
    """The generation this look was taken for."""
    first_step_t: float | None = None
    """When ``generation`` made its first step; read only with ``--standby`` (which waits for it)."""

    @property
    def errors(self) -> dict[str, Report]:
        return {s: r for s, r in self.reports.items() if r.kind == "error"}

    @property
    def unrecoverable(self) -> Report | None:
        return next((r for r in self.reports.values() if r.kind == "unrecoverable"), None)

    @property
    def refused(self) -> Report | None:
        """A rank's ``train`` asked for what sres refuses (``RegistrationError``): the same on every entry."""
        return next((r for r in self.reports.values() if r.kind == "refused"), None)

    def all_done(self, members: Mapping[int, str]) -> bool:
        return len(self.reports) == len(members) and all(r.kind == "done" for r in self.reports.values())

    def all_paused(self, members: Mapping[int, str]) -> bool:
        """Every rank left the generation at the agreed step boundary (a resize)."""
        return len(self.reports) == len(members) and all(r.kind == "paused" for r in self.reports.values())


LEND_PERIOD_S = 3.0
"""How often a world below ``--max-nodes`` asks Slurm for idle nodes (one ``sinfo``)."""


class Observer:
    """Reads the world for the supervisor; cheap enough to run every tick."""

    def __init__(
        self,
        config: RunConfig,
        placement: Placement,
        store: RunStore,
        slots: dict[str, SlotState],
        wall: Callable[[], float],
        requests: Callable[[], tuple[Request, ...]] = tuple,
    ) -> None:
        self.config, self.placement, self.store, self.slots, self.wall = config, placement, store, slots, wall
        self._requests = requests
        self.preempted: str | None = None
        """Set by the preemption signal's handler (the batch shell gets it) or a rank's relay."""
        self._reports: dict[str, Report] = {}
        self._reports_seen = (0, 0)
        self._next_heartbeat_check = 0.0
        self._node_kills_seen = 0
        self._limits: tuple[float | None, float | None] | None = None
        self.step_reports = StepReports(store, config.log_dir, config.straggler)
        self._stragglers: list[Straggler] = []
        self._reclaims_seen = 0
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
        reports = self._read_reports(generation, members)
        lost: dict[int, str] = {}
        for rank, slot in members.items():
            state = self.slots[slot]
            # A process the supervisor killed is lost from that moment, not from when its exit
            # lands (tens of ms for a large process): a node's ranks are one fault at once.
            gone = not self._watch(slot).alive or state.killed_as is not None
            if gone and not (slot in reports and reports[slot].kind == "done"):
                rc = self.placement.poll(slot)
                lost[rank] = state.killed_as or ("kill" if rc is not None and rc < 0 else f"exit {rc}")
                if state.killed_t is not None:
                    seen_t = min(seen_t, state.killed_t)
        if len(reports) == len(members) and all(r.kind == "done" for r in reports.values()):
            self._stragglers += self.step_reports.read(generation, members)  # the last steps, for the account
        if self.preempted is not None and self._limits is None:
            self._limits = self.placement.time_limits()  # once: how near the time limit the signal came
        left, limit = self._limits or (None, None)
        return Observation(
            seen_t=seen_t,
            lost=lost,
            reports=reports,
            hung=tuple(hung),
            spares_exited=spares_exited,
            node_kills=self._node_kill_requests(members, set(dead_nodes)),
            child_kill=self._child_kill_request(),
            preempted=self.preempted,
            time_left_s=left,
            time_limit_s=limit,
            stragglers=self._take_stragglers(),
            requests=self._requests(),
            reclaimed=tuple(sorted(self._reclaimed)),
            lendable=self._lendable(now, members),
            exited=exited,
            warm=self._warm(),
            generation=generation,
            first_step_t=self._first_step(generation),
        )

    def with_evidence(
        self, obs: Observation, node_of: Callable[[int], int], dead_nodes: set[int]
    ) -> Observation:
        """Ask about the nodes that lost a rank (Slurm, a slurmd probe): only when a fault is seen."""
        nodes = {node_of(rank) for rank in obs.lost} - dead_nodes
        if not nodes:
            return obs
        return dataclasses.replace(
            obs, evidence={node: self.placement.evidence(node) for node in sorted(nodes)}
        )

    def _watch(self, slot: str) -> _Watch:
        """This Observer's record of a slot, begun when it first looks at one the executor started."""
        watch, started = self._watched.get(slot), self.slots[slot].started
        if watch is None or watch.started != started:
            watch = self._watched[slot] = _Watch(started, heartbeat_changed=started)
        return watch

    def _poll_exits(self) -> tuple[str, ...]:
        exited = []
        for slot in self.slots:
            watch = self._watch(slot)
            if watch.alive and self.placement.poll(slot) is not None:
                watch.alive = False
                exited.append(slot)
        return tuple(exited)

    def _warm(self) -> frozenset[str]:
        return frozenset(s for s, w in self._watched.items() if w.alive and w.ready)

    def _first_step(self, generation: int) -> float | None:
        """Once seen, a generation's first step is kept: the store is asked until then, and only
        when ``--standby`` waits for it."""
        if generation not in self._first_steps and self.config.standby:
            t = self.store.first_step_t(generation)
            if t is not None:
                self._first_steps[generation] = t
        return self._first_steps.get(generation)

    def _read_reports(self, generation: int, members: Mapping[int, str]) -> dict[str, Report]:
        # One counter per generation says how many reports exist: read them only when it moves.
        if generation != self._reports_seen[1]:
            self._reports = {}
        count = self.store.reports_written(generation)
        if (count, generation) != self._reports_seen:
            for slot in members.values():
                if (
                    slot not in self._reports
                    and (report := self.store.report_of(generation, slot)) is not None
                ):
                    self._reports[slot] = report
            self._reports_seen = (count, generation)
        return dict(self._reports)

    def _take_stragglers(self) -> tuple[Straggler, ...]:
        found, self._stragglers = tuple(self._stragglers), []
        return found

    def _silent(self, now: float, generation: int, members: Mapping[int, str]) -> list[str]:
        # Every half period is enough to see a silence of hang_timeout; every tick would cost
        # store round trips that compete with the ranks for CPU (measured: 9% on 2 cores).
        if now < self._next_heartbeat_check:
            return []
        self._next_heartbeat_check = now + self.config.heartbeat_s / 2
        self._stragglers += self.step_reports.read(generation, members)
        if self.preempted is None and self.store.preempted():
            self.preempted = f"preempted (a rank received {self.config.preempt_signal_name})"
        self._read_reclaims()
        alive = [s for s in self.slots if self._watch(s).alive]
        for slot in alive:
            value = self.store.heartbeats(slot)
            watch = self._watched[slot]
            if value != watch.heartbeat:
                watch.heartbeat, watch.heartbeat_changed = value, now
            if not watch.ready and value > 0:
                watch.ready = self.store.is_ready(slot)
        member_slots = set(members.values())
        return silent_slots(
            {s: self._watched[s].heartbeat_changed for s in alive if s in member_slots},
            {s: self.slots[s].started for s in alive},
            {s: self._watched[s].heartbeat > 0 for s in alive},
            now,
            self.config.hang_timeout_s,
            self.config.startup_timeout_s,
        )

    def _read_reclaims(self) -> None:
        """Lent nodes Slurm is taking back (their ranks relayed its SIGTERM): read with the
        heartbeats, not every tick, as a grace time is tens of seconds."""
        count = self.store.reclaims()
        if count != self._reclaims_seen:
            self._reclaims_seen = count
            live = [s for s in self.slots if self._watch(s).alive]
            self._reclaimed |= {self.slots[s].info.node for s in self.store.reclaimed_slots(live)}

    def _lendable(self, now: float, members: Mapping[int, str]) -> int | None:
        if now < self._next_lend_look:
            return None
        if len({self.slots[s].info.node for s in members.values()}) >= self.config.elastic.max_nodes:
            return None
        self._next_lend_look = now + LEND_PERIOD_S
        return self.placement.lendable()

    def _child_kill_request(self) -> bool:
        return self.store.take_child_kill()

    def _node_kill_requests(self, members: Mapping[int, str], dead_nodes: set[int]) -> tuple[int, ...]:
        """Nodes a fault injection (``node:N:step=S``) asked the supervisor to kill."""
        count = self.store.node_kill_requests()
        if count == self._node_kills_seen:
            return ()
        self._node_kills_seen = count
        nodes = sorted({self.slots[s].info.node for s in members.values()} - dead_nodes)
        return tuple(node for node in nodes if self.store.take_node_kill(node))


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
