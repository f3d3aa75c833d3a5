"""Zoo: a Hugging Face ``Trainer`` (as ``ResilientTrainer``) training a `transformers` GPT-2 (random
init, dropout 0.1) on its default data path (its sampler, accelerate's sharded loader), AdamW and a
linear schedule with warm-up, gradient accumulation 2; a ``compute_loss`` of the user's own, as
many Trainer subclasses have.

    sres run --nodes 2 -- python -m tests.models.hf_trainer --steps 16 --out /tmp/zoo

What a user changes for sres: ``resilience.run(train)``, and ``ResilientTrainer(ctx, ...)`` for
``Trainer(...)``.
"""

from __future__ import annotations

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

import resilience
from resilience.integrations.hf import ResilientTrainer
from tests.models import common

VOCAB, SEQ = 256, 32


class Trained(ResilientTrainer):
    """Records each micro-batch's samples under the optimizer step it belongs to."""

    def __init__(self, ctx: resilience.Context, samples: common.SampleLog, **kwargs) -> None:
        super().__init__(ctx, **kwargs)
        self.samples, self.seen = samples, []
        self.last_loss = torch.tensor(float("nan"))

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        index = inputs.pop("index")
        self.seen += index.tolist()
        if len(self.seen) == self.args.per_device_train_batch_size * self.args.gradient_accumulation_steps:
            self.samples.record(self.state.global_step, self.seen)
            self.seen = []
        loss = model(**inputs).loss
        self.last_loss = loss.detach()
        return loss


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
            save_strategy="no",
            report_to=[],
            logging_steps=1000,
            disable_tqdm=True,
            use_cpu=True,
            remove_unused_columns=False,  # the index column is compute_loss's
        )
        trainer = Trained(
            ctx,
            common.SampleLog(ctx, args.out),
            model=model,
            args=training,
            train_dataset=common.tokens(args.dataset_size, args.seed, seq_len=SEQ, vocab=VOCAB),
            data_collator=collate,
        )
        trainer.train()
        common.finish(ctx, args, model, trainer.optimizer, trainer.last_loss)

    resilience.run(train)


if __name__ == "__main__":
    main()
