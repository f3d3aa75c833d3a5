"""Frameworks: a node's rank lost mid-run, recovered by sres in process against the framework's own
classic resume from its own checkpoint, per framework, interleaved in one run of this script.
Prints a table per framework; every number comes from this run.

Each run trains the model zoo's case of the framework on 2 ranks of this machine (Lightning:
``tests/models/lightning_ddp.py``; the Hugging Face Trainer: ``tests/models/hf_trainer.py``;
torchtitan: ``tests/models/torchtitan_llama.py``, in its own environment, tests/support/titan_env.py) for
``--steps`` steps of at least ``--sleep-s`` each, and loses rank 1 as step ``--fault-at`` begins:
  sres     ``sres run --nodes 2 --spares 1 --inject node:1:step=S``: the node's processes are
           killed, the spare takes rank 1, every rank resumes from the last commit in memory
  classic  ``torchrun`` of the framework as its users run it, with its own checkpoint every
           ``--every`` steps (Lightning ``ModelCheckpoint(every_n_train_steps)`` resumed by
           ``ckpt_path``; the Trainer ``save_steps`` resumed by ``resume_from_checkpoint``;
           torchtitan ``checkpoint.interval``, loaded by its Trainer from its folder): rank 1
           exits, torchrun ends the job, and the job is started again at once
Measured from the fault (sres: its ``fault`` event; classic: the exit) with rank 0's wall time at
the end of each step:
  back at work   the first step completed after the fault
  time lost      step S completed again (what the fault cost, redone steps included)
  steps redone   S minus the first step trained after the fault

    python benchmarks/frameworks.py [--repeat 3] [--steps 40] [--fault-at 25] [--every 10]
                                    [--frameworks lightning,hf,torchtitan]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.interleaved import interleave, table  # noqa: E402
from launcher.observability.events import read_events  # noqa: E402
from tests.support.titan_env import titan_python  # noqa: E402

MODES = ("sres", "classic")
FRAMEWORKS = {
    "lightning": ("Lightning", "lightning_ddp"),
    "hf": ("Hugging Face Trainer", "hf_trainer"),
    "torchtitan": ("torchtitan (Llama 3 debug model, HSDP replicate)", "torchtitan_llama"),
}
MEASURES = ("back at work", "time lost", "steps redone")


@dataclass(frozen=True)
class Case:
    """A zoo case as the runs start it: its module, the ranks' interpreter, its own arguments."""

    module: str
    python: str = sys.executable
    extra: tuple[str, ...] = ()


def case_of(key: str, work: Path) -> Case:
    module = FRAMEWORKS[key][1]
    if key != "torchtitan":
        return Case(module)
    python = titan_python()  # its environment (made once, from the registry)
    assets = work / "titan-assets"
    made = [python, "-m", f"tests.models.{module}", "--make-assets", "--out", str(assets)]
    subprocess.run(made, check=True, cwd=ROOT, capture_output=True, timeout=300)
    return Case(module, python, ("--assets", str(assets)))


def one_run(work: Path, mode: str, case: Case, args: argparse.Namespace) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix=f"{case.module}-{mode}-", dir=work))
    out = run_dir / "out"
    out.mkdir()
    train = ["-m", f"tests.models.{case.module}", "--steps", str(args.steps), "--out", str(out)]
    train += ["--step-times", "--sleep-s", str(args.sleep_s), *case.extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if mode == "sres":
        cmd = [sys.executable, "-m", "launcher.cli", "run", "--nodes", "2", "--spares", "1"]
        cmd += ["--log-dir", str(run_dir), "--inject", f"node:1:step={args.fault_at}", "--", case.python]
    else:
        cmd = [case.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        train += ["--classic-every", str(args.every), "--crash-at", str(args.fault_at)]
        # The job is started again, as a requeue or an auto-resume does (no queue wait counted):
        # torchrun's own --max-restarts re-forms gloo in the same store, which here failed to
        # connect its mesh in about one restart of four and then hung.
        crashed = subprocess.run(cmd + train, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        if crashed.returncode == 0:
            sys.exit(f"{case.module} {mode}: the first attempt did not crash:\n{crashed.stderr[-3000:]}")
    restarted_t = time.time()
    done = subprocess.run(cmd + train, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.exit(f"{case.module} {mode} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    # Rank 0 may still finish the step before the fault after it: that step is not back at work.
    # Counted: sres, the steps after the one recovered from; classic, those of the second attempt.
    if mode == "sres":
        events = read_events(run_dir / "events.jsonl")
        fault_t = min(e["t"] for e in events if e["event"] == "fault")
        resumed_after = min(e["step"] for e in events if e["event"] == "recovered")
        after = [s for s in steps_of(out) if s["t"] > fault_t and s["step"] > resumed_after]
    else:
        fault_t = json.loads((out / "crashed.json").read_text())["t"]
        after = [s for s in steps_of(out) if s["t"] > restarted_t]
    again = next(s for s in after if s["step"] == args.fault_at)
    return {
        "back at work": after[0]["t"] - fault_t,
        "time lost": again["t"] - fault_t,
        "steps redone": float(args.fault_at - after[0]["step"]),
    }


def steps_of(out: Path) -> list[dict]:
    """Rank 0's ``{"step", "t"}`` at the end of each step, in the order written."""
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--fault-at", type=int, default=25)
    parser.add_argument("--every", type=int, default=10, help="the classic run's checkpoint interval, steps")
    parser.add_argument("--sleep-s", type=float, default=0.05, help="simulated compute per step")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="which, comma-separated")
    args = parser.parse_args()
    tables = []
    for key in args.frameworks.split(","):
        with tempfile.TemporaryDirectory(prefix="sres-fw-case-") as work:
            case = case_of(key, Path(work))
            runs = interleave(
                MODES, args.repeat, lambda run, mode: one_run(run, mode, case, args), "sres-fw-"
            )
        tables.append(f"### {FRAMEWORKS[key][0]}\n\n{table(runs, MEASURES)}")
    print(
        f"\n{args.steps} steps of >= {args.sleep_s} s on 2 ranks; rank 1 lost as step {args.fault_at} "
        f"begins; the classic run checkpoints every {args.every} steps\n"
    )
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
