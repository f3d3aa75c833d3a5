"""``sres run`` with checkpoint tiers: 2 simulated nodes, a private RAM root, real kills."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from tests.inprocess.conftest import Run, run_command

STEPS = 14
NODES = 2
K = 4


@pytest.fixture
def ram_root():
    """A private RAM-tier root in /dev/shm; the test must leave nothing behind in it."""
    root = Path("/dev/shm") / f"sres-test-{uuid.uuid4().hex[:8]}"
    root.mkdir()
    yield root
    shutil.rmtree(root, ignore_errors=True)


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
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        str(nodes),
        "--log-dir",
        str(log_dir),
        "--hang-timeout",
        "5",
        "--reform-timeout",
        "30",
        "--job-id",
        job,
        "--persistent-dir",
        str(persistent),
        "--persist-every",
        str(K),
        *args,
        "--",
        sys.executable,
        "-m",
        f"resilience.examples.{example}",
        "--steps",
        str(steps),
        "--out",
        str(log_dir / "out"),
        *train_args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_"))}
    env["SRES_RAM_ROOT"] = str(ram)
    env.update(env_extra or {})
    return run_command(cmd, env, log_dir, timeout)


@pytest.fixture(scope="session")
def tiers_reference(tmp_path_factory) -> dict[int, str]:
    """Final digests of a fault-free 2-node run."""
    tmp = tmp_path_factory.mktemp("tiers-reference")
    ram = Path("/dev/shm") / f"sres-test-{uuid.uuid4().hex[:8]}"
    try:
        run = sres_tiers(tmp, ram, job="reference")
        assert run.returncode == 0, run.stderr
    finally:
        shutil.rmtree(ram, ignore_errors=True)
    digests = run.digests()
    assert len(digests) == NODES and len(set(digests.values())) == 1
    return digests


def restored(run: Run) -> dict:
    events = run.of("restored")
    assert len(events) == 1, dump(run)
    return events[0]


def progress_before_kill(run: Run) -> int:
    """Last step committed by the first run (its fault event names the step it died at)."""
    return run.of("fault")[0]["step"] - 1


def dump(run: Run) -> str:
    return run.stderr[-3000:] + "\n" + "\n".join(json.dumps(e) for e in run.events)
