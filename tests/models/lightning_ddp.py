"""Zoo: a PyTorch Lightning ``Trainer`` (strategy "ddp" on CPU, gloo) fitting a small module with
dropout, AdamW and a per-step cosine schedule, on Lightning's default data path: a plain
``DataLoader(shuffle=True)`` into which Lightning injects its DistributedSampler.

    sres run --nodes 2 -- python -m tests.models.lightning_ddp --steps 16 --out /tmp/zoo

What a user changes for sres: ``resilience.run(train)``, and the Trainer's ``plugins`` and
``callbacks`` (and its ``num_nodes``/``devices`` from ``ctx.place``).
"""

from __future__ import annotations

import logging
import warnings

import lightning
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import resilience
from resilience.integrations.lightning import ResilientCallback, ResilientEnvironment
from tests.models import common


class Classifier(lightning.LightningModule):
    def __init__(self, args, samples: common.SampleLog) -> None:
        super().__init__()
        self.args, self.samples = args, samples
        self.net = common.classifier()
        self.last_loss = torch.tensor(float("nan"))
        self.seen: list[int] = []
        """The samples of the step's micro-batches so far (``--accumulate``: two a step)."""

    def on_train_batch_start(self, batch, batch_idx) -> None:
        common.step_began(self.args, self.global_rank, self.global_step)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.cross_entropy(self.net(batch["x"]), batch["y"])
        self.seen += batch["index"].tolist()
        self.last_loss = loss.detach()
        return loss

    def on_train_start(self) -> None:
        self.stepped = self.global_step  # resumed: the commit's count

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.global_step == self.stepped:
            return  # a micro-batch: the step goes on
        self.stepped = self.global_step
        self.samples.record(self.global_step - 1, self.seen)
        self.seen = []
        common.progress(self.samples.ctx, self.global_step - 1, self.args.steps, self.last_loss, self.args)
        common.step_done(self.args, self.global_rank, self.global_step - 1)

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.args.lr)
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.args.steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def sres_pieces(ctx: resilience.Context, args) -> dict:
    return {
        "plugins": [] if args.no_environment else [ResilientEnvironment(ctx)],
        "callbacks": [ResilientCallback(ctx)],
        "enable_checkpointing": False,
    }


def classic(args) -> dict:
    """Lightning's own fault tolerance (benchmarks/frameworks.py): a checkpoint every K steps,
    the next attempt resumed from the last (``ckpt_path``) by torchrun's restart."""
    every = ModelCheckpoint(dirpath=args.out / "ckpt", every_n_train_steps=args.classic_every, save_last=True)
    return {"callbacks": [every]}


def main() -> None:
    args = common.parse_args(
        __doc__,
        lr=1e-2,
        flags=(
            (
                "--stateful-loader",
                "a torchdata StatefulDataLoader(shuffle=True) (refused: Lightning wraps it)",
            ),
            ("--no-environment", "the callback without ResilientEnvironment (refused)"),
            ("--wrong-devices", "devices=2 where the generation has one rank a node (refused)"),
            ("--accumulate", "accumulate_grad_batches=2: a step is two batches"),
        ),
    )
    common.deterministic()
    logging.getLogger("lightning").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        module = Classifier(args, common.SampleLog(ctx, args.out))
        loader = StatefulDataLoader if args.stateful_loader else DataLoader
        data = loader(
            common.vectors(args.dataset_size, args.seed, dim=common.CLASSIFIER_DIM, classes=common.CLASSES),
            batch_size=args.batch,
            shuffle=True,
            drop_last=True,
        )
        trainer = lightning.Trainer(
            accelerator="cpu",
            strategy="ddp",
            num_nodes=ctx.place.num_nodes,
            devices=2 if args.wrong_devices else ctx.place.local_world_size,
            max_steps=args.steps,
            max_epochs=-1,
            accumulate_grad_batches=2 if args.accumulate else 1,
            **(classic(args) if args.classic_every else sres_pieces(ctx, args)),
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        last = args.out / "ckpt" / "last.ckpt"
        trainer.fit(module, data, ckpt_path=str(last) if args.classic_every and last.exists() else None)
        optimizer = trainer.optimizers[0]
        common.finish(ctx, args, module, optimizer, module.last_loss)

    resilience.run(train)


if __name__ == "__main__":
    main()
