"""The supervisor's policy as a table: observation + state -> actions. Pure: no processes, no clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.observability.straggler import Straggler, StragglerConfig
from launcher.placement import NodeEvidence
from launcher.supervisor import RunConfig, decide
from launcher.supervisor.policy.actions import (
    AcquireNode,
    Drain,
    DropSpare,
    Fail,
    Finish,
    HoldForCulprit,
    KillNode,
    KillSlot,
    NoteStraggler,
    OpenFault,
    Publish,
    RefillSpare,
    Requeue,
    StartStandby,
    UseIdleNode,
)
from launcher.supervisor.policy.classify import ISOLATED, ISOLATED_REQUEUE_WAIT_S, UNREACHABLE, error_at
from launcher.supervisor.policy.decisions import Decision
from launcher.supervisor.policy.replace import REPLACEMENT_ORDER, serving_source
from launcher.supervisor.observe.view import ErrorAt, FaultState, Observation, RunState
from resilience.contract.messages import STUCK_EXIT, Report, SlotInfo

# Three nodes of one rank each hold ranks 0..2; node 3 is a warm spare.
SLOTS = {f"n{n}p0": SlotInfo(n, 0) for n in range(4)}
MEMBERS = {n: f"n{n}p0" for n in range(3)}
HOSTS = {n: f"gpu{n}" for n in range(4)}
CONFIG = RunConfig(
    command=("train",),
    nodes=3,
    spares=1,
    log_dir=Path("/nonexistent"),
    max_restarts=5,
    max_requeues=3,
    node_fault_after=2,
)
NOW = 100.0
DEAD = NodeEvidence(slurmd_answers=False)
CUT = NodeEvidence(reachable=False)
CUT_NO_SLURM = NodeEvidence(reachable=False, slurmd_answers=False, slurm_usable=False, slurm_answers=False)


def state(**kw) -> RunState:
    base = dict(members=MEMBERS, slots=SLOTS, hosts=HOSTS, spare_nodes=(3,))
    return RunState(**{**base, **kw})


def report(kind="error", rank=1, seq=1, collateral=False, message="boom") -> Report:
    return Report(kind, rank, seq=seq, message=message, collateral=collateral)


def fault(lost, bad=None, **kw) -> FaultState:
    return FaultState(lost=lost, bad_nodes=bad or {}, **kw)


def raised(rank, **kw) -> Report:
    """A rank's own ValueError at step 5 (``kw`` changes it)."""
    return Report(
        **{
            **dict(
                kind="error",
                rank=rank,
                seq=1,
                message="ValueError: bad batch",
                error_type="ValueError",
                step=5,
            ),
            **kw,
        }
    )


SEEN_AT_5 = frozenset({ErrorAt("ValueError", "ValueError: bad batch", 5)})


CASES = {
    # --- no fault ------------------------------------------------------------------------------
    "quiet": (Observation(), state(), CONFIG, []),
    "every rank done": (
        Observation(reports={s: report("done", r) for r, s in MEMBERS.items()}),
        state(),
        CONFIG,
        [Finish(tuple((rank, "") for rank in sorted(MEMBERS)))],
    ),
    "a hung rank is killed as hung": (
        Observation(hung=("n1p0",)),
        state(),
        CONFIG,
        [KillSlot("n1p0", "hang")],
    ),
    "an injected node kill": (
        Observation(node_kills=(2,)),
        state(),
        CONFIG,
        [KillNode(2), Drain(2, "node lost (injected fault)")],
    ),
    "a spare's process died": (
        Observation(spares_exited=((3, "n3p0"),)),
        state(),
        CONFIG,
        [DropSpare(3, "n3p0"), Drain(3, "a warm spare process of this node died")],
    ),
    "an injected kill of a supervisor's child: a spare's process": (
        Observation(child_kill=True),
        state(),
        CONFIG,
        [KillSlot("n3p0", "injected")],
    ),
    "preemption requeues, saving first": (
        Observation(preempted="preempted (SIGUSR2)"),
        state(),
        CONFIG,
        [Requeue("preempted (SIGUSR2)", save=True, cause="preemption")],
    ),
    "preemption past --max-requeues fails": (
        Observation(preempted="preempted"),
        state(),
        RunConfig(**{**CONFIG.__dict__, "restart_count": 3}),
        [Fail("preempted; the job was already requeued 3 time(s) (--max-requeues 3)")],
    ),
    "the signal 90 s before a 1 h limit is the time limit's": (
        Observation(preempted="preempted", time_left_s=90.0, time_limit_s=3600.0),
        state(),
        CONFIG,
        [Requeue("time limit in 90 s", save=True, cause="time-limit")],
    ),
    "the signal 3 h before a 10 h limit is a preemption": (
        Observation(preempted="preempted", time_left_s=10800.0, time_limit_s=36000.0),
        state(),
        CONFIG,
        [Requeue("preempted", save=True, cause="preemption")],
    ),
    "time limit past --max-timeout-requeues fails": (
        Observation(preempted="preempted", time_left_s=40.0, time_limit_s=60.0),
        state(),
        RunConfig(
            **{**CONFIG.__dict__, "restart_count": 1, "timeout_requeues": 1, "max_timeout_requeues": 1}
        ),
        [
            Fail(
                "time limit in 40 s; timed-out too many times: the job was already requeued 1 time(s) at its "
                "time limit "
                "(--max-timeout-requeues 1)"
            )
        ],
    ),
    "time-limit requeues do not count against --max-requeues when capped apart": (
        Observation(preempted="preempted"),
        state(),
        RunConfig(
            **{**CONFIG.__dict__, "restart_count": 5, "timeout_requeues": 3, "max_timeout_requeues": 4}
        ),
        [Requeue("preempted", save=True, cause="preemption")],
    ),
    "no cap of ours on preemptions": (
        Observation(preempted="preempted"),
        state(),
        RunConfig(**{**CONFIG.__dict__, "restart_count": 50, "max_requeues": None}),
        [Requeue("preempted", save=True, cause="preemption")],
    ),
    "a straggler is reported": (
        Observation(stragglers=(Straggler(2, 3.0, 30),)),
        state(),
        CONFIG,
        [NoteStraggler(2, 2, 3.0, 30)],
    ),
    "a straggler's node is replaced by the spare when asked": (
        Observation(stragglers=(Straggler(2, 3.0, 30),)),
        state(),
        RunConfig(**{**CONFIG.__dict__, "straggler": StragglerConfig(action="replace")}),
        [
            NoteStraggler(2, 2, 3.0, 30, replaced=True),
            KillNode(2, "straggler: 3.00"),
            Drain(2, "straggler: 3.00"),
        ],
    ),
    "no spare: the straggler stays": (
        Observation(stragglers=(Straggler(2, 3.0, 30),)),
        state(spare_nodes=()),
        RunConfig(**{**CONFIG.__dict__, "straggler": StragglerConfig(action="replace")}),
        [NoteStraggler(2, 2, 3.0, 30)],
    ),
    "state lost everywhere": (
        Observation(reports={"n0p0": report("unrecoverable", 0, message="no step")}),
        state(),
        CONFIG,
        [Fail("the state could not be recovered from peers: no step")],
    ),
    # --- collateral errors wait for their culprit ------------------------------------------------
    "collateral only: hold": (
        Observation(reports={"n0p0": report(rank=0, collateral=True)}),
        state(),
        CONFIG,
        [HoldForCulprit(NOW)],
    ),
    "collateral only, still in grace": (
        Observation(reports={"n0p0": report(rank=0, collateral=True)}),
        state(collateral_since=NOW - 0.5),
        CONFIG,
        [HoldForCulprit(NOW - 0.5)],
    ),
    "collateral only, grace over: a fault": (
        Observation(reports={"n0p0": report(rank=0, collateral=True)}),
        state(collateral_since=NOW - 2),
        CONFIG,
        [OpenFault(0.0, {}, {}, report(rank=0, collateral=True), {})],
    ),
    "own error before collateral: the own one is the culprit": (
        Observation(reports={"n0p0": report(rank=0, seq=1, collateral=True), "n2p0": report(rank=2, seq=2)}),
        state(),
        CONFIG,
        [OpenFault(0.0, {}, {}, report(rank=2, seq=2), {})],
    ),
    # --- classifying lost ranks -------------------------------------------------------------------
    "process fault on a healthy node": (
        Observation(lost={1: "kill"}, evidence={1: NodeEvidence()}),
        state(),
        CONFIG,
        [OpenFault(0.0, {1: "kill"}, {}, None, {1: 1})],
    ),
    "a rank that ended itself, stuck in an ended generation: its node is not blamed": (
        Observation(lost={1: "exit 75"}, evidence={1: NodeEvidence()}),
        state(process_faults={1: 1}),
        CONFIG,
        [OpenFault(0.0, {1: "exit 75"}, {}, None, {1: 1}, counted=False)],
    ),
    "second process fault on a node: the node goes": (
        Observation(lost={1: "exit 3"}, evidence={1: NodeEvidence()}),
        state(process_faults={1: 1}),
        CONFIG,
        [
            OpenFault(0.0, {1: "node"}, {1: "repeated failure: 2 process faults on this node"}, None, {1: 2}),
            KillNode(1, "repeated failure: 2 process faults on this node"),
        ],
    ),
    "slurmd does not answer: the node goes": (
        Observation(lost={1: "kill"}, evidence={1: DEAD}),
        state(),
        CONFIG,
        [
            OpenFault(0.0, {1: "node"}, {1: "slurmd not responding"}, None, {1: 1}),
            KillNode(1, "slurmd not responding"),
        ],
    ),
    "every rank lost at once: no node is blamed": (
        Observation(lost={0: "kill", 1: "kill", 2: "kill"}, evidence={n: NodeEvidence() for n in range(3)}),
        state(process_faults={0: 1, 1: 1, 2: 1}),
        CONFIG,
        [OpenFault(0.0, {0: "kill", 1: "kill", 2: "kill"}, {}, None, {0: 1, 1: 1, 2: 1})],
    ),
    "...but a dead slurmd still is": (
        Observation(
            lost={0: "kill", 1: "kill", 2: "kill"}, evidence={0: NodeEvidence(), 1: DEAD, 2: NodeEvidence()}
        ),
        state(),
        CONFIG,
        [
            OpenFault(0.0, {0: "kill", 1: "node", 2: "kill"}, {1: "slurmd not responding"}, None, {}),
            KillNode(1, "slurmd not responding"),
        ],
    ),
    "short of spares: look for a node that came back": (
        Observation(),
        state(spare_nodes=()),
        CONFIG,
        [RefillSpare()],
    ),
    "...at most every few seconds": (Observation(), state(spare_nodes=(), next_refill=NOW + 1), CONFIG, []),
    "a node already dead (injected) is not judged again": (
        Observation(lost={1: "node"}),
        state(dead_nodes=frozenset({1})),
        CONFIG,
        [OpenFault(0.0, {1: "node"}, {}, None, {})],
    ),
    "too many restarts": (
        Observation(lost={1: "kill"}, evidence={1: NodeEvidence()}),
        state(restarts=5),
        CONFIG,
        [OpenFault(0.0, {1: "kill"}, {}, None, {1: 1}), Fail("gave up after 5 restart(s)")],
    ),
    "a rank that ended itself stuck in an ended generation takes no restart": (
        Observation(lost={2: f"exit {STUCK_EXIT}"}, evidence={2: NodeEvidence()}),
        state(restarts=5),
        CONFIG,
        [OpenFault(0.0, {2: f"exit {STUCK_EXIT}"}, {}, None, {}, counted=False)],
    ),
    # --- a deterministic error: the same own exception at the same step again ----------------------
    "an error seen before at the same step: fail at once, naming it": (
        Observation(reports={"n1p0": raised(1)}),
        state(errors_seen=SEEN_AT_5),
        CONFIG,
        [
            OpenFault(0.0, {}, {}, raised(1), {}, recurred=True),
            Fail(
                "rank 1 raised ValueError: bad batch at step 5 again after recovering from it: the error is "
                "deterministic; not retrying",
                raised(1),
                (raised(1),),
            ),
        ],
    ),
    "...whichever rank raises it this time": (
        Observation(reports={"n2p0": raised(2)}),
        state(errors_seen=SEEN_AT_5),
        CONFIG,
        [
            OpenFault(0.0, {}, {}, raised(2), {}, recurred=True),
            Fail(
                "rank 2 raised ValueError: bad batch at step 5 again after recovering from it: the error is "
                "deterministic; not retrying",
                raised(2),
                (raised(2),),
            ),
        ],
    ),
    "...the culprit the first in time, every rank's own error kept, lowest rank first": (
        Observation(
            reports={
                "n2p0": raised(2, seq=1),
                "n0p0": raised(0, seq=3, collateral=True, origin="peer"),
                "n1p0": raised(1, seq=2),
            }
        ),
        state(errors_seen=SEEN_AT_5),
        CONFIG,
        [
            OpenFault(0.0, {}, {}, raised(2, seq=1), {}, recurred=True),
            Fail(
                "rank 2 raised ValueError: bad batch at step 5 again after recovering from it: the error is "
                "deterministic; not retrying",
                raised(2, seq=1),
                (raised(1, seq=2), raised(2, seq=1)),
            ),
        ],
    ),
    "the same error at another step: retried": (
        Observation(reports={"n1p0": raised(1, step=6)}),
        state(errors_seen=SEEN_AT_5),
        CONFIG,
        [OpenFault(0.0, {}, {}, raised(1, step=6), {})],
    ),
    "another error at the same step: retried": (
        Observation(reports={"n1p0": raised(1, message="KeyError: 'x'", error_type="KeyError")}),
        state(errors_seen=SEEN_AT_5),
        CONFIG,
        [OpenFault(0.0, {}, {}, raised(1, message="KeyError: 'x'", error_type="KeyError"), {})],
    ),
    "an error raised outside ctx.steps() (no step): retried": (
        Observation(reports={"n1p0": raised(1, step=None)}),
        state(errors_seen=SEEN_AT_5),
        CONFIG,
        [OpenFault(0.0, {}, {}, raised(1, step=None), {})],
    ),
    "a survivor's collateral error is never a recurrence": (
        Observation(reports={"n0p0": raised(0, collateral=True, origin="peer")}),
        state(collateral_since=NOW - 2, errors_seen=SEEN_AT_5),
        CONFIG,
        [OpenFault(0.0, {}, {}, raised(0, collateral=True, origin="peer"), {})],
    ),
    # --- replacing what a fault lost, in REPLACEMENT_ORDER -------------------------------------
    "process fault: respawn on its own node": (
        Observation(),
        state(fault=fault({1: "kill"}), respawns=4),
        CONFIG,
        [Publish({0: "n0p0", 1: "n1p0r5", 2: "n2p0"}, {1: "respawn"}, "fault", (("n1p0r5", 1, 0),), ())],
    ),
    "process fault with a warm standby on its node: the standby takes the rank and its local rank": (
        Observation(),
        state(
            fault=fault({1: "kill"}),
            respawns=4,
            slots={**SLOTS, "n1s7": SlotInfo(1, 0)},
            standby={1: ("n1s7",)},
            warm=frozenset({"n1s7"}),
        ),
        CONFIG,
        [Publish({0: "n0p0", 1: "n1s7", 2: "n2p0"}, {1: "standby"}, "fault", (), (), (("n1s7", 0),))],
    ),
    "...a warm one first; one still warming up is further along than a cold start": (
        Observation(),
        state(
            fault=fault({1: "kill", 2: "hang"}),
            respawns=4,
            slots={**SLOTS, "n1s7": SlotInfo(1, 0), "n1s8": SlotInfo(1, 0), "n2s9": SlotInfo(2, 0)},
            standby={1: ("n1s7", "n1s8"), 2: ("n2s9",)},
            warm=frozenset({"n1s8"}),
        ),
        CONFIG,
        [
            Publish(
                {0: "n0p0", 1: "n1s8", 2: "n2s9"},
                {1: "standby", 2: "standby"},
                "fault",
                (),
                (),
                (("n1s8", 0), ("n2s9", 0)),
            )
        ],
    ),
    "--standby 1: every node holding ranks gets one once the generation runs": (
        Observation(),
        state(standby={0: ("n0s1",)}),
        RunConfig(**{**CONFIG.__dict__, "standby": 1}),
        [StartStandby(1), StartStandby(2)],
    ),
    "...not while a recovery is still on its way": (
        Observation(),
        state(settled=False),
        RunConfig(**{**CONFIG.__dict__, "standby": 1}),
        [],
    ),
    "node fault: a warm spare first, drain after": (
        Observation(),
        state(dead_nodes=frozenset({1}), fault=fault({1: "node"}, {1: "slurmd not responding"})),
        CONFIG,
        [
            Publish({0: "n0p0", 1: "n3p0", 2: "n2p0"}, {1: "spare"}, "fault", (), (3,)),
            Drain(1, "slurmd not responding"),
        ],
    ),
    "injected node kill with a spare: nothing to drain": (
        Observation(),
        state(dead_nodes=frozenset({1}), fault=fault({1: "node"})),
        CONFIG,
        [Publish({0: "n0p0", 1: "n3p0", 2: "n2p0"}, {1: "spare"}, "fault", (), (3,))],
    ),
    "no spare: drain, then an idle node of the job": (
        Observation(),
        state(spare_nodes=(), dead_nodes=frozenset({1}), fault=fault({1: "node"}, {1: "x"})),
        CONFIG,
        [Drain(1, "x"), UseIdleNode()],
    ),
    "no idle node: grow the job": (
        Observation(),
        state(
            spare_nodes=(),
            dead_nodes=frozenset({1}),
            fault=fault({1: "node"}, {1: "x"}, drained=frozenset({1}), tried=frozenset({"idle-node"})),
        ),
        CONFIG,
        [AcquireNode()],
    ),
    "nothing to grow into: requeue": (
        Observation(),
        state(
            spare_nodes=(),
            dead_nodes=frozenset({1}),
            requeueable=True,
            fault=fault({1: "node"}, tried=frozenset({"idle-node", "new-node"})),
        ),
        CONFIG,
        [Requeue("node gpu1 was lost and no spare node is left, nor an idle node to grow into")],
    ),
    "not requeueable (local run, salloc): fail": (
        Observation(),
        state(
            spare_nodes=(),
            dead_nodes=frozenset({1}),
            fault=fault({1: "node"}, tried=frozenset({"idle-node", "new-node"})),
        ),
        CONFIG,
        [Fail("node gpu1 was lost and no spare node is left (start with --spares)")],
    ),
    # --- the supervisor's own link cut: no node answers, none is to blame ------------------------
    "every node unreachable, the spare too: the supervisor is cut off; nothing drained": (
        Observation(lost={0: "exit 76", 1: "exit 76"}, evidence=dict.fromkeys(range(4), CUT)),
        state(),
        CONFIG,
        [Fail(ISOLATED.format(nodes=4))],
    ),
    "... in a batch job: requeued (it resumes from the tiers the nodes keep)": (
        Observation(lost={2: "exit 76"}, evidence=dict.fromkeys(range(4), CUT)),
        state(requeueable=True),
        CONFIG,
        [Requeue(ISOLATED.format(nodes=4), wait_s=ISOLATED_REQUEUE_WAIT_S)],  # asked until the link is back
    ),
    "under Slurm the supervisor's own node answers it, and proves nothing: the others are all cut": (
        Observation(
            lost={1: "exit 76", 2: "exit 76"},
            evidence={0: NodeEvidence(runs_supervisor=True), **dict.fromkeys((1, 2, 3), CUT_NO_SLURM)},
        ),
        state(requeueable=True),
        CONFIG,
        [Requeue(ISOLATED.format(nodes=3), wait_s=ISOLATED_REQUEUE_WAIT_S)],
    ),
    "one other node cut while Slurm answers: that node is unreachable, not the supervisor": (
        Observation(lost={1: "exit 76"}, evidence={0: NodeEvidence(runs_supervisor=True), 1: CUT}),
        state(members={0: "n0p0", 1: "n1p0"}, spare_nodes=()),
        CONFIG,
        [OpenFault(0.0, {1: "node"}, {1: UNREACHABLE}, None, {1: 1}), KillNode(1, UNREACHABLE)],
    ),
    "one other node cut and Slurm silent too: the supervisor's own link": (
        Observation(lost={1: "exit 76"}, evidence={0: NodeEvidence(runs_supervisor=True), 1: CUT_NO_SLURM}),
        state(members={0: "n0p0", 1: "n1p0"}, spare_nodes=(), requeueable=True),
        CONFIG,
        [Requeue(ISOLATED.format(nodes=1), wait_s=ISOLATED_REQUEUE_WAIT_S)],
    ),
    "a spare fenced itself (its node unreachable): drained as unreachable": (
        Observation(spares_exited=((3, "n3p0"),), evidence={3: CUT, 0: NodeEvidence()}),
        state(),
        CONFIG,
        [DropSpare(3, "n3p0"), Drain(3, UNREACHABLE)],
    ),
    "one node still answers: the lost ones are cut off, not the supervisor": (
        Observation(
            lost={1: "exit 76", 2: "exit 76"}, evidence={**dict.fromkeys(range(3), CUT), 3: NodeEvidence()}
        ),
        state(),
        CONFIG,
        [
            OpenFault(0.0, {1: "node", 2: "node"}, {1: UNREACHABLE, 2: UNREACHABLE}, None, {1: 1, 2: 1}),
            KillNode(1, UNREACHABLE),
            KillNode(2, UNREACHABLE),
        ],
    ),
}


@pytest.mark.parametrize("obs, st, config, expected", CASES.values(), ids=CASES.keys())
def test_policy_table(obs, st, config, expected):
    assert decide(NOW, obs, st, config).actions == tuple(expected)


def test_every_replacement_source_serves_in_some_case_of_the_tables():
    """A source added to REPLACEMENT_ORDER without a case that reaches it fails here."""
    from tests.unit.test_elastic_policy import CASES as ELASTIC_CASES

    served = {
        serving_source(NOW, st, config)[0]
        for _, st, config, _ in [*CASES.values(), *ELASTIC_CASES.values()]
        if st.fault is not None
    }
    assert served == set(REPLACEMENT_ORDER)


def test_two_lost_nodes_need_two_spares():
    members = {0: "n0p0", 1: "n1p0"}
    slots = {f"n{n}p0": SlotInfo(n, 0) for n in range(4)}
    st = RunState(
        members=members,
        slots=slots,
        hosts={},
        spare_nodes=(2,),
        dead_nodes=frozenset({0, 1}),
        fault=fault({0: "node", 1: "node"}),
    )
    assert decide(NOW, Observation(), st, CONFIG) == Decision((UseIdleNode(),), "replacing")
    st = RunState(**{**st.__dict__, "spare_nodes": (2, 3)})
    assert decide(NOW, Observation(), st, CONFIG).actions == (
        Publish({0: "n2p0", 1: "n3p0"}, {0: "spare", 1: "spare"}, "fault", (), (2, 3)),
    )


def test_only_a_ranks_own_error_inside_the_step_loop_has_a_place():
    assert error_at(raised(1)) == ErrorAt("ValueError", "ValueError: bad batch", 5)
    assert error_at(raised(1, step=None)) is None  # raised outside ctx.steps()
    assert error_at(raised(1, collateral=True, origin="peer")) is None
    assert error_at(raised(1, collateral=True, origin="released")) is None
    assert error_at(None) is None


def test_the_same_error_naming_another_object_address_recurs():
    """Each process prints its own address of the same object: not a different error."""
    first = raised(1, message="ValueError: Group <ProcessGroup object at 0x7f7bb7c32c70> is not registered")
    again = raised(0, message="ValueError: Group <ProcessGroup object at 0x7fd0a1e4b1f0> is not registered")
    assert error_at(first) == error_at(again)
    assert error_at(raised(1, message="ValueError: step 0x10 of 0x20")) != error_at(
        raised(1, message="ValueError: step 0x11 of 0x20")
    )  # short hex numbers are data, not addresses


def test_a_multi_line_message_is_named_by_its_first_line():
    message = "ValueError: bad batch\nshape (3, 4)"
    seen = frozenset({ErrorAt("ValueError", message, 5)})
    decision = decide(
        NOW, Observation(reports={"n1p0": raised(1, message=message)}), state(errors_seen=seen), CONFIG
    )
    *_, fail = decision.actions
    assert decision.why == "new fault" and isinstance(fail, Fail)
    assert (
        fail.reason.startswith("rank 1 raised ValueError: bad batch at step 5 again")
        and "\n" not in fail.reason
    )


def test_a_report_without_a_step_and_one_with_unknown_fields_are_read():
    old = '{"kind": "error", "rank": 1, "message": "ValueError: x"}'
    assert Report.decode(old).step is None
    newer = '{"kind": "error", "rank": 1, "step": 5, "a_later_field": 1}'
    assert Report.decode(newer) == Report("error", 1, step=5)


def test_the_placement_knows_an_injected_loss_by_the_policys_reason():
    """The drain a run undoes at its end is the one the policy gave an injected node loss."""
    from launcher.slurm.injected_drains import MARK
    from launcher.supervisor.policy.classify import INJECTED_NODE_LOSS

    assert INJECTED_NODE_LOSS.endswith(MARK)
