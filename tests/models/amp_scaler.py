"""Zoo: `torch.autocast` (bfloat16 on CPU) with a registered `torch.amp.GradScaler` whose scale
grows every few steps; an MLP with dropout under plain DistributedDataParallel, AdamW, a
StatefulDataLoader.

    sres run --nodes 2 -- python -m tests.models.amp_scaler --steps 16 --out /tmp/zoo
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

import resilience
from tests.models import common

DIM, CLASSES = 32, 8


def build() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, 128),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 128),
        torch.nn.LayerNorm(128),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(128, CLASSES),
    )


def main() -> None:
    args = common.parse_args(__doc__)
    common.deterministic()

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        model = build()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
        loader = common.loader(common.vectors(args.dataset_size, args.seed, dim=DIM, classes=CLASSES), args)
        ctx.register(model=model, optimizer=optimizer, scaler=scaler, loader=loader)
        ddp = DistributedDataParallel(model)
        samples = common.SampleLog(ctx, args.out)
        loss = torch.tensor(float("nan"))
        it = iter(loader)
        for step in ctx.steps(args.steps):
            batch = next(it)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(ddp(batch["x"]), batch["y"])
            scaler.scale(loss).backward()
            with ctx.commit():
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                samples.record(step, batch["index"])
            common.progress(ctx, step, args.steps, loss, args)
        common.finish(ctx, args, model, optimizer, loss, scaler=scaler.state_dict())

    resilience.run(train)


if __name__ == "__main__":
    main()
