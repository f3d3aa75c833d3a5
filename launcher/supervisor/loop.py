"""The per-job supervisor: hosts the store, spawns ranks and spares, and runs the loop
observe -> decide -> perform, then walks its tickers.

It is never a rank, so losing rank 0 loses neither the store nor the decisions. A fault is
seen from the supervisor's own watch (a process exit, at once; a silent heartbeat, after the
hang timeout; a rank's report), never from a collective timeout. What to do about it is
decided by :func:`~launcher.supervisor.policy.decisions.decide` (pure) and carried out by the
:class:`~launcher.supervisor.perform.executor.Executor`. While a fault is open the tick decides
again, at most ``decision_limit()`` times (``MAX_DECISIONS_PER_TICK`` plus one per node, else
``DecisionLoopError``), so that one fault is settled in one tick when the world allows. The
background services (recovery times, batch producers, fork servers, the ranks' events, live
metrics) come after, each a :class:`~launcher.supervisor.tickers.Ticker`: the loop knows their
order, not what each one reads.
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
from launcher.observability import metrics
from launcher.run import rank_threads, signal_latch
from launcher.run.options import rank_fields
from launcher.observability.events import INTERRUPTED, EventLog
from launcher.placement import ForkHosts, NodeLinks, Placement, RankProcesses
from launcher.placement.forks import ForkingProcesses
from launcher.placement.local import LocalPlacement
from launcher.supervisor.perform.books import Books, Outcome
from launcher.supervisor.config import RunConfig
from launcher.supervisor.control import ControlServer
from launcher.supervisor import name_lookup
from launcher.supervisor.perform.executor import Executor
from launcher.supervisor.perform.persist_now import flush_persistent
from launcher.supervisor.perform.hands import Clocks, Hands
from launcher.supervisor.observe.observer import Observer, SlotState
from launcher.supervisor.policy.decisions import decide
from launcher.supervisor.perform.producers import BatchProducers
from launcher.supervisor.observe.recovery_watch import RecoveryWatch
from launcher.supervisor.observe.step_reports import StepLog
from launcher.supervisor.observe.view import Observation
from launcher.supervisor.relay import RankEventRelay
from launcher.supervisor.tickers import ForkServers, LiveMetrics, Ticker
from resilience import tiers
from resilience.contract.messages import Plan
from resilience.contract.run_dir import RunDir
from resilience.contract.run_store import RunStore
from resilience.contract import lease, run_secret
from resilience.contract.liveness import LivenessServer
from resilience.contract.rank_env import FORK_SAFE_DEFAULTS, RankEnv

TICK_S = 0.02
MAX_DECISIONS_PER_TICK = 16
"""How many times one tick may ask the policy, plus one per node of the run. An open fault is
re-decided after each step that changes the facts: each source of
:data:`~launcher.supervisor.policy.replace.REPLACEMENT_ORDER` is tried once, and a source that
serves adds a node (at most one per node lost) or ends the fault. More decisions are a bug of ours."""


class DecisionLoopError(RuntimeError):
    """The policy was asked more often in one tick than :func:`decision_limit` allows: its
    actions kept a fault open without ending it (a bug of the supervisor's, never the user's)."""


def decision_limit(nodes: int) -> int:
    """The most decisions one tick may take in a run of ``nodes`` nodes (spares included)."""
    return MAX_DECISIONS_PER_TICK + nodes


def _run_store(liveness: LivenessServer, address: str) -> tuple[str, RunStore]:
    """This incarnation's store, its values signed under a key of its own: a value copied from
    an earlier run of the same log dir (same secret) is refused (``run_secret.store_key``); it
    listens only where ranks reach it (as the liveness server does). Its plans, pauses and the
    run's end are announced to the ranks over their liveness connections as they are written."""
    nonce = run_secret.new_challenge()
    store = RunStore.host(run_secret.store_key(liveness.secret, nonce), address=address)
    store.plans.announce = liveness.announce
    return nonce, store


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
        name_check: Callable[[str, Callable[[str], None]], object] = name_lookup.watch,
    ) -> None:
        self.config = config
        self.name_check = name_check  # the start's look at the nameserver (tests: a fake)
        self.placement: Placement = placement or LocalPlacement(config.log_dir)
        self.liveness = liveness or LivenessServer(
            run_secret.kept_in(config.log_dir), host=self.placement.store_host
        )
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.events = EventLog(RunDir(Path(config.log_dir)).events, wall)
        self.store_nonce, self.store = _run_store(self.liveness, self.placement.store_host)
        self.recovery = RecoveryWatch(
            self.store,
            self.events,
            lambda: list(self.books.slots),
            lambda: self.books.current_plan.generation,
            self._say,
        )
        self.control, self.books = ControlServer(Path(config.log_dir)), Books.for_run(config)
        self._member_nodes_of: tuple[Plan | None, frozenset[int]] = (None, frozenset())
        self.processes = self._processes()
        self.executor = Executor(self._hands(out or sys.stderr))  # stderr as it is now, not at import
        p = self.placement  # each part takes the capabilities it uses
        self.observer = self._observer()
        self.step_log = StepLog(Path(config.log_dir))
        self.producers = BatchProducers(
            self.store, p, p, config.command, self._rank_env, self.events, self._member_nodes
        )
        self.relay = RankEventRelay(self.store, self.liveness, self.events, self._say, config.beat_s / 2)
        self.metrics = metrics.start(
            config.metrics_port, config.metrics_addr, config.metrics_textfile, self.events
        )
        self.tickers = self._tickers()

    def _observer(self) -> Observer:
        """What reads the world: the placement's capabilities, the store, the ranks' connections."""
        p = self.placement
        return Observer(
            self.config,
            self.store,
            self.books.slots,
            self.wall,
            processes=self.processes,
            inspector=p,
            supply=p,
            job=p,
            requests=self.control.take,
            link=self.liveness,
            killed=self.books.killed,
        )

    def _tickers(self) -> list[Ticker]:
        """The background services, walked in this order after each tick's decisions."""
        tickers: list[Ticker] = [self.recovery, self.producers]
        if isinstance(self.processes, ForkingProcesses):
            tickers.append(ForkServers(self.processes, self._machine_nodes))
        tickers.append(self.relay)
        if self.metrics is not None:
            tickers.append(
                LiveMetrics(self.metrics, self._progress, lambda: self.observer.step_reports.scores)
            )
        return tickers

    def _member_nodes(self) -> frozenset[int]:
        """The nodes holding ranks of the current plan, found again only for a new plan (asked
        five times a second: at 4,096 ranks, 2% of a core)."""
        plan, nodes = self._member_nodes_of
        if plan is not self.books.current_plan:
            plan = self.books.current_plan
            nodes = frozenset(self.books.slots[s].info.node for s in plan.members.values())
            self._member_nodes_of = (plan, nodes)
        return nodes

    def _machine_nodes(self) -> frozenset[int]:
        """The nodes whose machine needs a fork server: members, spares, nodes joining a resize."""
        joining = self.books.resize.joining if self.books.resize is not None else ()
        return self._member_nodes() | {*self.books.spare_nodes, *joining}

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
            ram_root=lambda: tiers.ram_root(self.liveness.secret),
            links=p if isinstance(p, NodeLinks) else None,
            copy_events=lambda: self.relay.copy(),
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
        self.name_check(self.placement.store_host, self._say)  # a slow nameserver, said once
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
            self.relay.copy(writers_gone=True)
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
            now = self.clock()
            for ticker in self.tickers:
                ticker.tick(now)
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
        return len(self.books.killed)

    def _observe_and_settle(self) -> Outcome | None:
        now = self.clock()
        b, plan = self.books, self.books.current_plan
        obs = self.observer.observe(
            now, plan.generation, plan.members, self.executor.spare_slots(), b.dead_nodes
        )
        if obs.lost or obs.spares_exited:
            obs = self.observer.with_evidence(
                obs,
                lambda r: b.slots[plan.members[r]].info.node,
                b.dead_nodes,
                lambda: {s.info.node for s in b.slots.values() if s.alive},
            )
        self.step_log.append(obs.steps)  # observing wrote nothing: the steps it read are kept here
        if self.metrics is not None:
            self.metrics.steps(s.record.blocked_s / s.record.steps for s in obs.steps)  # per commit
        self.executor.note(obs)
        return self._settle(now, obs)

    def _settle(self, now: float, obs: Observation) -> Outcome | None:
        """Perform what the policy decides on ``obs``; a fault is handled to its end (the policy
        is asked again after each step that changes the facts), at most
        :func:`decision_limit` times."""
        asked, limit = 0, 0
        while True:
            decision = decide(now, obs, self.executor.view(obs), self.config)
            obs = dataclasses.replace(obs, requests=())  # answered once
            if not decision.actions:
                return None
            for action in decision.actions:
                outcome = self.executor.perform(action)
                if outcome is not None:
                    return outcome
            if self.books.fault is None or decision.waits:
                return None
            asked += 1  # the limit counts the nodes (O(N)): only once a fault asks again
            limit = limit or decision_limit(len({info.node for info in self.books.infos().values()}))
            if asked >= limit:
                raise DecisionLoopError(
                    f"the policy was asked {limit} times in one tick and the fault is still open: "
                    f"{self.books.fault}"
                )

    # --- what ranks get ------------------------------------------------------------------------

    def _rank_env(self, slot: str, node: int, local: int) -> dict[str, str]:
        c = self.config
        rank = RankEnv(
            store_host=self.placement.store_host,
            store_port=self.store.port,
            store_nonce=self.store_nonce,
            slot=slot,
            node=node,
            local_rank=local,
            injections=c.injections,
            heartbeat_s=c.beat_s,
            lease_s=lease.lease_s(c.hang_timeout_s),
            liveness_port=self.liveness.port,
            run_secret=self.liveness.secret,
            log_dir=str(Path(c.log_dir).resolve()),
            tiers=c.tiers,
            elastic=c.elastic,
            **{name: getattr(c, name) for name in rank_fields()},  # the options ranks get as they are
        )
        threads = {rank_threads.VARIABLE: str(c.rank_threads)} if c.rank_threads else {}
        return {**FORK_SAFE_DEFAULTS, **os.environ, **threads, **rank.to_environ(), "PYTHONUNBUFFERED": "1"}

    def flush_persistent(self, timeout_s: float) -> int | None:
        """Persist the newest committed state to the persistent tier now (preemption, requeue).

        Returns that step once it is complete on every rank, or None (no persistent tier, or
        see :func:`launcher.supervisor.perform.persist_now.flush_persistent`). Callable from any thread.
        """
        if self.config.tiers is None or not self.config.tiers.persistent_dir or self.books.plan is None:
            return None
        plan = self.books.plan
        return flush_persistent(
            self.store.clone(), plan.members, self.events, timeout_s, self.clock, self.sleep, plan.generation
        )

    def _say(self, text: str) -> None:
        self.executor.say(text)
