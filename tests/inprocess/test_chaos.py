"""``sres chaos`` on the example MLP, tiers on, data-parallel and sharded: 25 seeded random
faults of every kind, every one recovered, the final state of every rank identical to the
fault-free run's, and nothing of either run left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

FAULTS = 25
KINDS = "kill,raise,hang,kill-during-commit,node,kill-all,corrupt-ram,kill-during-transfer"


@pytest.mark.parametrize("sharded", [False, True], ids=["ddp", "sharded"])
def test_sres_chaos_25_random_faults_identical_and_clean(tmp_path, sharded):
    kinds = KINDS + (",kill-during-copy" if sharded else "")
    cmd = [sys.executable, "-m", "launcher.cli", "chaos", "--faults", str(FAULTS), "--seed", "5", "--every", "4",
           "--kinds", kinds, "--log-dir", str(tmp_path), "--",
           "--nodes", "4", "--spares", "1", "--hang-timeout", "3", "--reform-timeout", "20", "--",
           sys.executable, "-m", "resilience.examples.train_mlp", "--steps", "100", "--progress-every", "1000",
           *(("--sharded",) if sharded else ())]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_"))}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "identical              yes" in done.stdout and "clean                  yes" in done.stdout, done.stdout
    schedule = json.loads((tmp_path / "chaos" / "fault-schedule.json").read_text())["injections"]
    # Seed 5 draws every kind; a paired kind brings its partner at the same step.
    assert len({s.rsplit("step=", 1)[1] for s in schedule}) == FAULTS
    assert {s.split(":")[0] for s in schedule} == set(kinds.split(","))
    faults = [json.loads(line) for line in (tmp_path / "chaos" / "events.jsonl").read_text().splitlines()
              if '"event": "fault"' in line]
    assert len(faults) >= FAULTS  # every scheduled fault fired (a whole-node or all-rank one counts per rank)
