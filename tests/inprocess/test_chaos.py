"""A seeded random fault schedule (``--inject random:...``) on the example MLP, tiers on, data-
parallel and sharded: every fault recovered, and the run ends with the fault-free state."""

from __future__ import annotations

import json

import pytest

from resilience.agent import fault_schedule
from tests.inprocess.conftest import sres_run

STEPS = 40
SCHEDULE = "random:seed=5:every=5:kinds=kill,raise,hang,kill-during-commit,node,kill-all:to=36"


@pytest.mark.parametrize("sharded", [False, True], ids=["ddp", "sharded"])
def test_random_faults_of_every_kind_end_with_the_fault_free_state(tmp_path, sharded):
    train = ("--sharded",) if sharded else ()
    reference = sres_run(tmp_path / "reference", steps=STEPS, train_args=train)
    assert reference.returncode == 0, reference.stderr
    run = sres_run(tmp_path / "chaos", "--spares", "1", "--inject", SCHEDULE, steps=STEPS, train_args=train,
                   timeout=420)
    assert run.returncode == 0, run.stderr

    scheduled, _ = fault_schedule.injections_from([SCHEDULE], world_size=4)
    recorded = json.loads((run.log_dir / "fault-schedule.json").read_text())
    assert recorded["injections"] == [i.spec for i in scheduled]  # the seed replays this exact schedule
    assert {i.kind for i in scheduled} == {"kill", "raise", "hang", "kill-during-commit", "node", "kill-all"}
    assert "random faults (seed 5, one per 5 steps)" in run.stderr

    faults, recovered = run.of("fault"), run.of("recovered")
    assert len(faults) >= len(scheduled) and len(recovered) == len(faults), run.stderr
    assert max(r["steps_lost"] for r in recovered) <= 1
    (finished,) = run.of("finished")
    (expected,) = reference.of("finished")
    assert finished["state_digests"] == expected["state_digests"] and len(set(expected["state_digests"].values())) \
        == (4 if sharded else 1)
    assert run.digests() == reference.digests()
