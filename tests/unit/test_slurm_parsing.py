"""Parsing of Slurm output recorded on the test cluster (Slurm 22.05.8): pure functions."""

from launcher.slurm.command_driver import (
    _node_from_sinfo,
    job_from_scontrol,
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
