"""``sres chaos``'s verdict from two runs' event logs, and the options it gives a soak."""

from __future__ import annotations

import json
from pathlib import Path

from launcher.cli import chaos as chaos_cli


def _log(path: Path, *events: dict) -> Path:
    path.mkdir(parents=True)
    (path / "events.jsonl").write_text("".join(json.dumps({"t": 0.0, **e}) + "\n" for e in events))
    return path


FINISHED = {
    "event": "finished",
    "state_digests": {"0": "a", "1": "b"},
    "goodput": 0.5,
    "wall_s": 10.0,
    "steps": 9,
}


def test_identical_and_every_fault_answered_is_clean(tmp_path):
    ref = _log(tmp_path / "ref", FINISHED)
    chaos = _log(
        tmp_path / "chaos",
        {"event": "fault", "kind": "kill", "rank": 1, "generation": 1},
        {"event": "recovered", "generation": 2, "seconds": 0.5, "steps_lost": 1, "source": "peer"},
        FINISHED,
    )
    verdict, table = chaos_cli.judge({"reference": (0, ref, "j1"), "chaos": (0, chaos, "j2")})
    assert verdict.identical and verdict.clean, table
    assert "after kill" in table


def test_other_digests_a_fault_left_unanswered_or_too_many_steps_redone_are_named(tmp_path):
    ref = _log(tmp_path / "ref", FINISHED)
    chaos = _log(
        tmp_path / "chaos",
        {"event": "fault", "kind": "hang", "rank": 0, "generation": 1},
        {"event": "recovered", "generation": 2, "seconds": 0.5, "steps_lost": 3, "source": "ram"},
        {"event": "fault", "kind": "kill", "rank": 1, "generation": 2},
        {**FINISHED, "state_digests": {"0": "a", "1": "c"}},
    )
    verdict, _ = chaos_cli.judge({"reference": (0, ref, "j1"), "chaos": (0, chaos, "j2")})
    assert not verdict.identical
    assert any("without a recovery" in p for p in verdict.problems)
    assert any("redid 3 steps" in p for p in verdict.problems)


def test_a_recovery_from_the_persistent_tier_may_go_back_to_its_last_save(tmp_path):
    ref = _log(tmp_path / "ref", FINISHED)
    chaos = _log(
        tmp_path / "chaos",
        {"event": "fault", "kind": "kill", "rank": 0, "generation": 1},
        {"event": "recovered", "generation": 2, "seconds": 2.0, "steps_lost": 4, "source": "persistent"},
        FINISHED,
    )
    verdict, table = chaos_cli.judge({"reference": (0, ref, "j1"), "chaos": (0, chaos, "j2")})
    assert verdict.clean, verdict.problems
    assert "4 from the persistent tier" in table


def test_a_soak_gets_restarts_repairs_standbys_and_no_drains_for_process_faults_unless_told():
    argv = chaos_cli._with_soak_defaults(["--nodes", "4", "--", "train"], faults=25)
    assert argv[argv.index("--max-restarts") + 1] == "60" and "--repair-after" in argv
    assert int(argv[argv.index("--node-fault-after") + 1]) > 25 and argv[argv.index("--standby") + 1] == "1"
    mine = chaos_cli._with_soak_defaults(
        ["--max-restarts", "3", "--launcher", "slurm", "--standby=0", "--", "train"], faults=25
    )
    assert mine.count("--max-restarts") == 1 and "--repair-after" not in mine and "--standby" not in mine
    assert chaos_cli._without(
        ["--persistent-dir", "/x", "--nodes", "2", "--", "t", "--persistent-dir", "y"], "--persistent-dir"
    ) == ["--nodes", "2", "--", "t", "--persistent-dir", "y"]
