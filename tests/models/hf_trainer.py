"""Zoo: a Hugging Face ``Trainer`` (as ``ResilientTrainer``) training a `transformers` GPT-2 (random
init, dropout 0.1) on its default data path (its sampler, accelerate's sharded loader), AdamW and a
linear schedule with warm-up, gradient accumulation 2; a ``compute_loss`` of the user's own, as
many Trainer subclasses have.

    sres run --nodes 2 -- python -m tests.models.hf_trainer --steps 16 --out /tmp/zoo

What a user changes for sres: ``resilience.run(train)``, and ``ResilientTrainer(ctx, ...)`` for
``Trainer(...)``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import resilience
from resilience.integrations.hf import ResilientTrainer
from tests.models import common

VOCAB, SEQ = 256, 32


class Records:
    """Records each micro-batch's samples under the optimizer step it belongs to (a Trainer
    subclass's own ``compute_loss``, as many have)."""

    samples: common.SampleLog
    seen: list[int]
    last_loss = torch.tensor(float("nan"))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        index = inputs.pop("index")
        self.seen += index.tolist()
        if len(self.seen) == self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps:
            self.samples.record(self.state.global_step, self.seen)
            self.seen = []
        loss = model(**inputs).loss
        self.last_loss = loss.detach()
        return loss


class Trained(Records, ResilientTrainer):
    pass


class TrainedClassic(Records, Trainer):
    """The Trainer's own fault tolerance (benchmarks/frameworks.py): ``save_steps``, and the next
    attempt resumed by torchrun's restart from the last checkpoint."""


class StepTimes(TrainerCallback):
    def __init__(self, args) -> None:
        self.args = args

    def on_step_begin(self, args, state, control, **kwargs):
        common.step_began(self.args, args.process_index, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.args.sleep_s:  # simulated compute, as the other cases' progress() sleeps
            time.sleep(self.args.sleep_s)
        common.step_done(self.args, args.process_index, state.global_step - 1)


def collate(items: list[dict]) -> dict[str, torch.Tensor]:
    ids = torch.stack([item["input_ids"] for item in items])
    return {"index": torch.tensor([item["index"] for item in items]), "input_ids": ids, "labels": ids}


def main() -> None:
    args = common.parse_args(__doc__, batch=2)
    common.deterministic()
    transformers.logging.set_verbosity_error()

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        config = GPT2Config(
            n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0
        )
        model = GPT2LMHeadModel(config)
        training = TrainingArguments(
            output_dir=str(args.out / "hf"),
            per_device_train_batch_size=args.batch,
            gradient_accumulation_steps=2,
            max_steps=args.steps,
            learning_rate=args.lr,
            warmup_steps=2,
            lr_scheduler_type="linear",
            seed=args.seed,
            save_strategy="steps" if args.classic_every else "no",
            save_steps=args.classic_every or 500,
            report_to=[],
            logging_steps=1000,
            disable_tqdm=True,
            use_cpu=True,
            remove_unused_columns=False,  # the index column is compute_loss's
        )
        kwargs = {
            "model": model,
            "args": training,
            "train_dataset": common.tokens(args.dataset_size, args.seed, seq_len=SEQ, vocab=VOCAB),
            "data_collator": collate,
            "callbacks": [StepTimes(args)],
        }
        trainer = TrainedClassic(**kwargs) if args.classic_every else Trained(ctx, **kwargs)
        trainer.samples, trainer.seen = common.SampleLog(ctx, args.out), []
        ckpts = Path(training.output_dir)
        resume = args.classic_every and ckpts.is_dir() and get_last_checkpoint(str(ckpts)) is not None
        trainer.train(**({"resume_from_checkpoint": True} if resume else {}))
        common.finish(ctx, args, model, trainer.optimizer, trainer.last_loss)

    resilience.run(train)


if __name__ == "__main__":
    main()
