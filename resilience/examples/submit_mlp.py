"""The example MLP submitted from Python with submitit (``launcher.submitit.ResilientExecutor``).

    python -m resilience.examples.submit_mlp --nodes 3 --spares 1 --inject node:1:step=8

submits ``train`` (on Slurm when ``sbatch`` is here, else on this machine), waits, and prints
rank 0's return value (the final state digest) and the faults and recoveries the run went
through. The same ``train(ctx, ...)`` runs under ``sres run`` unchanged.
"""

from __future__ import annotations

import argparse
import time

import torch

import resilience
from resilience.examples.train_mlp import batch_for, build_model


def train(ctx: resilience.Context, steps: int = 20, width: int = 256, sleep_s: float = 0.0) -> str:
    """Train the example MLP for ``steps`` steps; return the final state digest."""
    torch.set_num_threads(1)
    model = build_model(width, 2, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ctx.register(model=model, optimizer=opt)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if ctx.world_size > 1 else model
    for step in ctx.steps(steps):
        x, y = batch_for(step, ctx.rank, width, 16, seed=0)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        with ctx.commit():
            opt.step()
            opt.zero_grad()
        time.sleep(sleep_s)
    return ctx.state_digest()


def main() -> None:
    from launcher.submitit import ResilientExecutor

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", default="sres-runs/submitit/%j")
    parser.add_argument("--cluster", choices=["slurm", "local"], default=None)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--spares", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--inject", action="append", default=[], help="a fault, as sres run --inject")
    args = parser.parse_args()
    executor = ResilientExecutor(folder=args.folder, cluster=args.cluster)
    executor.update_parameters(
        nodes=args.nodes, spares=args.spares, timeout_min=30, inject=args.inject, no_tiers=True
    )
    job = executor.submit(train, args.steps, 256, 0.1)
    print(f"submitted job {job.job_id} ({executor.cluster}); logs in {job.paths.folder}")
    print(f"result (rank 0's final state digest): {job.result()}")
    for event in job.events():
        if event["event"] in ("fault", "recovered", "finished", "failed"):
            print({k: v for k, v in event.items() if k != "t"})


if __name__ == "__main__":
    main()
