"""The policy's input is pure: the view is built from the books and one observation, and the
run's start (plan 1) is the policy's first action. No processes, no store."""

from __future__ import annotations

import copy
from pathlib import Path

from launcher.supervisor import RunConfig, decide
from launcher.supervisor.policy.actions import Launch
from launcher.supervisor.perform.books import Books, run_state
from launcher.supervisor.observe.observer import SlotState
from launcher.supervisor.observe.view import FaultState, Observation, RunState
from resilience.contract.messages import Plan, SlotInfo

CONFIG = RunConfig(command=("train",), nodes=2, spares=1, log_dir=Path("/nonexistent"), standby=1)
HOSTS = {0: "gpu0", 1: "gpu1", 2: "gpu2"}


def books() -> Books:
    """Plan 3 over nodes 0 and 1 (one rank each), node 2 a spare; standbys n0s1 (alive) and n1s2 (dead)."""
    slots = {
        "n0p0": SlotState(SlotInfo(0, 0), 1.0),
        "n1p0": SlotState(SlotInfo(1, 0), 1.0),
        "n2p0": SlotState(SlotInfo(2, 0), 1.0),
        "n0s1": SlotState(SlotInfo(0, 0), 2.0),
        "n1s2": SlotState(SlotInfo(1, 0), 2.0, alive=False),
    }
    plan = Plan(
        generation=3,
        world_size=2,
        members={0: "n0p0", 1: "n1p0"},
        slots={"n0p0": SlotInfo(0, 0), "n1p0": SlotInfo(1, 0)},
        procs_per_node=1,
    )
    return Books(
        slots=slots,
        plan=plan,
        spare_nodes=[2],
        dead_nodes={5},
        process_faults={1: 1},
        origin={2: "satellite"},
        restarts=2,
        respawns=1,
        standby={"n0s1", "n1s2"},
        changed_at=7.0,
        fault=FaultState({1: "kill"}, {}),
        asked_nodes=3,
    )


def test_the_view_copies_the_books_and_takes_readiness_and_first_steps_from_the_observation():
    b = books()
    obs = Observation(warm=frozenset({"n0s1", "n2p0"}), generation=3, first_step_t=12.5)
    view = run_state(b, obs, CONFIG, HOSTS, requeueable=True)
    assert view.members == {0: "n0p0", 1: "n1p0"} and view.slots["n0s1"] == SlotInfo(0, 0)
    assert (view.spare_nodes, view.dead_nodes, view.process_faults) == ((2,), frozenset({5}), {1: 1})
    assert (view.restarts, view.respawns, view.requeueable, view.changed_at) == (2, 1, True, 7.0)
    assert view.fault == FaultState({1: "kill"}, {}) and view.asked_nodes == 3 and view.hosts == HOSTS
    assert view.warm == frozenset({"n0s1", "n2p0"})
    assert view.standby == {0: ("n0s1",)}  # a dead standby is not one
    assert view.lent == frozenset({2}) and view.settled and view.started


def test_the_view_changes_nothing_and_is_the_same_however_often_it_is_built():
    b = books()
    before = copy.deepcopy(b)
    obs = Observation(warm=frozenset({"n0s1"}), generation=3, first_step_t=12.5)
    first = run_state(b, obs, CONFIG, HOSTS, requeueable=False)
    assert run_state(b, obs, CONFIG, HOSTS, requeueable=False) == first
    assert b == before


def test_a_generation_is_settled_only_once_its_own_first_step_was_seen():
    b = books()
    assert not run_state(b, Observation(generation=3), CONFIG, HOSTS, False).settled
    assert not run_state(b, Observation(generation=2, first_step_t=1.0), CONFIG, HOSTS, False).settled
    no_standby = RunConfig(**{**CONFIG.__dict__, "standby": 0})
    assert not run_state(b, Observation(generation=3, first_step_t=1.0), no_standby, HOSTS, False).settled


def test_before_plan_1_the_view_says_not_started_and_the_policy_starts_the_run():
    view = run_state(Books.for_run(CONFIG), Observation(), CONFIG, {}, requeueable=False)
    assert not view.started and view.members == {} and not view.settled
    config = RunConfig(command=("train",), nodes=2, procs_per_node=2, spares=1, log_dir=Path("/nonexistent"))
    decision = decide(0.0, Observation(), RunState(members={}, slots={}, hosts={}, started=False), config)
    assert decision.why == "start"
    assert list(decision.actions) == [
        Launch(
            spawn=(
                ("n0p0", 0, 0),
                ("n0p1", 0, 1),
                ("n1p0", 1, 0),
                ("n1p1", 1, 1),
                ("n2p0", 2, 0),
                ("n2p1", 2, 1),
            ),
            members={0: "n0p0", 1: "n0p1", 2: "n1p0", 3: "n1p1"},
        )
    ]
