"""The runner: a hung check is killed at its budget (with what it started) and reported as a
timeout; a crashing check is a failed check; checks run side by side."""

from __future__ import annotations

import os
import time
import uuid

import pytest

from slurm_plugins.checks.base import Check, CheckContext, Fault, Status, ok
from slurm_plugins.checks.command import command_check
from slurm_plugins.health_config import CommandCheck, HealthConfig
from slurm_plugins.runner import run_checks, run_in_turn

pytestmark = pytest.mark.local  # the runner forks a process per check; checks run programs

CTX = CheckContext(HealthConfig(), "n1")


def hang(ctx):
    time.sleep(3600)
    return [ok("never")]


def quick(ctx):
    return [ok("quick", "fine")]


def crash(ctx):
    raise RuntimeError("NVML said no")


def pids_with_arg(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_a_hung_check_is_killed_at_its_budget_and_reported_as_timeout():
    start = time.monotonic()
    results = run_checks(
        [Check("gpu", hang, Fault.TRANSIENT), Check("quick", quick)], CTX, per_check_s=1.0, total_s=10
    )
    took = time.monotonic() - start
    assert [r.check for r in results] == ["gpu", "quick"]
    assert results[0].status is Status.TIMEOUT and results[0].failed and results[0].fault is Fault.TRANSIENT
    assert results[0].detail == "killed after 1 s budget"
    assert results[1].status is Status.OK
    assert 0.9 < took < 3.5


def test_a_hung_program_started_by_a_check_is_killed_too():
    marker = f"{uuid.uuid4().hex}"
    spec = CommandCheck("site", ("sh", "-c", f"sleep 300; echo {marker}"))
    results = run_checks([Check("site", command_check(spec))], CTX, per_check_s=0.5, total_s=5)
    assert results[0].status is Status.TIMEOUT
    deadline = time.monotonic() + 5
    while pids_with_arg(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pids_with_arg(marker), "the check's child program survived its budget"


def test_the_total_budget_bounds_checks_that_run_side_by_side():
    start = time.monotonic()
    results = run_checks([Check(f"h{i}", hang) for i in range(3)], CTX, per_check_s=10, total_s=1.0)
    assert all(r.status is Status.TIMEOUT for r in results)
    assert time.monotonic() - start < 3.5


def test_in_turn_reports_checks_left_without_budget():
    results = run_in_turn([Check("h", hang), Check("q", quick)], CTX, per_check_s=0.5, total_s=0.5)
    assert [r.status for r in results] == [Status.TIMEOUT, Status.TIMEOUT]
    assert "total budget of 0.5 s used up" in results[1].detail


def children() -> set[int]:
    return {int(c) for c in open(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read().split()}


def test_a_crashing_check_fails_with_the_reason_and_no_child_is_left():
    before = children()  # in a whole-suite run, the session's Slurm daemons are our children
    results = run_checks([Check("gpu", crash), Check("h", hang)], CTX, per_check_s=0.5, total_s=5)
    assert results[0].status is Status.FAIL and "RuntimeError: NVML said no" in results[0].detail
    assert not children() - before, "a check's process was left behind (running or unreaped)"


def test_command_checks_report_exit_codes():
    good = command_check(CommandCheck("t", ("true",)))(CTX)[0]
    bad = command_check(CommandCheck("ib", ("sh", "-c", "echo port down >&2; exit 3"), "transient"))(CTX)[0]
    missing = command_check(CommandCheck("x", ("/nonexistent/tool",)))(CTX)[0]
    assert good.status is Status.OK
    assert bad.status is Status.FAIL and bad.detail == "exit 3: port down" and bad.fault is Fault.TRANSIENT
    assert missing.status is Status.FAIL and "cannot run /nonexistent/tool" in missing.detail
