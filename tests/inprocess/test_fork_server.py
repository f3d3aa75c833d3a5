"""Ranks forked from their machine's warm fork server: the same result, without the cold start."""

from __future__ import annotations

import signal
import time

from tests.support.sres_runs import clean_env, kill_slot, run_command, sres_command, sres_run, when_event

SLOW = ("--sleep-s", "1.0")
"""14 steps of a second: the fork server (started after the first step) is warm well before the end."""


def _ready(event: dict) -> bool:
    return event["event"] == "fork-server" and event["how"] == "ready"


def test_a_killed_rank_with_no_standby_is_forked_and_the_result_is_exact(tmp_path, reference):
    log_dir = tmp_path / "run"
    when_event(log_dir, _ready, lambda: kill_slot(log_dir, "n2p0"))
    run = sres_run(tmp_path, train_args=SLOW)
    assert run.returncode == 0, run.stderr
    assert run.digests() == reference
    ((fault,), (replaced,)) = run.of("fault"), run.of("replaced")
    assert (fault["kind"], fault["rank"]) == ("kill", 2)
    assert (replaced["rank"], replaced["how"]) == (2, "forked"), replaced
    assert not run.of("fork-fallback")
    (recovered,) = run.of("recovered")
    assert recovered["seconds"] < 5.0, recovered  # a cold start alone takes seconds here
    assert (log_dir / "ranks" / f"{replaced['slot']}.log").exists()


def test_with_its_fork_server_killed_a_later_fault_recovers_cold_and_says_so(tmp_path, reference):
    log_dir = tmp_path / "run"

    def kill_server_then_a_rank() -> None:
        kill_slot(log_dir, "n0f")
        time.sleep(0.3)
        kill_slot(log_dir, "n1p0")

    when_event(log_dir, _ready, kill_server_then_a_rank)
    run = sres_run(tmp_path, train_args=SLOW)
    assert run.returncode == 0, run.stderr
    assert run.digests() == reference
    (replaced,) = run.of("replaced")
    assert (replaced["rank"], replaced["how"]) == (1, "respawn"), replaced
    (fallback,) = run.of("fork-fallback")
    assert fallback["slot"] == replaced["slot"], fallback
    assert "exited" in fallback["why"] or "warming" in fallback["why"], fallback
    restarted = [e for e in run.of("fork-server") if e["how"] == "restarted"]
    assert restarted and restarted[0]["exit_code"] == -signal.SIGKILL, run.of("fork-server")


def test_a_forked_rank_does_not_import_the_scripts_heavy_modules_again(tmp_path):
    log_dir, imports = tmp_path / "run", tmp_path / "imports.txt"
    when_event(log_dir, _ready, lambda: kill_slot(log_dir, "n1p0"))
    cmd = sres_command(log_dir, 2, (), "tests.support.heavy_imports", 14, SLOW)
    run = run_command(cmd, clean_env(HEAVY_IMPORTS_LOG=str(imports)), log_dir, timeout=240)
    assert run.returncode == 0, run.stderr
    (replaced,) = run.of("replaced")
    assert replaced["how"] == "forked", replaced
    imported = {line.split()[0]: float(line.split()[2]) for line in imports.read_text().splitlines()}
    assert set(imported) == {"n0p0", "n1p0", "n0f"}, imported  # the forked rank ran none of it
    (recovered,) = run.of("recovered")
    print(
        f"transformers imported in {imported['n0f']:.2f} s; recovery by a fork {recovered['seconds']:.2f} s"
    )
    assert recovered["seconds"] < imported["n0f"], (recovered, imported)
