"""A training loop as people write it for a GPU: the GPU suite's workload under ``sres run``.

An MLP with dropout on the device (so the CUDA random stream is part of what must come back
exactly), AdamW, torch's own DDP with ``device_ids`` or FSDP2's ``fully_shard``, data drawn
from a seeded CPU generator by (step, rank). Each rank writes ``<out>/rank<R>.json`` (the
examples' format: the state digest the tests compare) and, at the first step of every entry
into ``train``, a line of device memory to ``<out>/memory<R>.jsonl``: a generation that leaks
a communicator or a buffer shows as growth from one line to the next.

On a machine without CUDA it runs on the CPU with gloo (the suite's CPU stand-in: the same loop,
the same recovery path, no device).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

import resilience
from resilience.examples import outputs


def device_for(ctx: resilience.Context) -> torch.device:
    """One GPU per rank; every rank on GPU 0 where the machine has one (a spare waits there
    too: NCCL refuses two ranks of one group on one device, never a process that is not in it)."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = ctx.local_rank if torch.cuda.device_count() > ctx.local_rank else 0
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def build(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    layers: list[torch.nn.Module] = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.GELU(), torch.nn.Dropout(0.1)]
    layers.append(torch.nn.Linear(args.width, args.width))
    return torch.nn.Sequential(*layers).to(device)


def wrap(model: torch.nn.Module, args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        return fully_shard(model)
    if not dist.is_initialized():
        return model
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)


def memory_line(ctx: resilience.Context, step: int, device: torch.device) -> dict:
    """Device memory as this process and the driver see it."""
    line: dict = {"generation": ctx.generation, "step": step}
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        line.update(
            allocated=torch.cuda.memory_allocated(device),
            reserved=torch.cuda.memory_reserved(device),
            device_used=total - free,
        )
    return line


def train(ctx: resilience.Context, args: argparse.Namespace) -> None:
    device = device_for(ctx)
    model = build(args, device)
    # FSDP2 shards the parameters in place: the optimizer is built over the sharded ones.
    wrapped = wrap(model, args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ctx.register(model=model, optimizer=opt)
    clock = outputs.StepClock()
    loss = torch.tensor(float("nan"))
    first = True
    for step in ctx.steps(args.steps):
        if first and args.out is not None:
            args.out.mkdir(parents=True, exist_ok=True)
            with open(args.out / f"memory{ctx.rank}.jsonl", "a") as f:
                f.write(json.dumps(memory_line(ctx, step, device)) + "\n")
            first = False
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + ctx.rank)
        x = torch.randn(args.batch, args.width, generator=g).to(device)
        loss = torch.nn.functional.mse_loss(wrapped(x), torch.sin(x))
        loss.backward()
        with ctx.commit():
            opt.step()
            opt.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the step's time is the device's, not its launch
        clock.tick()
        outputs.progress(ctx, step, args.steps, loss, args.progress_every)
    if args.out is not None:
        nvml_check = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")  # what sres gave the fork server
        outputs.write_result(args.out, ctx, loss.cpu(), clock, {}, device=str(device), nvml_check=nvml_check)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--fsdp", action="store_true", help="FSDP2 fully_shard instead of DDP")
    parser.add_argument("--progress-every", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    torch.use_deterministic_algorithms(True, warn_only=True)  # with CUBLAS_WORKSPACE_CONFIG (cuda_runs.env)
    resilience.run(lambda ctx: train(ctx, args), backend=backend)


if __name__ == "__main__":
    main()
