"""The Supervisor's loop against a placement of our own: no processes, no sleeping (time injected).

The store is a real TCPStore (the supervisor hosts it); "ranks" are entries of the fake
placement, and the test plays their part: it writes their reports into the store and makes
them die, from inside the injected sleep.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from launcher.observability.events import read_events
from launcher.observability.timeline import Timeline
from launcher.errors import SlurmError
from launcher.placement import NewNode, NodeEvidence
from launcher.supervisor import RunConfig, Supervisor, loop
from launcher.supervisor.policy import decisions
from launcher.supervisor.policy.classify import ISOLATED
from launcher.supervisor.policy.decisions import Decision
from launcher.supervisor.policy.actions import OpenFault, UseIdleNode
from launcher.supervisor.perform.books import Outcome
from launcher.supervisor.observe.view import Observation, RunState
from resilience.contract.elastic_config import ElasticConfig
from resilience.contract.messages import Report


class FakePlacement:
    """Processes are exit codes; the node evidence and extra nodes are set by the test."""

    store_host = "127.0.0.1"
    job_id: str | None = None

    def __init__(
        self, requeueable: bool = False, idle: Sequence[int] = (), growable: Sequence[int] = ()
    ) -> None:
        self.echo_slot: str | None = None
        self.requeueable = requeueable
        self.rc: dict[str, int | None] = {}
        self.spawned: list[tuple[str, int]] = []
        self.evidence_of: dict[int, NodeEvidence] = {}
        self.retired: list[tuple[int, str]] = []
        self.requeued: list[str] = []
        self._idle, self._growable = list(idle), list(growable)

    def host(self, node: int) -> str:
        return f"gpu{node}"

    def spawn(self, slot: str, node: int, command: Sequence[str], env: Mapping[str, str]) -> None:
        assert env["SRES_SLOT"] == slot and env["SRES_NODE"] == str(node)
        self.rc[slot] = None
        self.spawned.append((slot, node))

    def poll(self, slot: str) -> int | None:
        return self.rc[slot]

    def kill(self, slot: str) -> None:
        if self.rc[slot] is None:
            self.rc[slot] = -9

    def echo(self, slot: str) -> None:
        self.echo_slot = slot

    def stop_all(self, timeout_s: float = 30.0) -> None:
        for slot in self.rc:
            self.kill(slot)

    def evidence(self, node: int) -> NodeEvidence:
        return self.evidence_of.get(node, NodeEvidence())

    def retire(self, node: int, why: str) -> None:
        self.retired.append((node, why))

    def idle_node(self) -> NewNode | None:
        return NewNode(self._idle.pop(0), "idle", "idle", 0.0) if self._idle else None

    def grow(self) -> NewNode | None:
        node = self._growable.pop(0) if self._growable else None
        return None if node is None else NewNode(node, f"gpu{node}", "expansion", 0.1)

    def simulate(self, node: int) -> NewNode | None:
        return None

    def release(self, node: int, why: str) -> str | None:
        self.retired.append((node, f"released: {why}"))
        return None

    def lendable(self) -> int:
        return len(self._growable)

    def job_of(self, node: int) -> str | None:
        return None

    def requeue(self, why: str) -> None:
        self.requeued.append(why)

    def time_limits(self) -> tuple[float | None, float | None]:
        return None, None


class Script:
    """Fake time, and the ranks' side: ``at(tick, action)`` runs when that tick sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.tick = 0
        self.todo: dict[int, list[Callable[[], None]]] = {}
        self.out = io.StringIO()
        self._supervisor: Supervisor | None = None

    @property
    def supervisor(self) -> Supervisor:
        assert self._supervisor is not None, "run() makes the supervisor"
        return self._supervisor

    @supervisor.setter
    def supervisor(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def at(self, tick: int, action: Callable[[], None]) -> None:
        self.todo.setdefault(tick, []).append(action)

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.tick += 1
        for action in self.todo.pop(self.tick, []):
            action()
        assert self.tick < 2000, "the loop did not end"

    def clock(self) -> float:
        return self.now

    def finish_generation(self) -> None:
        """Every member of the newest plan reports done."""
        store = self.supervisor.store
        g = self.supervisor.books.current_plan.generation
        plan = store.plans.get(g)
        assert plan is not None, f"plan {g} is not in the store"
        for rank, slot in plan.members.items():
            store.liveness.report(g, slot, Report("done", rank))


def run(
    tmp_path: Path, placement: FakePlacement, script: Script, nodes: int = 3, spares: int = 0, **kw: Any
) -> tuple[Outcome, Timeline]:
    """``kw``: more of ``RunConfig``'s fields."""
    config = RunConfig(command=("train",), nodes=nodes, spares=spares, log_dir=tmp_path, **kw)
    supervisor = Supervisor(
        config,
        placement,
        clock=script.clock,
        wall=script.clock,
        sleep=script.sleep,
        out=script.out,
        name_check=lambda host, say: None,  # no real lookup, no thread (test_name_lookup.py's)
    )
    script.supervisor = supervisor
    outcome = supervisor.run()
    return outcome, read_events(tmp_path / "events.jsonl")


def kinds(events: Timeline) -> list[str]:
    return [e.name for e in events]


def test_a_process_fault_respawns_the_rank_on_its_node(tmp_path: Path) -> None:
    placement, script = FakePlacement(), Script()
    script.at(3, lambda: placement.rc.update({"n1p0": -9}))
    script.at(10, script.finish_generation)
    outcome, events = run(tmp_path, placement, script)
    assert outcome.ok
    assert kinds(events) == ["start", "generation", "fault", "replaced", "generation", "finished"]
    fault = events[2]
    assert (fault["kind"], fault["rank"], fault["host"]) == ("kill", 1, "gpu1")
    assert events[3]["slot"] == "n1p0r1" and events[3]["how"] == "respawn"
    assert ("n1p0r1", 1) in placement.spawned and placement.retired == []


def test_a_dead_node_moves_to_the_warm_spare_then_is_drained(tmp_path: Path) -> None:
    placement, script = FakePlacement(), Script()
    placement.evidence_of[2] = NodeEvidence(slurmd_answers=False)
    script.at(3, lambda: placement.rc.update({"n2p0": -9}))
    script.at(10, script.finish_generation)
    outcome, events = run(tmp_path, placement, script, spares=1)
    assert outcome.ok
    assert kinds(events) == [
        "start",
        "generation",
        "fault",
        "replaced",
        "generation",
        "drained",
        "node-released",
        "finished",
    ]
    assert events[2]["kind"] == "node" and events[2]["why"] == "slurmd not responding"
    assert (events[3]["slot"], events[3]["how"]) == ("n3p0", "spare")
    assert placement.retired == [(2, "slurmd not responding")]


def test_without_a_spare_the_job_grows_after_the_drain(tmp_path: Path) -> None:
    placement, script = FakePlacement(growable=[3]), Script()
    placement.evidence_of[0] = NodeEvidence(slurmd_answers=False)
    script.at(3, lambda: placement.rc.update({"n0p0": -9}))
    script.at(10, script.finish_generation)
    outcome, events = run(tmp_path, placement, script)
    assert outcome.ok
    assert kinds(events) == [
        "start",
        "generation",
        "fault",
        "drained",
        "node-released",
        "node-added",
        "replaced",
        "generation",
        "finished",
    ]
    assert events[4]["why"] == "fault" and events[5]["how"] == "expansion"
    assert events[6]["how"] == "expansion" and events[6]["slot"] == "n3p0"


def test_with_no_node_anywhere_a_batch_job_requeues(tmp_path: Path) -> None:
    placement, script = FakePlacement(requeueable=True), Script()
    placement.evidence_of[1] = NodeEvidence(slurmd_answers=False)
    script.at(3, lambda: placement.rc.update({"n1p0": -9}))
    outcome, events = run(tmp_path, placement, script)
    assert outcome.requeued and not outcome.ok
    assert kinds(events)[-3:] == ["drained", "node-released", "requeue"]
    assert placement.requeued == [
        "node gpu1 was lost and no spare node is left, nor an idle node to grow into"
    ]


def test_an_isolated_supervisor_asks_slurm_to_requeue_until_it_answers(tmp_path: Path) -> None:
    """Its own node answers it (it runs there); every other node and slurmctld are silent: no node
    is drained, and the requeue is asked for again until the link is back (here: the third try)."""
    placement, script = FakePlacement(requeueable=True), Script()
    placement.evidence_of[0] = NodeEvidence(runs_supervisor=True)
    for node in (1, 2):
        placement.evidence_of[node] = NodeEvidence(
            reachable=False, slurmd_answers=False, slurm_usable=False, slurm_answers=False
        )
    refusals = [SlurmError("Unable to contact slurm controller")] * 2
    asked = placement.requeue

    def requeue(why: str) -> None:
        if refusals:
            raise refusals.pop()
        asked(why)

    placement.requeue = requeue  # type: ignore[method-assign]
    script.at(3, lambda: placement.rc.update({"n1p0": 76, "n2p0": 76}))
    outcome, events = run(tmp_path, placement, script)
    assert outcome.requeued and kinds(events)[-1] == "requeue"
    assert "drained" not in kinds(events) and placement.retired == []
    assert placement.requeued == [ISOLATED.format(nodes=2)]
    said = script.out.getvalue()
    assert "cannot requeue yet (Unable to contact slurm controller); asking again every 5 s" in said


def test_a_hung_rank_is_killed_after_the_hang_timeout(tmp_path: Path) -> None:
    placement, script = FakePlacement(), Script()

    def store_beats() -> None:
        for n in (0, 2):
            script.supervisor.store.liveness.beat(f"n{n}p0")

    for tick in range(1, 400):  # ranks 0 and 2 beat; rank 1 beat once, then froze
        script.at(tick, store_beats)
    script.at(1, lambda: script.supervisor.store.liveness.beat("n1p0"))
    script.at(600, script.finish_generation)
    outcome, events = run(tmp_path, placement, script, hang_timeout_s=3.0)
    assert outcome.ok
    fault = next(e for e in events if e["event"] == "fault")
    assert (fault["kind"], fault["rank"]) == ("hang", 1)
    # noticed after the timeout, in fake time: a tick is 0.02 s
    assert 3.0 <= fault["t"] - 1000.0 <= 3.0 + 0.5


def test_an_exception_with_collateral_reports_names_the_raising_rank(tmp_path: Path) -> None:
    placement, script = FakePlacement(), Script()

    def reports() -> None:
        store = script.supervisor.store
        store.liveness.report(1, "n0p0", Report("error", 0, message="peer gone", collateral=True))
        store.liveness.report(1, "n2p0", Report("error", 2, message="ValueError: bad batch"))

    script.at(3, reports)
    script.at(10, script.finish_generation)
    outcome, events = run(tmp_path, placement, script)
    assert outcome.ok
    fault = next(e for e in events if e["event"] == "fault")
    assert (fault["kind"], fault["rank"], fault["message"]) == ("exception", 2, "ValueError: bad batch")
    assert [e["generation"] for e in events if e["event"] == "generation"] == [1, 2]


def test_the_same_exception_at_the_same_step_after_a_recovery_fails_the_run(tmp_path: Path) -> None:
    """A deterministic error: retried once (it might have been transient), then the run stops
    with one line saying it recurred, and its traceback once."""
    placement, script = FakePlacement(), Script()

    def raise_at(step: int) -> Callable[[], None]:
        def report() -> None:
            store, g = script.supervisor.store, script.supervisor.books.current_plan.generation
            store.liveness.report(
                g,
                "n1p0",
                Report(
                    "error",
                    1,
                    message="ValueError: bad batch",
                    error_type="ValueError",
                    step=step,
                    traceback="Traceback (most recent call last):\nValueError: bad batch\n",
                ),
            )

        return report

    script.at(3, raise_at(5))
    script.at(10, raise_at(7))  # another step: retried
    script.at(20, raise_at(5))
    outcome, events = run(tmp_path, placement, script, max_restarts=10)
    assert not outcome.ok
    assert kinds(events) == [
        "start",
        "generation",
        "fault",
        "generation",
        "fault",
        "generation",
        "fault",
        "failed",
    ]
    faults = [e for e in events if e["event"] == "fault"]
    assert [f.get("recurred", False) for f in faults] == [False, False, True]
    failed = events[-1]
    reason = (
        "rank 1 raised ValueError: bad batch at step 5 again after recovering from it: the error is "
        "deterministic; not retrying"
    )
    assert failed["reason"] == reason and failed["rank"] == 1 and failed["error_type"] == "ValueError"
    out = script.out.getvalue()
    assert [line for line in out.splitlines() if "error:" in line] == [f"sres: error: {reason}"]
    assert out.count("Traceback (most recent call last)") == 1 and "first failure (rank 1):" in out


def test_a_failed_run_names_every_rank_that_raised_not_only_the_first_to_report(tmp_path: Path) -> None:
    """Ranks that raise alike report moments apart (submitit's tasks): the failed event's errors
    (``job.exception()`` shows the lowest rank's) wait for the ranks still running to report."""
    placement, script = FakePlacement(), Script()

    def raising(rank: int) -> Callable[[], None]:
        def report() -> None:
            message = f"RuntimeError: Failed on purpose: {rank}"
            script.supervisor.store.liveness.report(
                1, f"n{rank}p0", Report("error", rank, message=message, traceback=message)
            )

        return report

    script.at(3, raising(2))
    script.at(4, raising(1))  # after the run was decided failed, while it stops
    outcome, events = run(tmp_path, placement, script, max_restarts=0)
    assert not outcome.ok
    failed = events[-1]
    assert failed["event"] == "failed" and failed["rank"] == 2
    assert sorted(failed["errors"]) == ["1", "2"] and "Failed on purpose: 1" in failed["errors"]["1"]


def test_a_policy_that_keeps_a_fault_open_stops_the_tick_with_an_internal_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop re-decides while a fault is open, but not without a bound: a bug that keeps
    the fault open ends the run with a "failed" event instead of spinning."""
    calls: list[float] = []

    def stuck(now: float, obs: Observation, state: RunState, config: RunConfig) -> Decision:
        if not state.started:
            return decisions.decide(now, obs, state, config)
        calls.append(now)
        if state.fault is not None:
            return Decision((UseIdleNode(),), "replacing")
        return Decision((OpenFault(now, {1: "kill"}),), "new fault")

    monkeypatch.setattr(loop, "decide", stuck)
    placement, script = FakePlacement(), Script()
    with pytest.raises(loop.DecisionLoopError, match="19 times in one tick"):
        run(tmp_path, placement, script)
    assert len(calls) == loop.decision_limit(3) == 19
    events = read_events(tmp_path / "events.jsonl")
    assert kinds(events) == ["start", "generation", "fault", "failed"]
    assert events[-1]["reason"].startswith("internal error of the supervisor: DecisionLoopError")


def test_a_node_lent_by_slurm_joins_once_its_process_is_warm(tmp_path: Path) -> None:
    """Growth into an idle node waits for the new process's readiness (an observation: its
    ``ready`` key), then pauses the world and publishes the larger plan."""
    placement, script = FakePlacement(growable=[3]), Script()

    def warm_up_n3p0() -> None:
        store = script.supervisor.store
        store.liveness.beat("n3p0")
        store.liveness.mark_ready("n3p0", 1000 + 160 * 0.02)

    script.at(160, warm_up_n3p0)  # Slurm is first asked for idle nodes 3 s in (tick 150)
    script.at(290, script.finish_generation)  # before n3p0's one heartbeat is 3 s old (a hang)
    elastic = ElasticConfig(max_nodes=4, grow_snooze_s=0.1, drain_grace_s=1.0)
    outcome, events = run(tmp_path, placement, script, elastic=elastic, heartbeat_s=0.2, hang_timeout_s=3.0)
    assert outcome.ok
    assert kinds(events) == ["start", "generation", "node-added", "generation", "finished"], events
    assert events[3]["generation"] == 2 and events[3]["world_size"] == 4
    added, grown = events[2]["t"], events[3]["t"]
    assert added <= 1003.1 and grown >= 1000 + 160 * 0.02  # not before the new process was warm


def test_a_standby_is_ready_by_its_own_clock_not_by_when_the_supervisor_looks(tmp_path: Path) -> None:
    """The supervisor reads readiness every half heartbeat (0.1 s by default): a forked standby
    warm in hundredths must not be reported as taking as long as the look took."""
    placement, script = FakePlacement(), Script()
    started: dict[str, float] = {}

    def first_step() -> None:
        script.supervisor.store.progress.mark_first_step(1, script.now)

    def warm_up_standbys() -> None:
        store = script.supervisor.store
        for slot, _node in placement.spawned[3:]:
            started.setdefault(slot, script.now)
            store.liveness.beat(slot)
            store.liveness.mark_ready(slot, script.now - 0.5)  # warm long before this look

    script.at(5, first_step)
    script.at(100, warm_up_standbys)
    script.at(200, script.finish_generation)
    outcome, events = run(tmp_path, placement, script, standby=1, heartbeat_s=1.0, hang_timeout_s=30.0)
    assert outcome.ok
    ready = [e for e in events if e["event"] == "standby-ready"]
    assert len(ready) == 3, events
    assert all(e["seconds"] < 100 * 0.02 - 0.4 for e in ready), ready


def test_the_loop_walks_its_tickers_in_order_after_each_tick(tmp_path: Path) -> None:
    """A background service is one more Ticker in the list: the loop gives it each tick's time,
    after the decisions and after the services before it, and knows nothing else of it."""
    placement, script = FakePlacement(), Script()
    seen: list[float] = []

    class Probe:
        def tick(self, now: float) -> None:
            seen.append(now)

    script.at(1, lambda: script.supervisor.tickers.append(Probe()))
    script.at(10, script.finish_generation)
    outcome, _ = run(tmp_path, placement, script)
    assert outcome.ok
    names = [type(t).__name__ for t in script.supervisor.tickers]
    assert names == ["RecoveryWatch", "BatchProducers", "RankEventRelay", "Probe"]
    assert len(seen) >= 8 and seen == sorted(seen)
    assert seen[1] - seen[0] == pytest.approx(loop.TICK_S)
