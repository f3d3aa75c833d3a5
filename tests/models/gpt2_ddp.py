"""Zoo: a `transformers` GPT-2 (random init, default dropout 0.1) under plain DistributedDataParallel,
AdamW, a StatefulDataLoader over a shuffling DistributedSampler (num_workers=0).

    sres run --nodes 2 -- python -m tests.models.gpt2_ddp --steps 16 --out /tmp/zoo
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

import resilience
from tests.models import common

VOCAB, SEQ = 256, 32


def main() -> None:
    args = common.parse_args(__doc__)
    common.deterministic()
    transformers.logging.set_verbosity_error()  # models built from a config: no tokenizer to match

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        config = GPT2Config(
            n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0, eos_token_id=0
        )
        model = GPT2LMHeadModel(config)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        loader = common.loader(common.tokens(args.dataset_size, args.seed, seq_len=SEQ, vocab=VOCAB), args)
        ctx.register(model=model, optimizer=optimizer, loader=loader)
        ddp = DistributedDataParallel(model)
        samples = common.SampleLog(ctx, args.out)
        loss = torch.tensor(float("nan"))
        it = iter(loader)
        for step in ctx.steps(args.steps):
            batch = next(it)
            loss = ddp(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
            loss.backward()
            with ctx.commit():
                optimizer.step()
                optimizer.zero_grad()
                samples.record(step, batch["index"])
            common.progress(ctx, step, args.steps, loss, args)
        common.finish(ctx, args, model, optimizer, loss)

    resilience.run(train)


if __name__ == "__main__":
    main()
