"""A small transformer sharded with FSDP2 (``fully_shard`` per block, then the root): the
sharded workload.

Every parameter and optimizer state is a DTensor shard held by one rank (``--hsdp R``: by one
rank in each of R replica groups), so a lost rank's state comes from a buddy's copy, not
from a data-parallel twin. Data is a function of (seed, step, rank), so a run with faults must
end with exactly the parameters of a run without them. Each rank writes ``<out>/rank<R>.json``
with the digest of its own shards (``digest``) and of the whole gathered model and optimizer
state (``model_digest``, ``optimizer_digest``: the same at any world size). By default each
``fully_shard`` call makes a mesh object of its own, as ordinary FSDP2 code does (``--mesh
passed``: one mesh passed to every call; ``--hsdp R``: a 2-D mesh).

    sres run --nodes 4 --spares 1 -- python -m resilience.examples.train_fsdp --steps 30 --out /tmp/run
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import resilience
from resilience.examples import outputs
from resilience.state import snapshot

# fully_shard warns that TinyLM returns a view (its head's output); nothing here modifies it
# in place, which is what the warning is about.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")


class Block(torch.nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, dim: int, depth: int, heads: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim, heads) for _ in range(depth))
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def build(args: argparse.Namespace, world: int) -> torch.nn.Module:
    """The model, sharded as FSDP2's documentation and torchtitan shard it: each block, then the
    root (embedding, final norm and head). ``--mesh default``: each call makes its own mesh
    object; ``passed``: one mesh passed to every call (always under ``--hsdp``)."""
    torch.manual_seed(args.seed)
    model = TinyLM(args.vocab, args.dim, args.depth, args.heads)
    if args.hsdp > 1:
        mesh = init_device_mesh("cpu", (args.hsdp, world // args.hsdp), mesh_dim_names=("replicate", "shard"))
    elif args.mesh == "passed":
        mesh = init_device_mesh("cpu", (world,))
    else:
        mesh = None
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def batch_for(step: int, rank: int, args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and targets of ``rank`` at ``step``: a fixed map of each token to learn."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    tokens = torch.randint(args.vocab, (args.batch, args.seq), generator=g)
    return tokens, (tokens * 7 + 3) % args.vocab


def full_digests(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[str, str]:
    """Digests of the whole model and of the whole optimizer state, each gathered from every
    shard (collectives: every rank calls this). They do not depend on the world size."""
    options = StateDictOptions(full_state_dict=True)
    return (
        _digest(get_model_state_dict(model, options=options)),
        _digest(get_optimizer_state_dict(model, opt, options=options)["state"]),
    )


def _digest(state: dict) -> str:
    """The run's digest format (``xxh3-128:<hex>``, as ``ctx.state_digest()``) over the leaves in
    name order: a gathered state's dict order may differ between world sizes, its names do not."""
    return snapshot.fingerprint(dict(sorted(_leaves(state, ""), key=lambda leaf: leaf[0])))


def _leaves(state, prefix: str):
    if isinstance(state, dict):
        for key, value in state.items():
            yield from _leaves(value, f"{prefix}{key}/")
    else:
        yield prefix, state


def state_mib(args: argparse.Namespace) -> float:
    """Parameters plus AdamW's two moments, all ranks together, in MiB."""
    model = TinyLM(args.vocab, args.dim, args.depth, args.heads)
    return sum(p.numel() for p in model.parameters()) * 4 * 3 / 2**20


def train(ctx: resilience.Context, args: argparse.Namespace) -> None:
    """The training function, as one writes it: build, register, then step and commit."""
    if ctx.world_size % args.hsdp:
        raise ValueError(f"--hsdp {args.hsdp} does not divide the world size {ctx.world_size}")
    model = build(args, ctx.world_size)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    ctx.register(model=model, optimizer=opt)
    trace_digests("entry", ctx, model, opt, args)
    loss = torch.tensor(float("nan"))
    clock = outputs.StepClock()
    for step in ctx.steps(args.steps):
        tokens, targets = batch_for(step, ctx.rank, args)
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        if args.compute_s:
            time.sleep(args.compute_s)
        loss.backward()
        with ctx.commit():
            opt.step()
            opt.zero_grad()
        trace_digests("commit", ctx, model, opt, args)
        clock.tick()
        outputs.progress(ctx, step, args.steps, loss, args.progress_every)
    model_digest, optimizer_digest = full_digests(model, opt) if dist.is_initialized() else (None, None)
    if args.out is not None:
        digests = {"model_digest": model_digest, "optimizer_digest": optimizer_digest}
        peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        outputs.write_result(args.out, ctx, loss, clock, digests, peak_rss_mib=peak_rss_mib)


def trace_digests(
    at: str,
    ctx: resilience.Context,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    args: argparse.Namespace,
) -> None:
    """``--trace-digests``: the whole state's digests now (a collective: every rank calls
    this), appended by rank 0 to ``<out>/digests.jsonl`` to compare across world sizes."""
    if not args.trace_digests:
        return
    model_digest, optimizer_digest = full_digests(model, opt)
    if ctx.rank == 0 and args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        record = {
            "at": at,
            "step": ctx.step,
            "generation": ctx.generation,
            "world_size": ctx.world_size,
            "model": model_digest,
            "optimizer": optimizer_digest,
        }
        with open(args.out / "digests.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    resilience.run(lambda ctx: train(ctx, args))


# --- the command line -----------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hsdp", type=int, default=1, help="replica groups: HSDP on a (R, world/R) mesh")
    parser.add_argument(
        "--mesh",
        choices=("default", "passed"),
        default="default",
        help="1-D FSDP: each fully_shard call makes its own mesh (default), or one mesh passed to all",
    )
    parser.add_argument(
        "--compute-s",
        type=float,
        default=0.0,
        help="simulated accelerator time per step: the host waits in forward-backward",
    )
    parser.add_argument(
        "--trace-digests",
        action="store_true",
        help="rank 0 appends the gathered digests at each entry and commit to <out>/digests.jsonl",
    )
    parser.add_argument("--progress-every", type=int, default=10)
    parser.add_argument(
        "--out", type=Path, default=None, help="write rank<R>.json with the final digests here"
    )
    return parser.parse_args()


if __name__ == "__main__":
    main()
