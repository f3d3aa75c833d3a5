"""``sres run`` with checkpoint tiers: 2 simulated nodes, a RAM root of the test's own, a
persistent dir every K commits."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.sres_runs import Run, clean_env, run_command, sres_command

STEPS = 14
NODES = 2
K = 4


def sres_tiers(
    tmp: Path,
    ram: Path,
    *args: str,
    name: str = "run",
    job: str = "tiers",
    nodes: int = NODES,
    steps: int = STEPS,
    train_args: tuple[str, ...] = (),
    persistent: Path | None = None,
    timeout: float = 240,
    env_extra: dict | None = None,
    example: str = "train_mlp",
) -> Run:
    log_dir = tmp / name
    persistent = persistent or tmp / "persistent"
    tier_args = ("--job-id", job, "--persistent-dir", str(persistent), "--persist-every", str(K), *args)
    module = f"resilience.examples.{example}"
    cmd = sres_command(
        log_dir, nodes, tier_args, module, steps, train_args, hang_timeout=5, reform_timeout=30
    )
    env = clean_env(SRES_RAM_ROOT=str(ram), **(env_extra or {}))
    return run_command(cmd, env, log_dir, timeout)


def restored(run: Run) -> dict:
    events = run.of("restored")
    assert len(events) == 1, dump(run)
    return events[0]


def progress_before_kill(run: Run) -> int:
    """Last step committed by the first run (its fault event names the step it died at)."""
    return run.of("fault")[0]["step"] - 1


def dump(run: Run) -> str:
    return run.stderr[-3000:] + "\n" + "\n".join(json.dumps(e) for e in run.events)
