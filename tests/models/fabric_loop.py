"""Zoo: a ``lightning.Fabric`` loop as its guide writes it (strategy "ddp" on CPU, gloo): a small model
with dropout, AdamW, a cosine schedule, a plain ``DataLoader(shuffle=True)`` through
``fabric.setup_dataloaders`` (Fabric injects its DistributedSampler), ``fabric.backward``.

    sres run --nodes 2 -- python -m tests.models.fabric_loop --steps 16 --out /tmp/zoo

What a user changes for sres: ``resilience.run(train)``, ``ResilientEnvironment(ctx)`` in the
Fabric's plugins, ``ctx.register`` (the loader through ``resumable``), ``ctx.steps`` and
``ctx.commit()``.
"""

from __future__ import annotations

import logging

import lightning
import torch

import resilience
from resilience.integrations.lightning import ResilientEnvironment, resumable
from tests.models import common


def main() -> None:
    args = common.parse_args(
        __doc__,
        lr=1e-2,
        flags=(("--register-fabric-loader", "register Fabric's loader itself (refused: no position)"),),
    )
    common.deterministic()
    logging.getLogger("lightning").setLevel(logging.ERROR)

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        fabric = lightning.Fabric(
            accelerator="cpu",
            strategy="ddp",
            num_nodes=ctx.place.num_nodes,
            devices=ctx.place.local_world_size,
            plugins=[ResilientEnvironment(ctx)],
        )
        fabric.launch()  # sres started the processes: this only sets the strategy up
        model = common.classifier()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
        ddp, optimizer = fabric.setup(model, optimizer)
        data = fabric.setup_dataloaders(common.shuffled(args))
        loader = data if args.register_fabric_loader else resumable(data)
        ctx.register(model=model, optimizer=optimizer, scheduler=scheduler, loader=loader)
        samples = common.SampleLog(ctx, args.out)
        loss = torch.tensor(float("nan"))
        batches = iter(loader)
        for step in ctx.steps(args.steps):
            batch = next(batches)
            loss = torch.nn.functional.cross_entropy(ddp(batch["x"]), batch["y"])
            fabric.backward(loss)
            with ctx.commit():
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                samples.record(step, batch["index"])
            common.progress(ctx, step, args.steps, loss, args)
        common.finish(ctx, args, model, optimizer, loss)

    resilience.run(train)


if __name__ == "__main__":
    main()
