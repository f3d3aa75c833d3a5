"""Runs of the model zoo (``tests/models/<case>.py``) under ``sres run``: 2 simulated nodes;
fault-free references made once per session, when a test first needs one."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.sres_runs import Run, clean_env, run_command, sres_command

CASES = ("gpt2_ddp", "bert_mlm", "sched_ema_workers", "fsdp2_hf", "amp_scaler")
STEPS = 18
NODES = 2
FAULTS = (
    "--spares",
    "1",
    "--standby",
    "1",
    "--inject",
    "kill:rank=1:step=5",  # a process kill: node 1's standby takes rank 1 over
    "--inject",
    "node:1:step=9",  # a node loss: the spare node takes rank 1
    "--inject",
    "kill-all:step=13",  # every rank at once: the RAM tier serves the restart
)
"""Each fault kind of the zoo, in one run. Node 1 takes the kill and is then lost, so no node
counts two process faults (``--node-fault-after``: it would be drained, with no spare left)."""


@dataclass
class ZooRun(Run):
    def finals(self) -> dict[int, dict]:
        """rank -> its ``rank<R>.json``."""
        out = {}
        for path in sorted((self.log_dir / "out").glob("rank*.json")):
            data = json.loads(path.read_text())
            out[data["rank"]] = data
        return out

    def sample_lines(self) -> dict[int, list[dict]]:
        """rank -> every line of its ``samples-rank<R>.jsonl``, in the order written."""
        paths = sorted((self.log_dir / "out").glob("samples-rank*.jsonl"))
        return {
            int(p.stem.removeprefix("samples-rank")): [
                json.loads(line) for line in p.read_text().splitlines()
            ]
            for p in paths
        }

    def trained(self) -> dict[tuple[int, int], list[int]]:
        """(rank, step) -> the samples that rank trained at that step: the last line written for
        it (a step redone after a rollback is written again)."""
        return {
            (rank, line["step"]): line["samples"]
            for rank, lines in self.sample_lines().items()
            for line in lines
        }

    def tail(self) -> str:
        return self.stderr[-4000:]


def zoo_run(
    tmp: Path,
    case: str,
    *args: str,
    name: str = "run",
    steps: int = STEPS,
    timeout: float = 420,
    train_args: tuple[str, ...] = (),
    python: str = sys.executable,
) -> ZooRun:
    log_dir = tmp / name
    module = f"tests.models.{case}"
    cmd = sres_command(
        log_dir, NODES, args, module, steps, train_args, hang_timeout=5, reform_timeout=30, python=python
    )
    run = run_command(cmd, clean_env(), log_dir, timeout)
    return ZooRun(run.returncode, run.stdout, run.stderr, run.log_dir)


class References:
    """Fault-free runs of each case, made once per session when a test first needs one."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory, self.runs = factory, {}

    def __call__(self, case: str) -> ZooRun:
        if case not in self.runs:
            run = zoo_run(self.factory.mktemp(f"ref-{case}"), case)
            if run.returncode != 0 or set(run.finals()) != set(range(NODES)):
                pytest.fail(
                    f"the fault-free run of {case} failed ({run.returncode}):\n{run.tail()}", pytrace=False
                )
            self.runs[case] = run
        return self.runs[case]
