"""Small pure parts of the hooks: slurm.conf parsing and editing, wrappers, job processes."""

from __future__ import annotations

from slurm_plugins import wrappers
from slurm_plugins.checks.processes import (
    JobRecord,
    ProcessInfo,
    cgroup_job,
    claimed_job,
    job_of,
    parse_environ,
    stepd_job,
)
from slurm_plugins.checks.slurmctld import controllers
from slurm_plugins.checks.system import mem_available_mib
from slurm_plugins.conf_edit import MARK, apply_plugstack_line, apply_slurm_conf_lines, write_with_backup


def test_controllers_from_slurm_conf():
    conf = (
        "ClusterName=c\nSlurmctldHost=head1(10.0.0.1)\nSlurmctldHost=head2 # backup\n"
        "SlurmctldPort=6817-6818\n"
    )
    assert controllers(conf) == [("10.0.0.1", 6817), ("head2", 6817)]
    assert controllers("ControlMachine=old\nControlAddr=10.1.1.1\n") == [("10.1.1.1", 6817)]
    assert controllers("ClusterName=c\n") == []


def test_meminfo():
    assert mem_available_mib("MemTotal: 100 kB\nMemAvailable:   2097152 kB\n") == 2048
    assert mem_available_mib("MemTotal: 100 kB\n") is None


def test_an_environments_claim_is_narrowed_by_node_and_cluster_and_hooks_claim_nothing():
    env = parse_environ(b"SLURM_JOB_ID=12\x00SLURMD_NODENAME=n2\x00SLURM_CLUSTER_NAME=c1\x00")
    assert claimed_job(env, "n2", "c1") == "12"
    assert claimed_job(env, "n3", "c1") is None and claimed_job(env, "n2", "other") is None
    assert claimed_job({**env, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}, "n2", "c1") is None
    assert claimed_job({"PATH": "/bin"}, "n2", "c1") is None


def test_cgroups_and_step_daemons_name_jobs_users_cannot():
    assert cgroup_job("0::/system.slice/slurmstepd.scope/job_41/step_0/user/task_0\n") == "41"
    assert cgroup_job("12:pids:/slurm/uid_1000/job_7/step_batch\n1:name=systemd:/user.slice\n") == "7"
    assert cgroup_job("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert cgroup_job("0::/system.slice/job_runner.service\n") is None
    # a cgroup a user made in the subtree delegated to them, named like a job's
    assert cgroup_job("0::/user.slice/user-1001.slice/user@1001.service/job_31337/x\n") is None
    assert cgroup_job("0::/slurm_n1/uid_0/job_9/step_0\n") == "9"  # several slurmd on one host
    assert stepd_job(b"slurmstepd: [41.0]\x00", 0) == "41"
    assert (
        stepd_job(b"slurmstepd: [41.extern]", 0) == "41" and stepd_job(b"slurmstepd: [41.batch]", 0) == "41"
    )
    assert stepd_job(b"slurmstepd: [41.0]", 1000) is None  # a user's process named like one


USER, OTHER = 1000, 1001


def _table(*infos: ProcessInfo) -> dict[int, ProcessInfo]:
    return {i.pid: i for i in infos}


def test_whose_a_process_is_comes_from_what_its_user_cannot_forge():
    records = {"5": JobRecord(USER, finished=False), "6": JobRecord(USER, finished=True)}
    stepd = ProcessInfo(10, 1, 0, "slurmstepd", stepd_job="5")
    in_step = ProcessInfo(11, 10, USER, "python", env={"SLURM_JOB_ID": "31337"})  # claims another job
    escaped = ProcessInfo(12, 1, USER, "sleep", env={"SLURM_JOB_ID": "6"})
    forged = ProcessInfo(13, 1, OTHER, "sleep", env={"SLURM_JOB_ID": "6"})  # claims USER's job
    unknown = ProcessInfo(14, 1, USER, "sleep", env={"SLURM_JOB_ID": "31337"})
    hidden = ProcessInfo(15, 1, USER, "sleep", cgroup_job="6")  # no claim; its cgroup tells
    epilog = ProcessInfo(16, 1, 0, "sh", env={"SLURM_JOB_ID": "6", "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"})
    table = _table(stepd, in_step, escaped, forged, unknown, hidden, epilog)

    def judged(info: ProcessInfo) -> tuple[str | None, bool]:
        return job_of(info, table, None, None, records.get)

    assert judged(in_step) == ("5", False)  # in a live step: never a leftover, whatever it claims
    assert judged(escaped) == ("6", True)  # Slurm confirms job 6 is its uid's, and over
    assert judged(forged) == (None, False) and judged(unknown) == (None, False)
    assert (
        judged(hidden) == ("6", True) and judged(stepd) == (None, False) and judged(epilog) == (None, False)
    )


def test_a_process_started_after_its_claimed_job_ended_is_not_that_jobs_leftover():
    """A user's process outside any job, claiming one of that user's own finished jobs in its
    environment, once got the node drained by the prolog. Started after the job ended (the
    kernel's start time against Slurm's end time), it is no leftover of it."""
    records = {"6": JobRecord(USER, finished=True, ended_at=1000.0)}
    late = ProcessInfo(20, 1, USER, "sleep", env={"SLURM_JOB_ID": "6"}, started_at=1100.0)
    left = ProcessInfo(21, 1, USER, "sleep", env={"SLURM_JOB_ID": "6"}, started_at=900.0)
    table = _table(late, left)
    assert job_of(late, table, None, None, records.get) == (None, False)
    assert job_of(left, table, None, None, records.get) == ("6", True)


def test_wrapper_pins_config_path_and_environment():
    text = wrappers.wrapper_text(
        "prolog", "/etc/sres", "/opt/venv/bin/sres", {"SLURM_CONF": "/etc/slurm/a b.conf"}
    )
    assert text.startswith("#!/bin/sh\n")
    assert 'SRES_HEALTH_CONFIG="${SRES_HEALTH_CONFIG:-/etc/sres/health.yaml}"' in text
    assert "export SLURM_CONF='/etc/slurm/a b.conf'" in text
    assert text.rstrip().endswith('exec /opt/venv/bin/sres hooks prolog "$@"')
    assert set(wrappers.node_files("/p", "sres", "x: 1\n", {})) == {
        "health.yaml",
        "hooks/prolog",
        "hooks/epilog",
        "hooks/healthcheck",
    }


def test_slurm_conf_edit_replaces_merges_appends_and_is_idempotent():
    conf = "ClusterName=c\nSchedulerParameters=permit_job_expansion\nprolog=/old # site\nNodeName=n1\n"
    lines = wrappers.slurm_conf_lines("/etc/sres", 120)
    once = apply_slurm_conf_lines(conf, lines)
    assert "prolog=/old" not in once and "Prolog=/etc/sres/hooks/prolog" in once
    assert "SchedulerParameters=permit_job_expansion,nohold_on_prolog_fail" in once
    assert once.index("Epilog=") > once.index(MARK) and "HealthCheckInterval=120" in once
    assert apply_slurm_conf_lines(once, lines) == once
    assert apply_plugstack_line("", "optional /x.so") == "optional /x.so\n"
    assert apply_plugstack_line("optional   /x.so\n", "optional /x.so") == "optional   /x.so\n"


def test_write_with_backup(tmp_path):
    path = tmp_path / "slurm.conf"
    path.write_text("a\n")
    changed, backup = write_with_backup(path, "b\n")
    assert changed and backup.read_text() == "a\n" and path.read_text() == "b\n"
    assert write_with_backup(path, "b\n") == (False, None)
    fresh = tmp_path / "plugstack.conf"
    assert write_with_backup(fresh, "x\n") == (True, None) and fresh.read_text() == "x\n"
