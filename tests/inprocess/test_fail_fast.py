"""A deterministic error stops the run at its second occurrence; a one-off error is retried.

The training script raises the same ``ValueError`` at chosen steps: at step 5 in every
generation (deterministic: the run must stop at the second time, with one line and the
traceback once), or at other steps each time (retried as today, the run finishes).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.sres_runs import Run, run_command

TRAIN = """
import argparse

import torch
import torch.distributed as dist

import resilience

parser = argparse.ArgumentParser()
parser.add_argument("--at", nargs="*", default=[], help="STEP (every generation) or GEN:STEP")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--log", required=True)
args = parser.parse_args()


def due(generation, step):
    for spec in args.at:
        gen, _, at = spec.rpartition(":")
        if int(at) == step and (not gen or int(gen) == generation):
            return True
    return False


def train(ctx):
    state = {"sum": 0.0}
    ctx.register(state=state)
    for step in ctx.steps(args.steps):
        x = torch.ones(1)
        dist.all_reduce(x)  # the ranks go step by step together
        if due(ctx.generation, step):
            with open(args.log, "a") as f:
                f.write(f"{ctx.rank} {ctx.generation} {step}\\n")
            raise ValueError("bad batch")
        with ctx.commit():
            state["sum"] += x.item()


resilience.run(train)
"""


def run_raising(tmp: Path, *at: str, steps: int = 10) -> tuple[Run, list[tuple[int, int, int]]]:
    """``sres run`` on 2 nodes of the script above; also (rank, generation, step) of every raise."""
    script, log, log_dir = tmp / "train_raising.py", tmp / "raised.txt", tmp / "run"
    script.write_text(TRAIN)
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        "2",
        "--log-dir",
        str(log_dir),
        "--hang-timeout",
        "10",  # none is injected: 3 s saw a rank of a loaded CI machine as hung (a third fault)
        "--reform-timeout",
        "20",
        "--",
        sys.executable,
        str(script),
        "--steps",
        str(steps),
        "--log",
        str(log),
        "--at",
        *at,
    ]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_")) or k == "SRES_RAM_ROOT"
    }
    run = run_command(cmd, env, log_dir, timeout=180)
    raised = (
        [tuple(int(v) for v in line.split()) for line in log.read_text().splitlines()] if log.exists() else []
    )
    return run, raised


def test_the_same_error_at_the_same_step_stops_the_run_at_its_second_occurrence(tmp_path):
    run, raised = run_raising(tmp_path, "5")
    assert run.returncode == 1, run.stderr
    # Raised in generations 1 and 2 only: nothing was retried after the second time.
    assert {(generation, step) for _, generation, step in raised} == {(1, 5), (2, 5)}, raised
    faults = run.of("fault")
    assert [(f["kind"], f.get("recurred", False)) for f in faults] == [
        ("exception", False),
        ("exception", True),
    ]
    assert [e["generation"] for e in run.of("generation")] == [1, 2]
    lines = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, run.stderr
    assert lines[0].endswith(
        "raised ValueError: bad batch at step 5 again after recovering from it: "
        "the error is deterministic; not retrying"
    ), lines
    assert run.stderr.count("Traceback (most recent call last)") == 1
    assert 'raise ValueError("bad batch")' in run.stderr[run.stderr.index("Traceback") :]
    (failed,) = run.of("failed")
    assert failed["error_type"] == "ValueError" and "again after recovering" in failed["reason"]
    assert not run.of("finished")


def test_the_same_error_at_another_step_each_time_is_retried(tmp_path):
    run, raised = run_raising(tmp_path, "1:5", "2:6")
    assert run.returncode == 0, run.stderr
    assert {(generation, step) for _, generation, step in raised} == {(1, 5), (2, 6)}
    assert [f.get("recurred", False) for f in run.of("fault")] == [False, False]
    (finished,) = run.of("finished")
    assert finished["steps"] == 10 and finished["faults"] == 2


PLAIN_LOADER = """
import torch
import resilience


def train(ctx):
    model = torch.nn.Linear(2, 1)
    loader = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=2)
    ctx.register(model=model, loader=loader)
    for step in ctx.steps(4):
        with ctx.commit():
            print("trained step", step, flush=True)


resilience.run(train)
"""


def test_a_plain_dataloader_registered_stops_the_run_at_once_with_one_line(tmp_path):
    script, log_dir = tmp_path / "train_plain_loader.py", tmp_path / "run"
    script.write_text(PLAIN_LOADER)
    cmd = [
        sys.executable,
        "-m",
        "launcher.cli",
        "run",
        "--nodes",
        "2",
        "--log-dir",
        str(log_dir),
        "--hang-timeout",
        "3",
        "--",
        sys.executable,
        str(script),
    ]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_")) or k == "SRES_RAM_ROOT"
    }
    run = run_command(cmd, env, log_dir, timeout=120)
    assert run.returncode == 1
    lines = [line for line in run.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "plain DataLoader" in lines[0] and "StatefulDataLoader" in lines[0], run.stderr
    assert "Traceback" not in run.stderr
    assert [e["generation"] for e in run.of("generation")] == [1]  # not retried
    assert not any("trained step" in p.read_text() for p in (log_dir / "ranks").iterdir())
