"""Zoo: an `accelerate` loop as its guide writes it: ``Accelerator.prepare`` of a small model with
dropout, AdamW, a plain ``DataLoader(shuffle=True)`` and a scheduler; ``accelerator.backward``;
``accelerator.end_training()`` at the end (it destroys the default process group).

    sres run --nodes 2 -- python -m tests.models.accelerate_loop --steps 16 --out /tmp/zoo

What a user changes for sres: ``resilience.run(train)``, ``ctx.register`` of what ``prepare``
returned (the loader through ``resumable``), ``ctx.steps`` and ``ctx.commit()``.
"""

from __future__ import annotations

import torch
from accelerate import Accelerator

import resilience
from resilience.integrations.accelerate import resumable
from tests.models import common


def main() -> None:
    args = common.parse_args(
        __doc__,
        lr=1e-2,
        flags=(("--register-prepared", "register the prepared loader itself (refused: it has no position)"),),
    )
    common.deterministic()

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        accelerator = Accelerator(cpu=True)
        model = common.classifier()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
        ddp, optimizer, data, scheduler = accelerator.prepare(
            model, optimizer, common.shuffled(args), scheduler
        )
        loader = data if args.register_prepared else resumable(data)
        ctx.register(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
        samples = common.SampleLog(ctx, args.out)
        loss = torch.tensor(float("nan"))
        batches = iter(loader)
        for step in ctx.steps(args.steps):
            batch = next(batches)
            loss = torch.nn.functional.cross_entropy(ddp(batch["x"]), batch["y"])
            accelerator.backward(loss)
            with ctx.commit():
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                samples.record(step, batch["index"])
            common.progress(ctx, step, args.steps, loss, args)
        accelerator.end_training()
        common.finish(ctx, args, model, optimizer, loss)

    resilience.run(train)


if __name__ == "__main__":
    main()
