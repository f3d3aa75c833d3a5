"""What taking a commit's state costs, and what recovering ordinary loops costs.

1. The blocking cost of a commit (``ctx.commit()``'s exit and the next step boundary, where the
   random streams and every small registered object are taken and compared), median of
   ``--commits`` per rank, 4 ranks at once (processes, as ranks are), for three registrations:
     model+opt       a model and AdamW only (the parameters and moments are kept by reference)
     +rng            the same with the random streams (Python, NumPy, torch) taken at each commit
     +loop objects   + OneCycleLR, a StatefulDataLoader (2 workers), an EMA dict of the weights'
                     size, a GradScaler and a user dict: what an ordinary loop registers
   against the step itself (forward, backward, optimizer step) measured in the same processes.
2. The recovery time after a node loss (2 nodes + a spare) of each zoo case in tests/models/,
   next to the example MLP's, from the ``recovered`` event of one ``sres run`` each.

    python benchmarks/commit_capture.py [--commits 200] [--ranks 4] [--no-recovery]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from resilience.context import Context  # noqa: E402

SETS = ("model+opt", "+rng", "+loop objects")


class _Runtime:
    """The agent's hooks, doing nothing: what is timed is the Context's own taking of state."""

    def before_step(self, step: int) -> None: ...
    def before_commit(self) -> None: ...
    def after_commit(self, step: int, ctx: Context) -> None: ...
    def committed(self, step: int, ctx: Context, changed: list[str]) -> None: ...


def _objects(kind: str, model: torch.nn.Module, opt: torch.optim.Optimizer, commits: int) -> dict:
    objects: dict = {"model": model, "optimizer": opt}
    if kind == "+loop objects":
        from torchdata.stateful_dataloader import StatefulDataLoader

        objects["scheduler"] = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-3, total_steps=commits + 10)
        objects["loader"] = StatefulDataLoader(torch.arange(100_000.0), batch_size=32, num_workers=2)
        objects["ema"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        objects["scaler"] = torch.amp.GradScaler("cpu")
        objects["counters"] = {"tokens": 0, "epoch": 0}
    return objects


def _worker(rank: int, commits: int, out: "mp.Queue") -> None:
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    results = {}
    for kind in SETS:
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        objects = _objects(kind, model, opt, commits)
        ctx = Context(
            rank=rank,
            world_size=1,
            local_rank=0,
            generation=1,
            step=-1,
            runtime=_Runtime(),
            restore_rng=kind != "model+opt",
        )
        ctx.register(**objects)
        it = iter(objects["loader"]) if "loader" in objects else None
        blocked, stepped = [], []
        for step in ctx.steps(commits):
            started = time.perf_counter()
            if it is not None:
                next(it)
            model(torch.randn(32, 256)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            stepped.append(time.perf_counter() - started)
            t0 = time.perf_counter()
            with ctx.commit():
                pass
            if "counters" in objects:
                objects["scheduler"].step()  # inside a loop it would be in the commit block; same cost
                objects["counters"]["tokens"] += 32
            t1 = time.perf_counter()
            ctx.boundary()  # the next step's boundary, timed here (steps() calls it before yielding)
            blocked.append(time.perf_counter() - t1 + (t1 - t0))
        results[kind] = {
            "commit_us": statistics.median(blocked[10:]) * 1e6,
            "step_ms": statistics.median(stepped[10:]) * 1e3,
        }
    out.put((rank, results))


def capture_table(commits: int, ranks: int) -> None:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, commits, queue)) for r in range(ranks)]
    for p in procs:
        p.start()
    results = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    print(
        f"\nBlocking cost of a commit: median of {commits - 10} commits, {ranks} ranks at once (max over "
        "ranks)"
    )
    print(f"{'registered':<16}{'commit (us)':>14}{'step (ms)':>12}{'commit/step':>14}")
    for kind in SETS:
        commit = max(results[r][kind]["commit_us"] for r in results)
        step = max(results[r][kind]["step_ms"] for r in results)
        print(f"{kind:<16}{commit:>14.0f}{step:>12.2f}{commit / (step * 1e3):>13.1%}")
    base = max(results[r]["model+opt"]["commit_us"] for r in results)
    for kind in SETS[1:]:
        added = max(results[r][kind]["commit_us"] for r in results) - base
        print(f"added by {kind:<14} {added:>8.0f} us per commit (target < 1000)")


CASES = {"mlp (example)": ("-m", "resilience.examples.train_mlp")}


def _zoo() -> dict[str, tuple[str, ...]]:
    cases = dict(CASES)
    for path in sorted((ROOT / "tests" / "models").glob("*.py")):
        if path.stem not in ("__init__", "conftest", "common") and not path.stem.startswith("test_"):
            cases[path.stem] = ("-m", f"tests.models.{path.stem}")
    return cases


def recovery_table(steps: int) -> None:
    print(f"\nRecovery after a node loss at step {steps // 2}: 2 nodes + 1 spare, one run each")
    print(
        f"{'case':<22}{'recovered (s)':>15}{'release':>9}{'re-form':>9}{'transfer':>10}"
        f"{'1st step':>10}{'exact':>7}"
    )
    for name, module in _zoo().items():
        with tempfile.TemporaryDirectory() as tmp:
            log_dir = Path(tmp) / "run"
            cmd = [
                sys.executable,
                "-m",
                "launcher.cli",
                "run",
                "--nodes",
                "2",
                "--spares",
                "1",
                "--log-dir",
                str(log_dir),
                "--inject",
                f"node:1:step={steps // 2}",
                "--",
                sys.executable,
                *module,
                "--steps",
                str(steps),
                "--out",
                str(log_dir / "out"),
            ]
            env = {k: v for k, v in os.environ.items() if not k.startswith(("SRES_", "SLURM_"))}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
            events = (
                [json.loads(line) for line in (log_dir / "events.jsonl").read_text().splitlines()]
                if (log_dir / "events.jsonl").exists()
                else []
            )
            rec = next((e for e in events if e["event"] == "recovered"), None)
            if proc.returncode != 0 or rec is None:
                print(f"{name:<22}{'failed':>15}  {proc.stderr.strip().splitlines()[-1:]}")
                continue
            exact = "no" if any(e["event"] == "inexact" for e in events) else "yes"
            print(
                f"{name:<22}{rec['seconds']:>15.2f}{rec['release_s']:>9.2f}{rec['reform_s']:>9.2f}"
                f"{rec['transfer_s']:>10.2f}{rec['first_step_s']:>10.2f}{exact:>7}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=16, help="steps of each recovery run")
    parser.add_argument("--no-recovery", action="store_true", help="only the commit cost")
    args = parser.parse_args()
    capture_table(args.commits, args.ranks)
    if not args.no_recovery:
        recovery_table(args.steps)


if __name__ == "__main__":
    main()
