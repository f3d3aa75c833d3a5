"""``sres hooks`` as Slurm and admins run it: real subprocesses, no Slurm needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import yaml


def sres(*args, env_extra=None, tmp_path=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRES_"))}
    if tmp_path:  # a controller that refuses at once (a missing slurm.conf makes sinfo wait ~60 s)
        conf = tmp_path / "no-cluster.conf"
        conf.write_text(
            "ClusterName=none\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\nMessageTimeout=1\n"
        )
        env["SLURM_CONF"] = str(conf)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def write(tmp_path, data, name="health.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


PROLOG_ENV = {
    "SLURMD_NODENAME": "n7",
    "SLURM_JOB_ID": "41",
    "SLURM_NODELIST": "n7",
    "SLURM_JOB_UID": str(os.getuid()),  # slurmd 22.05 gives it (the hooks' cluster tests rely on it)
}


@pytest.mark.local  # spawns: python -m launcher.cli
def test_bad_config_fails_open_by_default_with_one_clear_line_and_a_loud_log(tmp_path):
    log = tmp_path / "h.jsonl"
    bad = write(
        tmp_path, {"log": {"file": str(log), "syslog": False}, "checks": {"memory": {"min_free_gb": 1}}}
    )
    result = sres("hooks", "prolog", "--config", str(bad), env_extra=PROLOG_ENV, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("sres: error:")]
    assert errors == [
        f"sres: error: health config {bad}: checks.memory.min_free_gb: unknown key "
        "(known here: enabled, min_free_mib)"
    ]
    assert "failing OPEN" in result.stderr and "Traceback" not in result.stderr
    event = json.loads(log.read_text().splitlines()[-1])
    assert event["event"] == "config_error" and event["policy"] == "open" and event["node"] == "n7"


@pytest.mark.local  # spawns: python -m launcher.cli
def test_bad_config_fails_closed_when_it_says_so(tmp_path):
    log = tmp_path / "h.jsonl"
    bad = write(
        tmp_path, {"on_config_error": "closed", "log": {"file": str(log)}, "budget": {"per_check_s": -1}}
    )
    result = sres("hooks", "prolog", "--config", str(bad), env_extra=PROLOG_ENV, tmp_path=tmp_path)
    assert result.returncode == 1
    assert (
        f"sres: error: health config {bad}: budget.per_check_s: must not be negative, got -1" in result.stderr
    )
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert events[0]["event"] == "config_error" and events[0]["policy"] == "closed"
    assert any(
        e["event"] == "action" and e.get("reason") == "sres: config: budget.per_check_s" for e in events
    )


@pytest.mark.local  # spawns: python -m launcher.cli
def test_config_from_the_environment_and_verify(tmp_path):
    good = write(tmp_path, {"checks": {"memory": {"min_free_mib": 1}}})
    result = sres(
        "hooks", "health", "--verify", env_extra={"SRES_HEALTH_CONFIG": str(good), "SLURMD_NODENAME": "n2"}
    )
    assert result.returncode == 0 and f"config {good} valid" in result.stdout and "on n2" in result.stdout
    wrong = write(tmp_path, {"checks": {"disk": "/tmp"}}, "wrong.yaml")
    result = sres("hooks", "check", "--config", str(wrong))
    assert result.returncode == 1 and result.stderr.strip().splitlines() == [
        f"sres: error: health config {wrong}: checks.disk: expected a list, got str '/tmp'"
    ]


@pytest.mark.local  # spawns: python -m launcher.cli
def test_check_prints_a_table_and_a_hung_check_is_a_timeout(tmp_path):
    cfg = write(
        tmp_path,
        {
            "budget": {"per_check_s": 1, "total_s": 5},
            "checks": {
                "commands": [{"name": "hung_tool", "command": ["sleep", "120"]}],
                "disk": [{"path": str(tmp_path), "min_free_mib": 1}],
            },
        },
    )
    start = time.monotonic()
    result = sres("hooks", "check", "--config", str(cfg))
    assert time.monotonic() - start < 30
    assert result.returncode == 1
    rows = {line.split()[0]: line.split()[1:] for line in result.stdout.splitlines()[1:]}
    assert rows["hung_tool"][:2] == ["timeout", "persistent"] and "killed after 1 s budget" in result.stdout
    assert rows["disk"][0] == "ok" and rows["gpu"][0] == "skipped"
    assert result.stdout.splitlines()[0].split() == ["check", "status", "fault", "time", "s", "detail"]


@pytest.mark.local  # spawns: python -m launcher.cli
def test_prolog_failure_exits_1_and_logs_one_line_per_check(tmp_path):
    log = tmp_path / "h.jsonl"
    cfg = write(
        tmp_path,
        {
            "log": {"file": str(log), "syslog": True},
            "checks": {
                "mounts": [{"path": str(tmp_path / "scratch-%n"), "mountpoint": False}],
                "slurmctld": {"enabled": False},
            },
        },
    )
    result = sres("hooks", "prolog", "--config", str(cfg), env_extra=PROLOG_ENV, tmp_path=tmp_path)
    assert result.returncode == 1
    events = [json.loads(line) for line in log.read_text().splitlines()]
    checks = [e for e in events if e["event"] == "check"]
    assert {e["check"] for e in checks} == {"gpu", "memory", "disk", "shm", "mounts", "processes"}
    mounts = next(e for e in checks if e["check"] == "mounts")
    assert mounts["status"] == "fail" and mounts["detail"] == f"{tmp_path}/scratch-n7 missing"
    assert mounts["job"] == "41" and mounts["nodelist"] == "n7" and mounts["hook"] == "prolog"
    # No Slurm here: the drain cannot be done, is logged, and the exit code still keeps jobs away.
    assert any(e["event"] in ("slurm", "action") and e.get("status") == "error" for e in events), events
    (tmp_path / "scratch-n7").mkdir()
    assert (
        sres("hooks", "prolog", "--config", str(cfg), env_extra=PROLOG_ENV, tmp_path=tmp_path).returncode == 0
    )


def test_job_nodelist_is_read_from_either_variable():
    from slurm_plugins.hooks import HookEnv

    assert HookEnv.from_env({"SLURM_NODELIST": "n[1-2]"}).nodelist == "n[1-2]"
    assert HookEnv.from_env({"SLURM_JOB_NODELIST": "n3", "SLURM_NODELIST": "n[1-2]"}).nodelist == "n3"
    assert HookEnv.from_env({"SLURM_JOBID": "9"}).job_id == "9"


@pytest.mark.local  # spawns: python -m launcher.entry
def test_the_epilog_as_slurm_runs_it_cleans_the_ram_tier_and_imports_no_torch(tmp_path):
    """``sres hooks epilog`` through the ``sres`` console script's own entry (launcher.entry),
    as every node runs it at every job's end: importing torch there would cost a second a job."""
    from resilience.tiers.checkpoint_dirs import FileEntry, Manifest, rank_dir, steps_in

    own = tmp_path / "ram" / "job-41" / "node-n7" / "own"
    for step in (10, 20, 30):  # complete steps, nothing persisted: the newest keep_ram (2) stay
        path = rank_dir(own, step, 0)
        path.mkdir(parents=True)
        (path / "replicated.bin").write_bytes(b"x" * 64)
        entry = FileEntry(64, "0")
        (path / "manifest.json").write_text(Manifest("41", step, 1, 0, {"replicated.bin": entry}).to_json())
    log = tmp_path / "h.jsonl"
    off = {"enabled": False}
    cfg = write(
        tmp_path,
        {
            "ram_root": str(tmp_path / "ram"),
            "log": {"file": str(log), "syslog": False},
            "checks": {"gpu": off, "processes": off, "slurmctld": off},
        },
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SRES_"))}
    env.update(PROLOG_ENV, SLURM_SCRIPT_CONTEXT="epilog_slurmd", PYTHONPROFILEIMPORTTIME="1")
    result = subprocess.run(
        [sys.executable, "-m", "launcher.entry", "hooks", "epilog", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert [line for line in result.stderr.splitlines() if line.endswith("| torch")] == []
    assert steps_in(own) == [30, 20]
    cleanup = [json.loads(line) for line in log.read_text().splitlines() if '"cleanup"' in line]
    assert cleanup[0]["status"] == "ok" and cleanup[0]["ram_tier_removed"] is True
