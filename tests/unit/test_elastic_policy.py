"""The elastic rules of the policy and their configuration, as tables. Pure."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.supervisor import RunConfig, decide
from launcher.supervisor.policy.actions import (
    AbandonResize,
    AddNodes,
    Answer,
    BeginResize,
    Drain,
    Fail,
    Pause,
    Release,
    ReportStatus,
    Requeue,
    Resize,
    WaitForNode,
)
from launcher.placement import NodeEvidence
from launcher.supervisor.policy.decisions import Decision
from launcher.supervisor.policy.classify import RECLAIMED, node_verdict
from launcher.supervisor.policy.resize import GROWTH_ORDER
from launcher.supervisor.observe.view import FaultState, Observation, Request, ResizeState, RunState
from resilience.contract.elastic_config import ElasticConfig, ElasticConfigError
from resilience.contract.messages import Report, SlotInfo

SLOTS = {f"n{n}p0": SlotInfo(n, 0) for n in range(6)}
MEMBERS = {n: f"n{n}p0" for n in range(4)}
HOSTS = {n: f"node{n}" for n in range(6)}
NOW = 100.0


def config(**elastic) -> RunConfig:
    return RunConfig(
        command=("train",), nodes=4, log_dir=Path("/nonexistent"), elastic=ElasticConfig(**elastic)
    )


def state(**kw) -> RunState:
    return RunState(**{**dict(members=MEMBERS, slots=SLOTS, hosts=HOSTS), **kw})


LOST_1 = FaultState(
    lost={1: "node"}, bad_nodes={}, drained=frozenset(), tried=frozenset({"idle-node", "new-node"})
)
DEAD_1 = frozenset({1})
GROWN = {**MEMBERS, 4: "n4p0"}
"""A run of 4 nodes grown onto a fifth, lent by Slurm (a satellite)."""
LOST_4 = FaultState(
    lost={4: "node"}, bad_nodes={}, drained=frozenset(), tried=frozenset({"idle-node", "new-node"})
)
DEAD_4 = frozenset({4})
PAUSED = {s: Report("paused", r) for r, s in MEMBERS.items()}

CASES = {
    "a node lost, no spare: shrink to 3, renumbered in order": (
        Observation(),
        state(dead_nodes=DEAD_1, fault=LOST_1),
        config(min_nodes=2),
        [Resize({0: "n0p0", 1: "n2p0", 2: "n3p0"}, "fault", 4)],
    ),
    "shrink to the largest allowed size; the healthy rest become spares": (
        Observation(),
        state(dead_nodes=DEAD_1, fault=LOST_1),
        config(min_nodes=2, resize_sizes=(2, 4)),
        [Resize({0: "n0p0", 1: "n2p0"}, "fault", 4, to_spares=(3,))],
    ),
    "below --min-nodes: wait": (
        Observation(),
        state(dead_nodes=DEAD_1, fault=LOST_1),
        config(min_nodes=4, max_nodes=5, on_no_spare="shrink"),
        [WaitForNode(NOW)],
    ),
    "the wait is over: fail with what happened": (
        Observation(),
        state(dead_nodes=DEAD_1, fault=FaultState(**{**LOST_1.__dict__, "waiting_since": 40.0})),
        config(min_nodes=4, max_nodes=5, on_no_spare="wait", resize_timeout_s=60),
        [
            Fail(
                "node node1 was lost and no spare node is left; the world may not shrink to 3 node(s) "
                "(--min-nodes 4) and no node came within --resize-timeout 60 s"
            )
        ],
    ),
    "not elastic: fail as before": (
        Observation(),
        state(dead_nodes=DEAD_1, fault=LOST_1),
        config(),
        [Fail("node node1 was lost and no spare node is left (start with --spares)")],
    ),
    "a lost lent node: the world gives back what it borrowed, no requeue (no shrink was said)": (
        Observation(),
        state(members=GROWN, dead_nodes=DEAD_4, fault=LOST_4, lent=frozenset({4}), requeueable=True),
        config(max_nodes=6),
        [Resize(MEMBERS, "fault", 5)],
    ),
    "a lost lent node under --on-no-spare requeue: as the user said": (
        Observation(),
        state(members=GROWN, dead_nodes=DEAD_4, fault=LOST_4, lent=frozenset({4}), requeueable=True),
        config(max_nodes=6, on_no_spare="requeue"),
        [
            Requeue(
                "node node4 was lost and no spare node is left, nor an idle node to grow into", cause="fault"
            )
        ],
    ),
    "a lost node of the job's own, grown past --min-nodes: a shrink within the bounds too": (
        Observation(),
        state(members=GROWN, dead_nodes=DEAD_1, fault=LOST_1, lent=frozenset({4}), requeueable=True),
        config(max_nodes=6),
        [Resize({0: "n0p0", 1: "n2p0", 2: "n3p0", 3: "n4p0"}, "fault", 5)],
    ),
    "at --min-nodes, no shrink said: a requeue as before": (
        Observation(),
        state(dead_nodes=DEAD_1, fault=LOST_1, requeueable=True),
        config(max_nodes=6),
        [
            Requeue(
                "node node1 was lost and no spare node is left, nor an idle node to grow into", cause="fault"
            )
        ],
    ),
    "a bad node is drained after the shrink": (
        Observation(),
        state(
            fault=FaultState(
                lost={1: "node"},
                bad_nodes={1: "slurmd not responding"},
                tried=frozenset({"idle-node", "new-node"}),
            )
        ),
        config(min_nodes=2),
        [Resize({0: "n0p0", 1: "n2p0", 2: "n3p0"}, "fault", 4), Drain(1, "slurmd not responding")],
    ),
    # --- requests ----------------------------------------------------------------------------------
    "status": (Observation(requests=(Request(1, "status"),)), state(), config(), [ReportStatus(1)]),
    "grow above --max-nodes: refused": (
        Observation(requests=(Request(1, "grow", by=1),)),
        state(),
        config(),
        [Answer(1, False, "refused: 5 node(s) is above --max-nodes 4")],
    ),
    "shrink to a size --resize-sizes does not allow: refused": (
        Observation(requests=(Request(1, "shrink", by=1),)),
        state(),
        config(min_nodes=2, resize_sizes=(2, 4)),
        [Answer(1, False, "refused: 3 node(s) is not an allowed size (--resize-sizes 2,4)")],
    ),
    "grow accepted": (
        Observation(requests=(Request(1, "grow", by=1),)),
        state(),
        config(max_nodes=6),
        [
            Answer(1, True, "resizing from 4 to 5 node(s) at the next step boundary"),
            BeginResize(5, "request", 1),
        ],
    ),
    "one resize at a time": (
        Observation(requests=(Request(2, "resize", nodes=6),)),
        state(resize=ResizeState(5, "request", 90.0)),
        config(max_nodes=6),
        [
            AddNodes((6,), GROWTH_ORDER),
            Answer(2, False, "a resize to 5 node(s) is under way; try again after it"),
        ],
    ),
    "grow while a lost node waits: the new node takes its ranks": (
        Observation(requests=(Request(3, "grow", by=1),)),
        state(dead_nodes=DEAD_1, fault=FaultState(**{**LOST_1.__dict__, "waiting_since": 95.0})),
        config(min_nodes=4, max_nodes=5, on_no_spare="wait"),
        [
            Answer(3, True, "starting 1 node(s) for the lost ranks"),
            AddNodes((6,), GROWTH_ORDER),
            WaitForNode(95.0),
        ],
    ),
    # --- a resize under way ------------------------------------------------------------------------
    "grow: start the node first": (
        Observation(),
        state(resize=ResizeState(5, "request", 90.0)),
        config(max_nodes=6),
        [AddNodes((6,), GROWTH_ORDER)],
    ),
    "grow: wait for the new node to warm up": (
        Observation(),
        state(resize=ResizeState(5, "request", 90.0, added=True, joining=(4,))),
        config(max_nodes=6),
        [],
    ),
    "grow: warm, pause at a step boundary": (
        Observation(),
        state(resize=ResizeState(5, "request", 90.0, added=True, joining=(4,)), warm=frozenset({"n4p0"})),
        config(max_nodes=6),
        [Pause()],
    ),
    "grow: everyone paused, the new ranks come last": (
        Observation(reports=PAUSED),
        state(
            resize=ResizeState(5, "request", 90.0, added=True, joining=(4,), pausing_since=99.0),
            warm=frozenset({"n4p0"}),
        ),
        config(max_nodes=6),
        [Resize({0: "n0p0", 1: "n1p0", 2: "n2p0", 3: "n3p0", 4: "n4p0"}, "request", 4, joined=(4,))],
    ),
    "grow: no node could be started": (
        Observation(),
        state(resize=ResizeState(5, "request", 90.0, added=True)),
        config(max_nodes=6),
        [AbandonResize("only 0 of 1 node(s) could be started")],
    ),
    "shrink: pause, then release the last node": (
        Observation(reports=PAUSED),
        state(resize=ResizeState(3, "request", 90.0, pausing_since=99.0)),
        config(min_nodes=2),
        [Resize({0: "n0p0", 1: "n1p0", 2: "n2p0"}, "request", 4, release=(3,))],
    ),
    "shrink: ranks slower than --drain-grace are released anyway": (
        Observation(),
        state(resize=ResizeState(3, "request", 50.0, pausing_since=60.0)),
        config(min_nodes=2, drain_grace_s=30),
        [Resize({0: "n0p0", 1: "n1p0", 2: "n2p0"}, "request", 4, release=(3,))],
    ),
    # --- capacity from the scheduler: lent nodes (satellites) ------------------------------------
    "idle nodes: grow into them after the snooze, up to --max-nodes": (
        Observation(lendable=5),
        state(changed_at=NOW - 31),
        config(min_nodes=2, max_nodes=6),
        [BeginResize(6, "idle")],
    ),
    "idle nodes within the snooze: not yet": (
        Observation(lendable=5),
        state(changed_at=NOW - 29),
        config(min_nodes=2, max_nodes=6),
        [],
    ),
    "idle nodes: not above the size a user asked for": (
        Observation(lendable=5),
        state(changed_at=0.0, asked_nodes=5),
        config(max_nodes=6),
        [BeginResize(5, "idle")],
    ),
    "growing into idle nodes: as many as Slurm lent": (
        Observation(reports=PAUSED),
        state(
            resize=ResizeState(6, "idle", 90.0, added=True, joining=(4,), pausing_since=99.0),
            warm=frozenset({"n4p0"}),
        ),
        config(max_nodes=6),
        [Resize({0: "n0p0", 1: "n1p0", 2: "n2p0", 3: "n3p0", 4: "n4p0"}, "idle", 4, joined=(4,))],
    ),
    "a lent node taken back: it leaves at the next step boundary": (
        Observation(reclaimed=(2, 5)),
        state(lent=frozenset({2})),
        config(min_nodes=2),
        [BeginResize(3, "preempted", release=(2,))],
    ),
    "another lent node taken back during that shrink: it goes too": (
        Observation(reclaimed=(2, 3)),
        state(resize=ResizeState(3, "preempted", 90.0, release=(2,))),
        config(min_nodes=2),
        [BeginResize(2, "preempted", release=(2, 3))],
    ),
    "a lent node taken back while growing: the growth gives way": (
        Observation(reclaimed=(2,)),
        state(resize=ResizeState(6, "idle", 90.0)),
        config(max_nodes=6),
        [AbandonResize("Slurm is taking lent nodes back")],
    ),
    "a lent node taken back below --min-nodes: its end is a fault like any other": (
        Observation(reclaimed=(2,)),
        state(),
        config(min_nodes=4),
        [],
    ),
    "a shrink on request lets lent nodes go first, never node 0": (
        Observation(reports=PAUSED),
        state(resize=ResizeState(2, "request", 90.0, pausing_since=99.0), lent=frozenset({1})),
        config(min_nodes=2),
        [Resize({0: "n0p0", 1: "n2p0"}, "request", 4, release=(1, 3))],
    ),
    "a lent node lost after Slurm took it back is given back, not drained": (
        Observation(),
        state(
            dead_nodes=DEAD_1,
            fault=FaultState(
                lost={1: "node"}, bad_nodes={1: RECLAIMED}, tried=frozenset({"idle-node", "new-node"})
            ),
        ),
        config(min_nodes=2),
        [Resize({0: "n0p0", 1: "n2p0", 2: "n3p0"}, "fault", 4), Release(1, "preempted")],
    ),
}


def test_a_reclaimed_node_is_no_fault_of_the_node():
    assert node_verdict(NodeEvidence(reclaimed=True), 0, 2) == RECLAIMED
    assert node_verdict(NodeEvidence(reclaimed=True, slurmd_answers=False), 0, 2) == RECLAIMED


@pytest.mark.parametrize("name", CASES)
def test_elastic_policy(name):
    obs, st, cfg, expected = CASES[name]
    decision = decide(NOW, obs, st, cfg)
    assert decision.actions == tuple(expected)
    assert decision.waits == any(isinstance(a, WaitForNode) for a in expected)  # the loop asks no more


@pytest.mark.parametrize(
    "elastic, nodes, message",
    [
        (dict(min_nodes=3, max_nodes=2), 2, "max_nodes 2 is below min_nodes 3"),
        (dict(min_nodes=5), 4, "outside min_nodes 5 .. max_nodes 5"),
        (dict(resize_step=2, resize_sizes=(2, 4)), 4, "exclude each other"),
        (dict(resize_sizes=(2, 8), max_nodes=8), 4, "not one of resize_sizes 2,8"),
        (dict(on_no_spare="pray"), 4, "on_no_spare 'pray'"),
        (dict(drain_grace_s=-1.0), 4, "drain_grace_s must be a number of seconds >= 0"),
    ],
)
def test_conflicting_settings_are_one_line(elastic, nodes, message):
    with pytest.raises((ConfigError, ElasticConfigError), match=message):
        RunConfig(command=("t",), nodes=nodes, elastic=ElasticConfig(**elastic))


def test_defaults_are_not_elastic_and_shrink_when_allowed():
    assert not config().elastic.elastic and config().elastic.on_no_spare is None
    assert config(min_nodes=2).elastic.on_no_spare == "shrink"
    assert ElasticConfig.from_mapping({"resize_sizes": "2,4", "min_nodes": "2"}).resize_sizes == (2, 4)
    with pytest.raises(ElasticConfigError, match="unknown key 'max_node'"):
        ElasticConfig.from_mapping({"max_node": 3})


def test_a_resize_a_fault_already_made_is_dropped():
    st = state(members={0: "n0p0", 1: "n2p0", 2: "n3p0"}, resize=ResizeState(3, "request", 90.0))
    decision = decide(NOW, Observation(), st, config(min_nodes=2))
    assert decision == Decision((AbandonResize("the world already has 3 node(s)"),), "running")
