"""The per-job supervisor: hosts the store, spawns ranks and spares, and runs the loop
observe -> decide -> perform.

It is never a rank, so losing rank 0 loses neither the store nor the decisions. A fault is
seen from the supervisor's own watch (a process exit, at once; a silent heartbeat, after the
hang timeout; a rank's report), never from a collective timeout. What to do about it is
decided by :func:`~launcher.supervisor.policy.decide` (pure) and carried out by the
:class:`~launcher.supervisor.executor.Executor`. While a fault is open the tick decides again, at
most ``decision_limit()`` times (``MAX_DECISIONS_PER_TICK`` plus one per node, else
``DecisionLoopError``), so that one fault is settled in one tick when the world allows.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TextIO

from launcher.errors import SresError
from launcher.observability import event_types, metrics
from launcher.run import signal_latch
from launcher.run.options import rank_fields
from launcher.observability.events import INTERRUPTED, EventLog
from launcher.placement import ForkHosts, Placement, RankProcesses
from launcher.placement.forks import ForkingProcesses
from launcher.placement.local import LocalPlacement
from launcher.supervisor.actions import WaitForNode
from launcher.supervisor.books import Books, Outcome
from launcher.supervisor.config import RunConfig
from launcher.supervisor.control import ControlServer
from launcher.supervisor.executor import Executor
from launcher.supervisor.flush import flush_persistent
from launcher.supervisor.hands import Clocks, Hands
from launcher.supervisor.observe import Observer, SlotState
from launcher.supervisor.policy import decide
from launcher.supervisor.producers import BatchProducers
from launcher.supervisor.recovery import RecoveryWatch
from launcher.supervisor.step_reports import StepLog
from launcher.supervisor.view import Observation
from resilience.contract.messages import Plan, RankEvent
from resilience.contract.rank_events import RankEvents
from resilience.contract.run_dir import RunDir
from resilience.contract.run_store import RunStore
from resilience.contract import run_secret
from resilience.contract.liveness import LivenessServer
from resilience.contract.rank_env import RankEnv

TICK_S = 0.02
METRICS_PERIOD_S = 1.0
"""How often live metrics read the step counter (and rewrite the textfile)."""
MAX_DECISIONS_PER_TICK = 16
"""How many times one tick may ask the policy, plus one per node of the run. An open fault is
re-decided after each step that changes the facts: each source of
:data:`~launcher.supervisor.replace_policy.REPLACEMENT_ORDER` is tried once, and a source that serves
adds a node (at most one per node lost) or ends the fault. More decisions are a bug of ours."""


class DecisionLoopError(RuntimeError):
    """The policy was asked more often in one tick than :func:`decision_limit` allows: its
    actions kept a fault open without ending it (a bug of the supervisor's, never the user's)."""


MAX_DROPPED_EVENTS = 100
"""``dropped-input`` events written at most per run: a flood of bad input must not fill the disk."""


def decision_limit(nodes: int) -> int:
    """The most decisions one tick may take in a run of ``nodes`` nodes (spares included)."""
    return MAX_DECISIONS_PER_TICK + nodes


class Supervisor:
    def __init__(
        self,
        config: RunConfig,
        placement: Placement | None = None,
        liveness: LivenessServer | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        out: TextIO | None = None,
    ) -> None:
        self.config = config
        self.placement: Placement = placement or LocalPlacement(config.log_dir)
        self.liveness = liveness or LivenessServer(
            run_secret.kept_in(config.log_dir), host=self.placement.store_host
        )
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.events = EventLog(RunDir(Path(config.log_dir)).events, wall)
        self.store = RunStore.host(self.liveness.secret)
        self.recovery = RecoveryWatch(self.store, self.events, lambda: list(self.books.slots), self._say)
        self.control = ControlServer(Path(config.log_dir))
        self.books = Books.for_run(config)
        self.processes = self._processes()
        self.executor = Executor(self._hands(out or sys.stderr))  # stderr as it is now, not at import
        p = self.placement  # each part takes the capabilities it uses
        self.observer = Observer(
            config,
            self.store,
            self.books.slots,
            wall,
            processes=self.processes,
            inspector=p,
            supply=p,
            job=p,
            requests=self.control.take,
        )
        self.step_log = StepLog(Path(config.log_dir))
        self.producers = BatchProducers(self.store, p, p, config.command, self._rank_env, self.events, clock)
        self._rank_events = RankEvents(self.store)
        self._warned: set[str] = set()
        self._dropped = 0
        self.metrics = metrics.start(
            config.metrics_port, config.metrics_addr, config.metrics_textfile, self.events
        )
        self._next_metrics = 0.0
        self._stepped = False
        """The run made its first step: fork servers start then (before, they would slow the ranks' start)."""

    def _processes(self) -> RankProcesses:
        """Rank processes forked from a warm server per machine where the placement can run one."""
        p = self.placement
        if not self.config.fork_server or not isinstance(p, ForkHosts):
            return p
        return ForkingProcesses(p, p, self.config.command, self._rank_env, self.events)

    def _hands(self, out: TextIO) -> Hands:
        p = self.placement
        return Hands(
            config=self.config,
            books=self.books,
            processes=self.processes,
            names=p,
            exits=p,
            supply=p,
            job=p,
            store=self.store,
            events=self.events,
            recovery=self.recovery,
            env=self._rank_env,
            flush=self.flush_persistent,
            clocks=Clocks(self.clock, self.wall, self.sleep),
            out=out,
            answer=self.control.answer,
        )

    @property
    def slots(self) -> dict[str, SlotState]:
        return self.books.slots

    @property
    def plan(self) -> Plan | None:
        return self.books.plan

    # --- lifecycle ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        c = self.config
        self.events.emit(
            "start",
            nodes=c.nodes,
            procs_per_node=c.procs_per_node,
            spares=c.spares,
            world_size=c.world_size,
            command=list(c.command),
            injections=[i.spec for i in c.injections],
            restart_count=c.restart_count,
            hosts=[self.placement.host(n) for n in range(c.nodes + c.spares)],
        )
        if self.metrics is not None:
            where = self.events.emit("metrics", **self.metrics.where())
            self._say(f"metrics: {where['url'] or where['textfile']}")
        previous = self._catch_preemption()
        try:
            # No plan yet: the policy starts the run (plan 1); a start that fails ends it here.
            started = self._settle(self.clock(), Observation())
            return started if started is not None else self._loop()
        except KeyboardInterrupt:
            # Ctrl-C, or a canceller that kills this process soon after (submitit's local
            # controller: SIGINT, then SIGKILL a second later): the ranks go first, not last.
            self.placement.stop_all(timeout_s=0.0)
            return self.executor.fail(INTERRUPTED)
        except SresError as err:  # a user's, met only once running (a command that cannot start)
            return self.executor.fail(str(err))
        except BaseException as err:
            # Our bug: the timeline still ends with a "failed" event, and the traceback shows.
            self.executor.fail(f"internal error of the supervisor: {type(err).__name__}: {err}")
            raise
        finally:
            if previous is not None:
                signal.signal(getattr(signal, c.preempt_signal_name), previous)
            self.control.close()
            self.store.plans.shut_down()
            self.producers.stop()  # they never leave by themselves
            self.processes.stop_all(timeout_s=30.0)  # fork servers first told to stop forking
            self.executor.after_stop()
            self._collect_rank_events(writers_gone=True)
            self.liveness.close()
            if self.metrics is not None:
                self.metrics.update(self._progress())
                self.metrics.close()
            self.events.close()

    def _catch_preemption(self) -> Callable[[int, FrameType | None], object] | int | signal.Handlers | None:
        """The batch shell gets the preemption signal (``sbatch --signal=B:USR2@T``); so may ranks.
        Returns the handler it replaced (None: not caught here, or the old one was not Python's)."""

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            self.observer.preempted = f"preempted ({signal.Signals(signum).name})"

        try:
            previous = signal.signal(getattr(signal, self.config.preempt_signal_name), on_signal)
        except ValueError:  # not the main thread (an embedding program): ranks still relay it
            return None
        if signal_latch.caught() == self.config.preempt_signal_name:  # it came while we were starting
            self.observer.preempted = f"preempted ({signal_latch.caught()}, during start-up)"
        return previous

    def _loop(self) -> Outcome:
        while True:
            outcome = self.tick()
            if outcome is not None:
                return outcome
            plan = self.books.current_plan
            self.recovery.check(plan.generation)
            nodes = {self.books.slots[s].info.node for s in plan.members.values()}
            self.producers.tick(nodes)
            if isinstance(self.processes, ForkingProcesses):
                self._stepped = self._stepped or self._progress() is not None
                joining = self.books.resize.joining if self.books.resize is not None else ()
                self.processes.tick(nodes | {*self.books.spare_nodes, *joining}, started=self._stepped)
            self._collect_rank_events()
            if self.metrics is not None and self.clock() >= self._next_metrics:
                self._next_metrics = self.clock() + METRICS_PERIOD_S
                self.metrics.update(self._progress(), self.observer.step_reports.scores)
            self.sleep(TICK_S)

    def _progress(self) -> int | None:
        return self.store.progress.step()

    def tick(self) -> Outcome | None:
        """Observe and perform what the policy decides; when that killed a process (a hang, an
        injected node loss), once more at once: its ranks are lost from that moment, so the
        fault opens in this tick, not a tick later."""
        killed = self._killed()
        outcome = self._observe_and_settle()
        if outcome is None and self._killed() > killed:
            outcome = self._observe_and_settle()
        return outcome

    def _killed(self) -> int:
        return sum(st.killed_as is not None for st in self.books.slots.values())

    def _observe_and_settle(self) -> Outcome | None:
        now = self.clock()
        b, plan = self.books, self.books.current_plan
        obs = self.observer.observe(
            now, plan.generation, plan.members, self.executor.spare_slots(), b.dead_nodes
        )
        if obs.lost:
            obs = self.observer.with_evidence(obs, lambda r: b.slots[plan.members[r]].info.node, b.dead_nodes)
        self.step_log.append(obs.steps)  # observing wrote nothing: the steps it read are kept here
        if self.metrics is not None:
            self.metrics.steps(s.record.blocked_s for s in obs.steps)
        self.executor.note(obs)
        return self._settle(now, obs)

    def _settle(self, now: float, obs: Observation) -> Outcome | None:
        """Perform what the policy decides on ``obs``; a fault is handled to its end (the policy
        is asked again after each step that changes the facts), at most
        :func:`decision_limit` times."""
        limit = decision_limit(len({st.info.node for st in self.books.slots.values()}))
        for _ in range(limit):
            actions = decide(now, obs, self.executor.view(obs), self.config)
            obs = dataclasses.replace(obs, requests=())  # answered once
            if not actions:
                return None
            for action in actions:
                outcome = self.executor.perform(action)
                if outcome is not None:
                    return outcome
            if self.books.fault is None or any(isinstance(a, WaitForNode) for a in actions):
                return None
        raise DecisionLoopError(
            f"the policy was asked {limit} times in one tick and the fault is still open: {self.books.fault}"
        )

    # --- what ranks get ------------------------------------------------------------------------

    def _rank_env(self, slot: str, node: int, local: int) -> dict[str, str]:
        c = self.config
        rank = RankEnv(
            store_host=self.placement.store_host,
            store_port=self.store.port,
            slot=slot,
            node=node,
            local_rank=local,
            injections=c.injections,
            heartbeat_s=c.heartbeat_s,
            liveness_port=self.liveness.port,
            run_secret=self.liveness.secret,
            log_dir=str(Path(c.log_dir).resolve()),
            tiers=c.tiers,
            elastic=c.elastic,
            **{name: getattr(c, name) for name in rank_fields()},  # the options ranks get as they are
        )
        return {**os.environ, **rank.to_environ(), "PYTHONUNBUFFERED": "1"}

    def _collect_rank_events(self, writers_gone: bool = False) -> None:
        """Copy the ranks' events (tier saves, restores, refused checkpoints) into events.jsonl.

        The store is open to anyone who reaches its port, so a record is input, not a fact: one
        that does not decode, is not a rank's event type or lacks its fields is left out with a
        ``dropped-input`` event (one warning line per channel), never a crash."""
        events = self._rank_events.pop(writers_gone)
        dropped = [("rank-event", why) for why in self._rank_events.dropped]
        self._rank_events.dropped.clear()
        dropped += [("liveness", why) for why in self.liveness.take_dropped()]
        while self.store.forged:
            dropped.append(
                ("store", f"{self.store.forged.popleft()!r} holds a value written without the run's secret")
            )
        for event in events:
            try:
                self._copy_rank_event(event)
            except (KeyError, TypeError, ValueError) as err:
                dropped.append(("rank-event", f"{event.event!r} refused: {type(err).__name__}: {err}"))
        for channel, why in dropped:
            self._dropped += 1
            if self._dropped <= MAX_DROPPED_EVENTS:
                self.events.emit("dropped-input", channel=channel, why=why[:300])
            if channel not in self._warned:  # once per channel: the events have every one
                self._warned.add(channel)
                self._say(
                    f"warning: {channel} input refused: {why[:300]} (every refusal: dropped-input events)"
                )

    def _copy_rank_event(self, event: RankEvent) -> None:
        declared = event_types.BY_NAME.get(event.event)
        if declared is None or declared.source != event_types.RANK:
            raise ValueError("not an event a rank sends")
        line = _warning(event)
        self.events.emit(event.event, **event.fields, t=event.t)  # TypeError: a field not declared
        if line is not None and line not in self._warned:
            self._warned.add(line)
            self._say(line)

    def flush_persistent(self, timeout_s: float) -> int | None:
        """Persist the newest committed state to the persistent tier now (preemption, requeue).

        Returns that step once it is complete on every rank, or None (no persistent tier, or
        see :func:`launcher.supervisor.flush.flush_persistent`). Callable from any thread.
        """
        if self.config.tiers is None or not self.config.tiers.persistent_dir or self.books.plan is None:
            return None
        return flush_persistent(
            self.store.clone(), self.books.plan.members, self.events, timeout_s, self.clock, self.sleep
        )

    def _say(self, text: str) -> None:
        self.executor.say(text)


def _warning(event: RankEvent) -> str | None:
    """The line a rank event that weakens the run's promise is also said with (once)."""
    record = event.fields
    if event.event == "inexact":
        return (
            f"warning: rank(s) {', '.join(map(str, record['ranks']))} resumed after step {record['step']} "
            f"without their own random streams and data positions of that step ({record['why']}): "
            f"this run is no longer bitwise what a fault-free run gives"
        )
    if event.event == "changed-after-commit":
        return (
            f"warning: {', '.join(record['names'])} changed after the commit block (step {record['step']}): "
            f"taken again at the next step; a fault landing in between would miss it: move it into "
            f"`with ctx.commit():`"
        )
    return None
