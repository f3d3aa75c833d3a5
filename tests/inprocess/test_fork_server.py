"""Ranks forked from their machine's warm fork server: the same result, without the cold start."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.sres_runs import clean_env, kill_slot, run_command, sres_command, sres_run, when_event

SLOW = ("--sleep-s", "1.0")
"""14 steps of a second: room for a fault, its recovery and a few steps after it."""


def after_first_step(log_dir: Path, then: Callable[[], None]) -> None:
    """``then()`` once the run made its first step (rank 0 printed it): its ranks, forked, train."""

    def stepped() -> None:
        log, deadline = log_dir / "ranks" / "n0p0.log", time.monotonic() + 60
        while not (log.exists() and "step" in log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        then()

    when_event(log_dir, lambda e: e["event"] == "fork-server" and e["how"] == "ready", stepped)


def test_a_killed_rank_with_no_standby_is_forked_and_the_result_is_exact(tmp_path, reference):
    log_dir = tmp_path / "run"
    after_first_step(log_dir, lambda: kill_slot(log_dir, "n2p0"))
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


def test_a_killed_fork_server_takes_its_ranks_and_they_start_cold_until_it_is_back(tmp_path, reference):
    """Locally one server holds every rank (each simulated node is this machine): its death is a
    fault of them all, recovered from memory, with the ranks started cold (a server started again
    is not waited for: what killed the last one may kill it too)."""
    log_dir = tmp_path / "run"
    after_first_step(log_dir, lambda: kill_slot(log_dir, "n0f"))
    run = sres_run(tmp_path, train_args=SLOW)
    assert run.returncode == 0, run.stderr
    assert run.digests() == reference
    replaced = run.of("replaced")
    assert sorted(e["rank"] for e in replaced) == [0, 1, 2, 3] and {e["how"] for e in replaced} == {"respawn"}
    fallbacks = run.of("fork-fallback")
    assert {e["slot"] for e in fallbacks} == {e["slot"] for e in replaced}, fallbacks
    assert all("exited" in e["why"] or "starting again" in e["why"] for e in fallbacks), fallbacks
    restarted = [e for e in run.of("fork-server") if e["how"] == "restarted"]
    assert restarted and restarted[0]["exit_code"] == -signal.SIGKILL, run.of("fork-server")


def test_a_forked_rank_does_not_import_the_scripts_heavy_modules_again(tmp_path):
    log_dir, imports = tmp_path / "run", tmp_path / "imports.txt"
    after_first_step(log_dir, lambda: kill_slot(log_dir, "n1p0"))
    cmd = sres_command(log_dir, 2, (), "tests.support.heavy_imports", 14, SLOW)
    run = run_command(cmd, clean_env(HEAVY_IMPORTS_LOG=str(imports)), log_dir, timeout=240)
    assert run.returncode == 0, run.stderr
    (replaced,) = run.of("replaced")
    assert replaced["how"] == "forked", replaced
    imported = {line.split()[0]: float(line.split()[2]) for line in imports.read_text().splitlines()}
    assert set(imported) == {"n0f"}, imported  # every rank forked, the first ones too: none ran it
    (recovered,) = run.of("recovered")
    print(
        f"transformers imported in {imported['n0f']:.2f} s; recovery by a fork {recovered['seconds']:.2f} s"
    )
    assert recovered["seconds"] < imported["n0f"], (recovered, imported)


WARMED = """
import sys
from resilience.agent.warm_up import warm_up
warm_up()
print("torch.distributed.tensor" in sys.modules, "resilience.fsdp" in sys.modules)
"""


def test_the_warm_up_imports_what_every_formation_needs():
    """Each formation clears DTensor's caches through resilience.fsdp when DTensor is loaded (the
    optimizer's step loads it). A forked replacement that imported it there spent 0.065-0.09 s
    between its group formed and its recovery, while the survivors waited for it (252 MiB
    recovery: 0.62 -> 0.52 s)."""
    done = subprocess.run([sys.executable, "-c", WARMED], capture_output=True, text=True, check=True)
    dtensor, fsdp = done.stdout.split()
    assert dtensor == "True", "the warm-up's optimizer step no longer loads DTensor: drop this test"
    assert fsdp == "True", "a forked replacement would import resilience.fsdp on its recovery path"
