"""Small pure parts of the hooks: slurm.conf parsing and editing, wrappers, job processes."""

from __future__ import annotations

from slurm_plugins import wrappers
from slurm_plugins.checks.processes import JobProcess, belongs, leftovers, parse_environ
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


def test_job_processes_belong_to_their_node_and_cluster_hooks_excluded():
    env = parse_environ(b"SLURM_JOB_ID=12\x00SLURMD_NODENAME=n2\x00SLURM_CLUSTER_NAME=c1\x00")
    assert belongs(env, "n2", "c1") == "12"
    assert belongs(env, "n3", "c1") is None and belongs(env, "n2", "other") is None
    assert belongs({**env, "SLURM_SCRIPT_CONTEXT": "epilog_slurmd"}, "n2", "c1") is None
    assert belongs({"PATH": "/bin"}, "n2", "c1") is None
    procs = [JobProcess(1, "12", "python"), JobProcess(2, "13", "sleep")]
    assert leftovers(procs, {"12"}) == [JobProcess(2, "13", "sleep")]


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
