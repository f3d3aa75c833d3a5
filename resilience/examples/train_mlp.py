"""A deterministic MLP trained with DDP: the demo's and the tests' workload.

Data is a function of (seed, step, rank), so a run with faults must end with exactly the
parameters of a run without them. Each rank writes its final state digest to
``<out>/rank<R>.json``.

    sres run --nodes 4 --spares 1 -- python -m resilience.examples.train_mlp --steps 50 --out /tmp/run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

import resilience


def build_model(width: int, depth: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.Linear(width, width))
    return torch.nn.Sequential(*layers)


def batch_for(step: int, rank: int, width: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(batch, width, generator=g)
    return x, torch.sin(x)


def state_mb(width: int, depth: int) -> float:
    """Parameters plus AdamW's two moments, in MiB."""
    params = (depth + 1) * (width * width + width)
    return params * 4 * 3 / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--sharded", action="store_true", help="ZeRO-1 optimizer (resilience.ShardedOptimizer)")
    parser.add_argument("--fail-always", action="store_true", help="raise on every entry (tests give-up)")
    parser.add_argument("--progress-every", type=int, default=10)
    parser.add_argument("--sleep-s", type=float, default=0.0, help="extra seconds per step (slow runs for tests)")
    parser.add_argument("--out", type=Path, default=None, help="write rank<R>.json with the final digest here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    def train(ctx: resilience.Context) -> None:
        if args.fail_always:
            raise ValueError("this train function always fails")
        model = build_model(args.width, args.depth, args.seed)
        if args.sharded:
            opt = resilience.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=args.lr)
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        ctx.register(model=model, optimizer=opt)
        ddp = resilience.ddp(model) if dist.is_initialized() else model
        loss = torch.tensor(float("nan"))
        step_times: list[float] = []
        last = time.perf_counter()
        for step in ctx.steps(args.steps):
            x, y = batch_for(step, ctx.rank, args.width, args.batch, args.seed)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            with ctx.commit():
                opt.step()
                opt.zero_grad()
            if args.sleep_s:
                time.sleep(args.sleep_s)
            now = time.perf_counter()
            step_times.append(now - last)
            last = now
            if ctx.rank == 0 and (step % args.progress_every == 0 or step == args.steps - 1):
                print(f"step {step:4d}/{args.steps}  loss {loss.item():.6f}  gen {ctx.generation}", flush=True)
        if args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / f"rank{ctx.rank}.json").write_text(json.dumps({
                "rank": ctx.rank, "digest": ctx.state_digest(), "loss": loss.item(), "step": ctx.step,
                "generation": ctx.generation, "pid": os.getpid(),
                # Steady state: the first steps of a generation pay for warm-up and re-entry.
                "median_step_s": statistics.median(step_times[2:]) if len(step_times) > 4 else None,
            }))

    resilience.run(train)


if __name__ == "__main__":
    main()
