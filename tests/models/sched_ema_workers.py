"""Zoo: AdamW + OneCycleLR + gradient clipping + an EMA copy of the weights
(`AveragedModel` with an EMA average) + a StatefulDataLoader with 2 worker processes; an MLP
with dropout under plain DistributedDataParallel.

    sres run --nodes 2 -- python -m tests.models.sched_ema_workers --steps 16 --out /tmp/zoo
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import OneCycleLR
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

import resilience
from tests.models import common

DIM, CLASSES = 32, 8


def build() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(DIM, 128),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(128, 128),
        torch.nn.GELU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(128, CLASSES),
    )


def main() -> None:
    args = common.parse_args(
        __doc__,
        lr=3e-3,
        flags=(
            ("--after-commit", "step the scheduler and the EMA after the commit block, as many loops do"),
        ),
    )
    common.deterministic()

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        model = build()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
        scheduler = OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.25)
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        loader = common.loader(
            common.vectors(args.dataset_size, args.seed, dim=DIM, classes=CLASSES), args, num_workers=2
        )
        ctx.register(model=model, optimizer=optimizer, scheduler=scheduler, ema=ema, loader=loader)
        ddp = DistributedDataParallel(model)
        samples = common.SampleLog(ctx, args.out)
        loss = torch.tensor(float("nan"))
        it = iter(loader)
        for step in ctx.steps(args.steps):
            batch = next(it)
            loss = torch.nn.functional.cross_entropy(ddp(batch["x"]), batch["y"])
            loss.backward()
            with ctx.commit():
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
                optimizer.step()
                if not args.after_commit:
                    scheduler.step()
                    ema.update_parameters(model)
                optimizer.zero_grad()
                samples.record(step, batch["index"])
            if args.after_commit:
                scheduler.step()
                ema.update_parameters(model)
            common.progress(ctx, step, args.steps, loss, args)
        common.finish(
            ctx, args, model, optimizer, loss, ema=ema.state_dict(), scheduler=scheduler.state_dict()
        )

    resilience.run(train)


if __name__ == "__main__":
    main()
