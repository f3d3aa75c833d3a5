"""Zoo: a BERT masked LM whose masking draws random numbers in the data path
(`transformers.DataCollatorForLanguageModeling` on torch's global generator, in the main
process: num_workers=0), plain DistributedDataParallel, AdamW, a StatefulDataLoader.

    sres run --nodes 2 -- python -m tests.models.bert_mlm --steps 16 --out /tmp/zoo
"""

from __future__ import annotations

import torch
import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from torch.nn.parallel import DistributedDataParallel
from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling, PreTrainedTokenizerFast

import resilience
from tests.models import common

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
VOCAB, SEQ = 128, 32


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over made-up words: the collator needs one (mask id, vocabulary size)."""
    words = {t: i for i, t in enumerate([*SPECIALS, *(f"w{i}" for i in range(VOCAB - len(SPECIALS)))])}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(words, unk_token="[UNK]")),
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )


def main() -> None:
    args = common.parse_args(__doc__)
    common.deterministic()
    transformers.logging.set_verbosity_error()
    collator = DataCollatorForLanguageModeling(word_tokenizer(), mlm_probability=0.15)

    def collate(features: list[dict]) -> dict[str, torch.Tensor]:
        batch = collator([{"input_ids": f["input_ids"]} for f in features])  # masks at random
        batch["index"] = torch.tensor([f["index"] for f in features])
        return batch

    def train(ctx: resilience.Context) -> None:
        common.seed_everything(args.seed)
        config = BertConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=SEQ,
            pad_token_id=0,
        )
        model = BertForMaskedLM(config)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
        dataset = common.tokens(args.dataset_size, args.seed, seq_len=SEQ, vocab=VOCAB, low=len(SPECIALS))
        loader = common.loader(dataset, args, collate_fn=collate)
        ctx.register(model=model, optimizer=optimizer, loader=loader)
        ddp = DistributedDataParallel(model)
        samples = common.SampleLog(ctx, args.out)
        loss = torch.tensor(float("nan"))
        it = iter(loader)
        for step in ctx.steps(args.steps):
            batch = next(it)
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "labels")}
            loss = ddp(**inputs).loss
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
