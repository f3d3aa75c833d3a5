"""The protection budget end to end: the ranks agree a cadence from what their copies cost, say
it, keep it when a rank's process is replaced, and a fault that the RAM tier serves redoes no
more steps than they said were at risk."""

from __future__ import annotations

from resilience.tiers import budget
from tests.support.tier_runs import dump, sres_tiers

STEPS = 96
REPLACED_AT = 66
"""Rank 1's process is killed here and a new one takes its rank: it must copy the steps its
peer copies from its first commit, not every commit until the next decision (step 96)."""
KILL_AT = 79
"""Every rank killed one step before a multiple of 16, before the new generation's first
decision: whatever power-of-two cadence of 16 or more the budget chose, the newest protected
step is as far behind as that cadence allows."""


def test_the_agreed_cadence_holds_the_budget_and_its_steps_at_risk_are_true(tmp_path, ram_root):
    every_commit = sres_tiers(tmp_path, ram_root, "--protection-budget", "0", name="every", steps=STEPS)
    assert every_commit.returncode == 0, dump(every_commit)
    assert not every_commit.of("protection")  # 0: every commit, whatever it costs

    run = sres_tiers(
        tmp_path,
        ram_root,
        "--persist-every",
        "0",  # only the cadence's copies: the persistent tier's every K-th goes through RAM too
        "--node-fault-after",
        "3",  # the kill and the kill-all: two process faults on node 1, not a sick node
        "--inject",
        f"kill:rank=1:step={REPLACED_AT}",
        "--inject",
        f"kill-all:step={KILL_AT}",
        steps=STEPS,
        job="budgeted",
        persistent=tmp_path / "p",
    )
    assert run.returncode == 0, dump(run)
    assert run.digests() == every_commit.digests()  # a redone step is redone exactly

    said = [e for e in run.of("protection") if e["step"] < KILL_AT]
    assert said and said[0]["step"] == budget.WINDOW, dump(run)  # the first decision: 16 commits in
    agreed = said[-1]
    every = agreed["every"]
    assert every & (every - 1) == 0 and 1 <= every <= budget.MAX_EVERY
    assert agreed["budget"] == 0.03
    assert agreed["overhead"] <= agreed["budget"] or every == budget.MAX_EVERY, agreed
    assert agreed["steps_at_risk"] >= every - 1

    # No rank resumed without its own random streams and data positions: a new process that
    # copied other steps than its peer would leave the RAM tier without a step common to all.
    assert not run.of("inexact"), dump(run)
    # The kill-all's recovery; one "recovered" per fault seen (the kills may land in two).
    last = max(r["generation"] for r in run.of("recovered"))
    (recovered,) = {
        (r["source"], r["step"], r["steps_lost"]) for r in run.of("recovered") if r["generation"] == last
    }
    source, step, lost = recovered
    assert source == "ram", dump(run)
    assert 0 <= lost <= agreed["steps_at_risk"], (recovered, agreed)
    assert step % every == 0, (recovered, agreed)  # only the cadence's multiples were copied
