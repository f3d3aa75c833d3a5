"""A governance policy read, checked and turned into sacctmgr commands (pure: no Slurm here; the
same commands run against a real slurmdbd in tests/cluster/test_governance.py)."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.errors import PolicyError
from launcher.governance import changes
from launcher.governance import policy as gp
from launcher.governance.slurm_objects import Objects, conf_gaps, conf_lines, desired

BASE = {
    "teams": {
        "vision": {"quota_nodes": 2, "weight": 3, "users": ["alice"]},
        "speech": {"quota_nodes": 1, "lend": False, "borrow": False},
    },
    "priority_classes": {
        "inference": {"priority": 400},
        "training": {"priority": 300},
        "experiments": {"priority": 100, "preempts_borrowed": False},
    },
}


def _with(**top) -> dict:
    return {**BASE, **top}


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "policy: a mapping of"),
        ({"teams": BASE["teams"]}, "policy: priority_classes is missing"),
        (_with(teams={}), "teams: a mapping from names"),
        (_with(teams={"Vision": {"quota_nodes": 1}}), "'Vision' is not a name Slurm keeps"),
        (_with(teams={"borrow": {"quota_nodes": 1}}), "'borrow' is Slurm's or sres's own name"),
        (_with(teams={"x_borrow": {"quota_nodes": 1}}), "ending in '_borrow'"),
        (_with(teams={"a": {"quota_nodes": -1}}), "teams.a.quota_nodes: a whole number from 0"),
        (_with(teams={"a": {"quota_nodes": 1, "weight": 0}}), "teams.a.weight: a whole number from 1"),
        (_with(teams={"a": {"quota_nodes": 1, "lend": "yes"}}), "teams.a.lend: true or false"),
        (_with(teams={"a": {"quota_nodes": 1, "classes": ["batch"]}}), "unknown priority class 'batch'"),
        (
            _with(teams={"a": {"quota_nodes": 1, "classes": ["training"], "default_class": "inference"}}),
            "teams.a.default_class: 'inference' is not one of its classes",
        ),
        (_with(teams={"a": {"quota_nodes": 1, "quota_gpus": 8}}), "GPU quotas need cluster_gpus"),
        (_with(cluster_nodes=2), "quotas add up to 3 nodes; the cluster has 2"),
        (_with(priority_classes={"a": {"priority": 1, "preempts": ["a"]}}), "cycle: a -> a"),
        (
            _with(
                priority_classes={
                    "a": {"priority": 1, "preempts": ["b"]},
                    "b": {"priority": 2, "preempts": ["c"]},
                    "c": {"priority": 3, "preempts": ["a"]},
                }
            ),
            "cycle: a -> b -> c -> a",
        ),
        (_with(priority_classes={"a": {"priority": 1, "preempts": ["z"]}}), "unknown priority class 'z'"),
        (_with(preempt_mode="suspend"), "preempt_mode: one of requeue, cancel"),
        (_with(quota=1), "unknown field 'quota'"),
    ],
)
def test_each_invalid_policy_is_one_line_naming_where(data, message):
    with pytest.raises(PolicyError) as refused:
        gp.from_data(data)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_policy_stands_for_accounts_with_quotas_and_a_borrow_qos_capped_at_what_is_lent():
    objects = desired(gp.from_data(BASE), nodes=5, gpus=None)
    assert objects.qos["borrow"].grp_tres == "node=4"  # speech keeps its one node: it does not lend
    assert objects.qos["training"].preempt == ("borrow",) and objects.qos["experiments"].preempt == ()
    vision = objects.accounts["vision"]
    assert (vision.fairshare, vision.grp_tres, vision.default_qos) == (3, "node=2", "experiments")
    assert objects.accounts["vision_borrow"].qos == ("borrow",) and "speech_borrow" not in objects.accounts
    assert objects.members == {("alice", "vision"), ("alice", "vision_borrow")}


def test_nothing_to_do_when_current_is_wanted_and_undo_returns_to_empty():
    wanted = desired(gp.from_data(BASE), nodes=5, gpus=None)
    made = changes.plan(Objects.empty(), wanted, "c")
    assert made and changes.plan(wanted, wanted, "c") == []
    undo = changes.plan(wanted, Objects.empty(), "c")
    assert [c.args[:2] for c in undo] == [("delete", "user")] * 2 + [("delete", "account")] * 3 + [
        ("delete", "qos")
    ] * 4


def test_a_qos_is_made_before_the_qos_that_preempt_it():
    data = _with(priority_classes={"hi": {"priority": 9, "preempts": ["lo"]}, "lo": {"priority": 1}})
    made = [
        c.args[2]
        for c in changes.plan(Objects.empty(), desired(gp.from_data(data), 5, None), "c")
        if c.args[1] == "qos"
    ]
    assert made.index("borrow") < made.index("hi") and made.index("lo") < made.index("hi")


def test_a_grptres_limit_dropped_is_cleared_and_preempt_emptied_explicitly():
    wanted = desired(gp.from_data(BASE), nodes=5, gpus=None)
    was = dataclasses.replace(wanted.qos["borrow"], grp_tres="gres/gpu=8,node=4")
    current = dataclasses.replace(wanted, qos={**wanted.qos, "borrow": was})
    (change,) = changes.plan(current, wanted, "c")
    assert change.args[-1] == "GrpTRES=node=4,gres/gpu=-1"
    was = dataclasses.replace(wanted.qos["experiments"], preempt=("borrow",))
    current = dataclasses.replace(wanted, qos={**wanted.qos, "experiments": was})
    (change,) = changes.plan(current, wanted, "c")
    assert change.args[-1] == "Preempt=" and change.shell().endswith("Preempt=''")


def test_someone_else_s_qos_or_account_is_never_taken_over():
    with pytest.raises(PolicyError, match="'training' already exists .* not made by sres"):
        changes.plan(Objects.empty(), desired(gp.from_data(BASE), 5, None), "c", frozenset({"training"}))


def test_conf_gaps_compare_as_slurm_spells_the_running_config():
    lines = conf_lines(gp.from_data(BASE))
    running = {
        "PreemptType": "preempt/qos",
        "PreemptMode": "REQUEUE,GANG",
        "PriorityType": "priority/multifactor",
        "PriorityWeightQOS": "10000",
        "PriorityWeightFairshare": "1000",
        "AccountingStorageEnforce": "associations,limits,qos,safe,wckeys",
        "JobRequeue": "1",
    }
    assert conf_gaps(lines, running) == []
    assert conf_gaps(lines, {**running, "PreemptType": "preempt/partition_prio"}) == [
        ("PreemptType", "preempt/qos", "preempt/partition_prio")
    ]


def _job(
    account: str, start: float | None, end: float | None, nodes: int = 1, state: str = "COMPLETED", **kw
):
    from launcher.slurm.accounting import AccountedJob

    return AccountedJob(
        job_id=kw.get("job_id", "1"),
        name="x",
        user="u",
        account=account,
        qos=kw.get("qos", "training"),
        state=state,
        submit=kw.get("submit", start),
        start=start,
        end=end,
        nodes=nodes,
    )


def test_usage_clips_each_run_to_the_window_and_attributes_borrowed_nodes_to_unused_quotas():
    from launcher.governance.usage import TeamLimits, usage

    teams = {"a": TeamLimits(2, 3), "b": TeamLimits(2, 1)}
    jobs = [
        _job("a", 0.0, 100.0, nodes=2),  # a's own quota, the whole window
        _job("a_borrow", 50.0, 150.0, nodes=2, state="PREEMPTED", submit=40.0),  # b's idle nodes, half of it
        _job("b", None, None, nodes=1, state="PENDING", submit=90.0),
    ]
    u = usage(jobs, teams, {}, cluster_nodes=4, since=0.0, until=100.0)
    a, b = u.teams
    assert (a.node_hours_own, a.node_hours_borrowed) == (200 / 3600, 100 / 3600)
    assert a.used_nodes == 2 and a.borrowed_nodes == 1 and a.preempted == 1 and a.mean_wait_s == 5.0
    assert b.lent_nodes == 1 and a.lent_nodes == 0  # a used its whole quota: it lent nothing
    assert b.pending == 1 and u.utilization == 300 / 400 and u.top_borrowers[0][0] == "a"


def test_sres_jobs_names_each_task_s_team_and_whether_it_borrows():
    from launcher.cli.jobs import rows
    from launcher.governance.usage import TeamLimits
    from launcher.slurm.types import Job

    def job(job_id: str, account: str, qos: str, state: str = "RUNNING") -> Job:
        return Job(
            job_id, state, "train", num_nodes=2, extra={"Account": account, "QOS": qos, "UserId": "ann(1001)"}
        )

    teams = {"vision": TeamLimits(2, 3)}
    listed = rows(
        [
            job("12", "vision_borrow", "borrow"),
            job("3", "vision", "training"),
            job("4", "(null)", "(null)"),
            job("5", "vision", "training", "COMPLETED"),
        ],
        teams,
    )
    assert [(r["job"], r["team"], r["class"], r["borrowed"], r["user"]) for r in listed] == [
        ("3", "vision", "training", False, "ann"),
        ("4", "", "", False, "ann"),
        ("12", "vision", "borrow", True, "ann"),
    ]
