"""The drain/resume/reboot decision (pure): NHC's policy on our own interfaces."""

from __future__ import annotations

from slurm_plugins.health_actions import Kind, decide, failure_reason
from slurm_plugins.checks.base import CheckResult, Fault, Status, fail, ok
from slurm_plugins.health_config import Actions
from launcher.slurm.types import Node

IDLE = Node("n1", "IDLE")
OURS = Node("n1", "IDLE", frozenset({"DRAIN"}), "sres: mounts: /scratch missing")
ADMIN = Node("n1", "IDLE", frozenset({"DRAIN"}), "bad fan, ticket 4411")
GOOD = [ok("memory"), ok("disk")]
ECC = fail("gpu_ecc", "gpu 3: 2 uncorrectable ECC errors")
LOST = fail("gpu_count", "7 of 8 GPUs visible", Fault.TRANSIENT)


def test_a_failure_drains_with_our_reason():
    d = decide(GOOD + [ECC], IDLE, Actions(), may_resume=False)
    assert d.kind is Kind.DRAIN and d.reason == "sres: gpu_ecc: gpu 3: 2 uncorrectable ECC errors"


def test_reason_names_the_first_failure_and_counts_the_rest_and_timeouts_say_so():
    hung = CheckResult("gpu", Status.TIMEOUT, "killed after 10 s budget", Fault.TRANSIENT)
    assert failure_reason([hung, LOST]) == "sres: gpu: timeout (killed after 10 s budget) (+1 more)"
    assert len(failure_reason([fail("x", "y" * 500)])) <= 200


def test_fault_class_picks_the_configured_action():
    reboot_transient = Actions(transient="reboot")
    assert decide([LOST], IDLE, reboot_transient, False).kind is Kind.REBOOT
    assert decide([ECC], IDLE, reboot_transient, False).kind is Kind.DRAIN
    assert decide([LOST, ECC], IDLE, reboot_transient, False).kind is Kind.DRAIN  # persistent wins
    assert decide([ECC], IDLE, Actions(persistent="reboot"), False).kind is Kind.REBOOT


def test_an_admins_drain_is_never_touched():
    assert decide([ECC], ADMIN, Actions(), False).kind is Kind.NONE
    assert decide(GOOD, ADMIN, Actions(), True).kind is Kind.NONE


def test_resume_only_our_drain_only_when_allowed_and_all_pass():
    assert decide(GOOD, OURS, Actions(), may_resume=True).kind is Kind.RESUME
    assert decide(GOOD, OURS, Actions(), may_resume=False).kind is Kind.NONE
    assert decide(GOOD, IDLE, Actions(), may_resume=True).kind is Kind.NONE
    rebooting = Node("n1", "IDLE", frozenset({"DRAIN", "REBOOT_REQUESTED"}), "sres: gpu_count: 7 of 8")
    assert decide(GOOD, rebooting, Actions(), True).kind is Kind.NONE


def test_same_reason_again_is_no_churn_a_new_one_redrains():
    same = fail("mounts", "/scratch missing")
    assert decide([same], OURS, Actions(), False).kind is Kind.NONE
    assert decide([ECC], OURS, Actions(), False).kind is Kind.DRAIN


def test_unknown_slurm_view_still_drains_on_failure():
    assert decide([ECC], None, Actions(), False).kind is Kind.DRAIN
    assert decide(GOOD, None, Actions(), True).kind is Kind.NONE
