"""Zoo: torchtitan's own Trainer (as ``ResilientTrainer``) training its Llama 3 debug model on its
default data path (its Hugging Face text dataset, packed into sequences, re-looped each epoch with
a shuffle; its ``ParallelAwareDataloader``), its AdamW and warm-up/decay schedule, on the
data-parallel replicate path (HSDP: ``data_parallel_replicate_degree`` = world size, shard 1).

    python -m tests.models.torchtitan_llama --make-assets /tmp/titan
    sres run --nodes 2 -- python -m tests.models.torchtitan_llama --assets /tmp/titan --out /tmp/zoo

It needs torchtitan (``pip install 'slurm-resilience[torchtitan]'``), in an environment of its
own: torchtitan 0.3.0 pins ``datasets<4.8``, whose ``huggingface-hub<2`` transformers 5 refuses.
torchtitan trains on accelerators only; :mod:`tests.models.titan_cpu` lets it run here on CPU
(the test suite has no GPU). What a user changes for sres: ``resilience.run(train)``, and
``ResilientTrainer(ctx, config)`` for ``config.build()``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
from pathlib import Path

import torch.distributed as dist

import resilience
from tests.models import common

WORDS, VOCAB = 300, 512


def make_assets(root: Path, documents: int, seed: int = 0) -> None:
    """A tokenizer (BPE, trained here) and a dataset of ``documents`` short texts, as torchtitan
    reads them from disk (``hf_assets_path``, a dataset directory): nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(WORDS)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(10, 60))) for _ in range(documents)]
    (root / "tokenizer").mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials))
    tokenizer.save(str(root / "tokenizer" / "tokenizer.json"))
    (root / "tokenizer" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": specials[1], "eos_token": specials[2]})
    )
    with (root / "data" / "train.jsonl").open("w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")


def row_ids(inputs) -> list[int]:
    """A sample's identity: its tokens' hash (a packed sequence has no index of its own)."""
    return [int.from_bytes(hashlib.sha256(row.numpy().tobytes()).digest()[:7], "big") for row in inputs]


def config(args: argparse.Namespace, world_size: int):
    from datasets import load_dataset
    from torchtitan.components.optimizer import default_adamw
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets import text_datasets
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    text_datasets.DATASETS["zoo"] = DatasetConfig(
        path=str(args.assets / "data"),
        loader=lambda path: load_dataset(path, split="train"),
        sample_processor=lambda sample: sample["text"],
    )
    c = llama3_debugmodel()
    c.hf_assets_path = str(args.assets / "tokenizer")
    c.dataloader.dataset = "zoo"
    c.training.seq_len = 32
    c.training.local_batch_size = args.batch
    c.training.steps = args.steps
    c.optimizer = default_adamw(lr=args.lr)
    c.activation_checkpoint = None
    c.validator.enable = False
    c.checkpoint.enable = bool(args.classic_every) or args.own_checkpoints
    c.checkpoint.interval = args.classic_every or 5
    c.checkpoint.folder = "checkpoint"
    c.metrics.log_freq = 1000
    c.debug.seed = args.seed
    c.dump_folder = str(args.out / "titan")
    c.parallelism.data_parallel_replicate_degree = 1 if args.fsdp else world_size
    c.parallelism.data_parallel_shard_degree = world_size if args.fsdp else 1
    c.parallelism.spmd_backend = "partial_dtensor"
    c.parallelism.pipeline_parallel_degree = 2 if args.pipeline else 1
    return c


def main() -> None:
    args = common.parse_args(
        __doc__,
        batch=2,
        lr=8e-4,
        flags=(
            ("--make-assets", "write the tokenizer and --dataset-size texts to --out, and stop"),
            ("--pipeline", "pipeline_parallel_degree 2 (refused: not covered)"),
            ("--fsdp", "the FSDP path (shard over every rank) instead of the replicate path"),
            ("--own-checkpoints", "under sres too, torchtitan's checkpoint every 5 steps (and its load)"),
        ),
        paths=(("--assets", "where --make-assets wrote them"),),
    )
    if args.make_assets:
        make_assets(args.out, args.dataset_size, args.seed)
        return
    # Each process its own cache of the dataset's Arrow files (ranks read the same JSON at once).
    os.environ["HF_DATASETS_CACHE"] = str(args.out / "hf-cache" / str(os.getpid()))
    from tests.models import titan_cpu

    titan_cpu.install()
    from torchtitan.tools.logging import init_logger

    init_logger()
    common.deterministic()
    if args.classic_every:
        classic(args)
    else:
        with_sres(args)


def stepping(base: type, args: argparse.Namespace) -> type:
    """``base`` (a torchtitan Trainer) with the zoo's step records: the classic run's crash, step
    times, and each step's samples and loss."""

    class Stepping(base):
        seen: list[int] = []
        last_loss = None

        def forward_backward_step(self, *, input_dict, labels, global_valid_tokens):
            self.seen = self.seen + row_ids(input_dict["input"])
            loss = super().forward_backward_step(
                input_dict=input_dict, labels=labels, global_valid_tokens=global_valid_tokens
            )
            self.last_loss = loss.detach()
            return loss

        def train_step(self, data_iterator) -> None:
            common.step_began(args, dist.get_rank(), self.step - 1)
            super().train_step(data_iterator)
            if args.sleep_s:  # simulated compute, as the other cases' progress() sleeps
                time.sleep(args.sleep_s)
            common.step_done(args, dist.get_rank(), self.step - 1)

    return Stepping


def with_sres(args: argparse.Namespace) -> None:
    from resilience.integrations.torchtitan import ResilientTrainer

    class Trained(stepping(ResilientTrainer, args)):
        """Records each step's samples as its commit opens (the optimizer's pre-step hook)."""

        def __init__(self, ctx: resilience.Context, cfg) -> None:
            super().__init__(ctx, cfg)
            self.samples = common.SampleLog(ctx, args.out)
            self.optimizers.optimizers[0].register_step_pre_hook(self._record)

        def _record(self, *_) -> None:
            if not self._sres_training:  # DCP's step on zero gradients (a commit loaded)
                return
            self.samples.record(self.step - 1, self.seen)
            self.seen = []

    def train(ctx: resilience.Context) -> None:
        trainer = Trained(ctx, config(args, ctx.world_size))
        try:
            trainer.train()
        finally:
            trainer.close()
        common.finish(ctx, args, trainer.model_parts[0], trainer.optimizers.optimizers[0], trainer.last_loss)

    resilience.run(train)


def classic(args: argparse.Namespace) -> None:
    """torchtitan as its users run it, under torchrun: its own checkpoint every ``--classic-every``
    steps, loaded by the next attempt (benchmarks/frameworks.py); with an interval past the last
    step: plain torchtitan, what a fault-free sres run must equal."""
    from torchtitan.trainer import Trainer

    Classic = stepping(Trainer, args)
    trainer = Classic(config(args, int(os.environ["WORLD_SIZE"])))
    try:
        trainer.train()
    finally:
        trainer.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{dist.get_rank()}.json").write_text(
        json.dumps(
            {
                "rank": dist.get_rank(),
                "model_sha": common.tensor_sha(dict(trainer.model_parts[0].named_parameters())),
                "optimizer_sha": common.tensor_sha(trainer.optimizers.optimizers[0].state_dict()),
                "loss": trainer.last_loss.item(),
            }
        )
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    main()
