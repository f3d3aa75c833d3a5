"""Runs of ``sres run`` with the example MLP: real processes, real gloo, real SIGKILLs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.observability.events import read_events
from tests.slurm_cluster import pid_alive, processes_with_env

STEPS = 14


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    log_dir: Path

    @property
    def events(self) -> list[dict]:
        return read_events(self.log_dir / "events.jsonl")

    def digests(self) -> dict[int, str]:
        out = {}
        for path in sorted((self.log_dir / "out").glob("rank*.json")):
            data = json.loads(path.read_text())
            out[data["rank"]] = data["digest"]
        return out

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["event"] == kind]


def sres_run(
    tmp: Path,
    *args: str,
    train_args: tuple[str, ...] = (),
    nodes: int = 4,
    timeout: float = 240,
    steps: int = STEPS,
    example: str = "train_mlp",
) -> Run:
    log_dir = tmp / "run"
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
        "3",
        "--reform-timeout",
        "20",
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
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_")) or k == "SRES_RAM_ROOT"
    }
    return run_command(cmd, env, log_dir, timeout)


def run_command(cmd: list[str], env: dict[str, str], log_dir: Path, timeout: float) -> Run:
    """Run ``sres run`` to its end and check that none of its processes is left behind."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    leftover = [p for p in processes_with_env(f"SRES_LOG_DIR={log_dir.resolve()}") if pid_alive(p)]
    assert not leftover, f"processes of the run still alive: {leftover}"
    return Run(proc.returncode, proc.stdout, proc.stderr, log_dir)


@pytest.fixture(scope="session")
def reference(tmp_path_factory) -> dict[int, str]:
    """Final state digests of a fault-free 4-rank run: what every faulty run must end with."""
    run = sres_run(tmp_path_factory.mktemp("reference"))
    assert run.returncode == 0, run.stderr
    digests = run.digests()
    assert len(digests) == 4 and len(set(digests.values())) == 1  # data-parallel replicas agree
    return digests


@pytest.fixture(scope="session")
def sharded_reference(tmp_path_factory) -> dict[int, str]:
    run = sres_run(tmp_path_factory.mktemp("sharded-reference"), train_args=("--sharded",))
    assert run.returncode == 0, run.stderr
    digests = run.digests()
    assert len(digests) == 4 and len(set(digests.values())) == 4  # each rank holds its own shard
    return digests


def sres(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launcher.cli", *args], capture_output=True, text=True, timeout=60
    )


def when_event(log_dir: Path, predicate, then, timeout_s: float = 180) -> threading.Thread:
    """Run ``then()`` on a thread once an event of the run matches ``predicate``."""

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        path = log_dir / "events.jsonl"
        while time.monotonic() < deadline:
            if path.exists() and any(predicate(e) for e in read_events(path)):
                then()
                return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread
