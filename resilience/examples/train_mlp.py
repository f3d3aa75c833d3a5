"""A deterministic MLP trained with DDP: the demo's and the tests' workload.

Data is a function of (seed, step, rank), so a run with faults must end with exactly the
parameters of a run without them. Each rank writes its final state digest to
``<out>/rank<R>.json``.

    sres run --nodes 4 --spares 1 -- python -m resilience.examples.train_mlp --steps 50 --out /tmp/run
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch
import torch.distributed as dist

import resilience
from resilience.examples import outputs
from resilience.state import snapshot


DDP_KINDS = ("resilience", "exact", "torch")


def wrap(model: torch.nn.Module, kind: str, bits: int | None = None) -> torch.nn.Module:
    """The model as each kind of data parallelism sees it (exact mode also alone: it quantizes)."""
    if kind == "exact":
        return resilience.ddp(model, exact=True, **({"bits": bits} if bits else {}))
    if not dist.is_initialized():
        return model
    return resilience.ddp(model) if kind == "resilience" else torch.nn.parallel.DistributedDataParallel(model)


def build_model(width: int, depth: int, seed: int, dropout: float = 0.0) -> torch.nn.Module:
    torch.manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
        if dropout:
            layers.append(torch.nn.Dropout(dropout))
    layers.append(torch.nn.Linear(width, width))
    return torch.nn.Sequential(*layers)


def batch_for(step: int, rank: int, width: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    x = torch.randn(batch, width, generator=g)
    return x, torch.sin(x)


def sample(index: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``index`` of the synthetic dataset of the elastic mode."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * index + 1)
    x = torch.randn(width, generator=g)
    return x, torch.sin(x)


class Samples(torch.utils.data.Dataset):
    """The elastic mode's dataset, map-style (what a batch cache's producer reads)."""

    def __init__(self, length: int, width: int, seed: int, cost_s: float = 0.0) -> None:
        self.length, self.width, self.seed, self.cost_s = length, width, seed, cost_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cost_s:
            time.sleep(self.cost_s)  # decoding, augmenting: what makes a data pipeline slow
        return sample(index, self.width, self.seed)


def batch_source(args: argparse.Namespace) -> resilience.SampleSource:
    """``--batch-cache``: the source of the node's cache, made alike in ranks and the producer."""
    dataset = Samples(args.dataset, args.width, args.seed, args.sample_ms / 1000)
    sampler = resilience.ElasticSampler(args.dataset, args.global_batch, args.micro_batch, args.seed)
    return resilience.SampleSource(dataset, sampler, workers=args.cache_workers)


def elastic_step(
    ddp: torch.nn.Module,
    ctx: resilience.Context,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    step: int,
    seed: int,
    exact: bool = False,
    sync_every_backward: bool = False,
) -> torch.Tensor:
    """One step of the global batch in micro-batches; gradients are the global batch's mean
    whatever the world size. DDP averages over ranks, so each rank's micro-losses are summed
    over its share; exact mode averages over micro-batches, so each is a plain mean (a divisor
    that changes with the world size would change the bits). Random ops (dropout) draw from
    the micro-batch's own stream (``resilience.micro_batch_rng``): the same masks at any world
    size."""
    ids = resilience.micro_batch_ids(ctx.batch, ctx.rank)
    per_rank = ctx.batch.per_rank
    total = torch.zeros(())
    for i, (x, y) in enumerate(batches):
        last = i == len(batches) - 1 or sync_every_backward
        sync = contextlib.nullcontext() if last or not hasattr(ddp, "no_sync") else ddp.no_sync()
        with sync, resilience.micro_batch_rng(seed, step, ids[i]):
            per_sample = torch.nn.functional.mse_loss(ddp(x), y, reduction="none").mean(1)
            loss = per_sample.mean() if exact else per_sample.sum() / per_rank
            loss.backward()
        total += loss.detach() / len(batches) if exact else loss.detach()  # the rank's mean loss, either way
    return total


def micro_batches(
    sampler: resilience.ElasticSampler,
    cache: resilience.BatchCache | None,
    ctx: resilience.Context,
    step: int,
    args: argparse.Namespace,
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's micro-batches at ``step``: from the node's batch cache, or made here."""
    if cache is not None:
        return [(x, y) for x, y in cache.batch(step)]
    dataset = Samples(args.dataset, args.width, args.seed, args.sample_ms / 1000)
    out = []
    for indices in sampler.indices(step, ctx.rank, ctx.world_size):
        xs, ys = zip(*(dataset[j] for j in indices))
        out.append((torch.stack(xs), torch.stack(ys)))
    return out


@torch.no_grad()
def eval_loss(model: torch.nn.Module, width: int, seed: int, count: int = 64) -> float:
    """Mean loss over the first ``count`` samples (without dropout): comparable across runs of
    any world size."""
    xs, ys = zip(*(sample(j, width, seed) for j in range(count)))
    model.eval()
    try:
        return torch.nn.functional.mse_loss(model(torch.stack(xs)), torch.stack(ys)).item()
    finally:
        model.train()


def model_digest(model: torch.nn.Module) -> str:
    """The parameters' digest alone (the run's format, ``xxh3-128:<hex>``): comparable across
    world sizes even when the optimizer's state is sharded differently."""
    return snapshot.fingerprint({"model": model.state_dict()})


def state_mb(width: int, depth: int) -> float:
    """Parameters plus AdamW's two moments, in MiB."""
    params = (depth + 1) * (width * width + width)
    return params * 4 * 3 / 2**20


def train(ctx: resilience.Context, args: argparse.Namespace) -> None:
    """The training function, as one writes it: build, register, then step and commit."""
    if args.fail_always:
        raise ValueError("this train function always fails")
    with ctx.skip_init():  # after a fault register() overwrites every parameter: no init first
        model = build_model(args.width, args.depth, args.seed, args.dropout)
    if args.sharded:
        opt = resilience.ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=args.lr)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ctx.register(model=model, optimizer=opt)
    sampler = cache = None
    if args.dataset:
        source = batch_source(args)
        sampler = source.sampler
        ctx.register(sampler=sampler)
        if args.batch_cache:
            cache = resilience.BatchCache(source, prefetch=args.prefetch, lookback=args.lookback)
            ctx.register(batches=cache)
        for group in opt.param_groups:
            group["lr"] = args.lr * ctx.lr_scale
    ddp = wrap(model, args.ddp, args.exact_bits)
    loss = torch.tensor(float("nan"))
    clock = outputs.StepClock()
    for step in ctx.steps(args.steps):
        loss = forward_backward(ddp, ctx, sampler, cache, step, args)
        with ctx.commit():
            opt.step()
            opt.zero_grad()
        if args.sleep_s:
            time.sleep(args.sleep_s)
        clock.tick()
        outputs.progress(ctx, step, args.steps, loss, args.progress_every)
    if args.out is not None:
        evaluated = eval_loss(model, args.width, args.seed) if sampler is not None else None
        digests = {"model_digest": model_digest(model)}
        saved = outputs.saved_bytes(model.state_dict(), opt.state_dict())
        outputs.write_result(args.out, ctx, loss, clock, digests, eval_loss=evaluated, saved_bytes=saved)


def forward_backward(
    ddp: torch.nn.Module,
    ctx: resilience.Context,
    sampler: resilience.ElasticSampler | None,
    cache: resilience.BatchCache | None,
    step: int,
    args: argparse.Namespace,
) -> torch.Tensor:
    """This rank's loss at ``step``, its gradients computed: the global batch in micro-batches
    (elastic mode, ``--dataset``), else a batch of this rank's own."""
    if sampler is not None:
        return elastic_step(
            ddp,
            ctx,
            micro_batches(sampler, cache, ctx, step, args),
            step,
            args.seed,
            exact=args.ddp == "exact",
            sync_every_backward=args.sync_every_backward,
        )
    x, y = batch_for(step, ctx.rank, args.width, args.batch, args.seed)
    loss = torch.nn.functional.mse_loss(ddp(x), y)
    if args.compute_s:
        time.sleep(args.compute_s)
    loss.backward()
    return loss


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    options: dict = {"deterministic_ddp": False} if args.no_deterministic_ddp else {}
    if args.batch_cache and args.producer:
        options["batches"] = lambda: batch_source(args)
    resilience.run(lambda ctx: train(ctx, args), **options)


# --- the command line -----------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _add_training_flags(parser)
    _add_test_flags(parser)
    _add_elastic_flags(parser)
    return parser.parse_args()


def _add_training_flags(parser: argparse.ArgumentParser) -> None:
    """The model, its data, optimizer and data parallelism."""
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--sharded", action="store_true", help="ZeRO-1 optimizer (resilience.ShardedOptimizer)"
    )
    parser.add_argument(
        "--ddp",
        choices=DDP_KINDS,
        default="resilience",
        help="resilience.ddp (default), resilience.ddp(exact=True), or plain torch DDP",
    )
    parser.add_argument("--exact-bits", type=int, default=None, help="exact mode: bits kept per micro-batch")
    parser.add_argument(
        "--no-deterministic-ddp",
        action="store_true",
        help="resilience.run(train, deterministic_ddp=False): leave plain DDP's bucket all-reduce alone",
    )


def _add_test_flags(parser: argparse.ArgumentParser) -> None:
    """What the tests and benchmarks ask of a run: failures, slowness, progress and results."""
    parser.add_argument("--fail-always", action="store_true", help="raise on every entry (tests give-up)")
    parser.add_argument("--progress-every", type=int, default=10)
    parser.add_argument(
        "--sleep-s", type=float, default=0.0, help="extra seconds per step (slow runs for tests)"
    )
    parser.add_argument(
        "--compute-s",
        type=float,
        default=0.0,
        help="seconds of simulated accelerator work in each step's forward-backward: the host waits, "
        "as it waits on a GPU, instead of sharing a busy CPU (straggler tests)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write rank<R>.json with the final digest here"
    )


def _add_elastic_flags(parser: argparse.ArgumentParser) -> None:
    """Elastic mode: a dataset through resilience.ElasticSampler, in micro-batches."""
    parser.add_argument(
        "--dataset",
        type=int,
        default=0,
        help="elastic mode: a dataset of this many samples through resilience.ElasticSampler",
    )
    parser.add_argument(
        "--global-batch", type=int, default=24, help="elastic mode: samples per step, all ranks"
    )
    parser.add_argument("--micro-batch", type=int, default=4, help="elastic mode: samples per micro-batch")
    parser.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="dropout after each hidden layer; in elastic mode each micro-batch draws its masks "
        "from resilience.micro_batch_rng (the same masks at any world size)",
    )
    parser.add_argument(
        "--sample-ms", type=float, default=0.0, help="elastic mode: milliseconds to make a sample"
    )
    parser.add_argument(
        "--batch-cache",
        action="store_true",
        help="elastic mode: batches from the node's resilience.BatchCache",
    )
    parser.add_argument("--prefetch", type=int, default=10, help="--batch-cache: steps made ahead")
    parser.add_argument("--lookback", type=int, default=2, help="--batch-cache: steps kept behind")
    parser.add_argument(
        "--cache-workers", type=int, default=0, help="--batch-cache: processes of the node's producer"
    )
    parser.add_argument(
        "--no-producer",
        dest="producer",
        action="store_false",
        help="--batch-cache without resilience.run(train, batches=...): each rank makes what it misses",
    )
    parser.add_argument(
        "--sync-every-backward",
        action="store_true",
        help="elastic mode: no no_sync() around any micro-batch (every backward synchronizes)",
    )


if __name__ == "__main__":
    main()
