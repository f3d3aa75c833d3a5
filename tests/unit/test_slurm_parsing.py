"""Parsing of Slurm output recorded on the test cluster (Slurm 22.05.8): pure functions."""

from launcher.errors import SlurmError
from launcher.slurm.command_driver import (
    _node_from_sinfo,
    job_from_scontrol,
    job_owner_from_squeue,
    parse_scontrol_record,
    pick_record,
)
import pytest

from launcher.slurm.types import duration_s, split_state

JOB_LINE = (
    "JobId=1 JobName=my job UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=RUNNING Reason=None Dependency=(null) Requeue=1 Restarts=2 "
    "BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED Partition=gpu "
    "AllocNode:Sid=localhost:1053 ReqNodeList=(null) ExcNodeList=(null) NodeList=n[3-4] BatchHost=n3 "
    "NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,node=2,billing=2 "
    "Socks/Node=* Command=(null) WorkDir=/tmp StdOut=/tmp/slurm-1.out Power= "
)


def test_scontrol_record_keeps_spaces_and_equals_in_values():
    record = parse_scontrol_record(JOB_LINE)
    assert record["JobName"] == "my job"
    assert record["TRES"] == "cpu=2,node=2,billing=2"
    assert record["AllocNode:Sid"] == "localhost:1053"
    assert record["Power"] == ""
    assert record["NodeList"] == "n[3-4]"


def test_job_from_scontrol():
    job = job_from_scontrol(parse_scontrol_record(JOB_LINE))
    assert job.job_id == "1"
    assert job.name == "my job"
    assert job.state == "RUNNING" and job.running and not job.finished
    assert job.nodes == ("n3", "n4")
    assert job.num_nodes == 2
    assert job.restart_count == 2
    assert job.batch_host == "n3"
    assert job.array_task_id is None
    assert job.run_time_s == 1 and job.time_limit_s is None and job.time_left_s is None  # UNLIMITED


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("5", 300),
        ("5:30", 330),
        ("01:02:03", 3723),
        ("1-0", 86400),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("UNLIMITED", None),
        ("INVALID", None),
        ("", None),
        ("1:2:3:4", None),
    ],
)
def test_slurm_durations(text, seconds):
    """sbatch --time's spellings, and what scontrol prints for a job without a limit."""
    assert duration_s(text) == seconds


def test_node_reason_with_spaces_survives_scontrol_parsing():
    line = (
        "NodeName=n2 Arch=x86_64 State=IDLE+DRAIN Reason=sres: gpu fell off the bus "
        "[root@2026-11-21T11:21:17] Weight=1"
    )
    record = parse_scontrol_record(line)
    assert record["Reason"] == "sres: gpu fell off the bus [root@2026-11-21T11:21:17]"
    assert record["Weight"] == "1"


def test_node_from_sinfo_json():
    record = {
        "name": "n2",
        "state": "idle",
        "state_flags": ["DRAIN"],
        "reason": "sres: gpu fell off the bus",
        "partitions": ["gpu"],
        "address": "127.0.0.1",
        "hostname": "vm",
        "cpus": 2,
    }
    node = _node_from_sinfo(record)
    assert node.state == "IDLE" and node.flags == {"DRAIN"}
    assert node.drained and node.drained_by_us and not node.usable and not node.idle
    assert node.long_state == "IDLE+DRAIN"


def test_split_state_spellings():
    assert split_state("IDLE+DRAIN") == ("IDLE", {"DRAIN"})
    assert split_state("idle*") == ("IDLE", {"NOT_RESPONDING"})
    assert split_state("DOWN*+DRAIN") == ("DOWN", {"NOT_RESPONDING", "DRAIN"})
    assert split_state("drained") == ("IDLE", {"DRAIN"})
    assert split_state("MIXED+COMPLETING") == ("MIXED", {"COMPLETING"})
    assert split_state("") == ("UNKNOWN", set())


def test_an_array_tasks_own_id_picks_its_record():
    """Recorded: ``scontrol -o show job 1`` where 1 is both task 1_1's JobId and the array's id
    prints every task of the array; task 1_0 runs as JobId 2."""
    out = [
        "JobId=2 ArrayJobId=1 ArrayTaskId=0 JobName=job.sh JobState=RUNNING Restarts=0",
        "JobId=1 ArrayJobId=1 ArrayTaskId=1 JobName=job.sh JobState=RUNNING Restarts=1",
    ]
    records = [parse_scontrol_record(line) for line in out]
    assert pick_record(records, "1")["ArrayTaskId"] == "1"
    assert pick_record(records, "1_0")["JobId"] == "2"
    assert job_from_scontrol(pick_record(records, "2")).restart_count == 0


# squeue --json on the test cluster (22.05: data_parser v0.0.38), the fields job_owner reads.
SQUEUE = {
    "jobs": [
        {"job_id": 4, "user_id": 0, "user_name": "root", "comment": "", "job_state": "COMPLETED",
         "batch_host": "n4", "array_job_id": 0, "array_task_id": None},
        {"job_id": 30, "user_id": 1002, "user_name": "eve",
         "comment": "sres-run=/home/eve/run UserId=alice(1001) BatchHost=evil",
         "job_state": "RUNNING", "batch_host": "n1", "array_job_id": 0, "array_task_id": None},
        {"job_id": 41, "user_id": 1001, "comment": {"job": "sres-run=/x"}, "job_state": ["RUNNING"],
         "batch_host": "n2", "array_job_id": 40, "array_task_id": 1},
    ]
}  # fmt: skip


def test_a_job_owner_comes_from_typed_fields_whatever_its_comment_spells():
    owner = job_owner_from_squeue(SQUEUE, "30")
    assert (owner.user_id, owner.batch_host, owner.running) == (1002, "n1", True)
    assert owner.comment == "sres-run=/home/eve/run UserId=alice(1001) BatchHost=evil"


def test_later_releases_spellings_and_array_tasks_are_read():
    owner = job_owner_from_squeue(SQUEUE, "40_1")
    assert (owner.user_id, owner.comment, owner.state) == (1001, "sres-run=/x", "RUNNING")


def test_an_unknown_job_or_owner_fails_closed():
    with pytest.raises(SlurmError, match="knows no job 99"):
        job_owner_from_squeue(SQUEUE, "99")
    with pytest.raises(SlurmError, match="owner is unknown"):
        job_owner_from_squeue({"jobs": [{"job_id": 5, "user_id": "root"}]}, "5")
