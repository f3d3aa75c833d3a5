"""What the model zoo's training scripts share: arguments, a synthetic dataset, the loader,
the record of trained samples, and the final digests.

Each script is an ordinary training loop under ``resilience.run(train)``. Datasets are a
function of the sample index alone (seeded per index) and return that index, so every
committed step's samples can be written down and compared between a fault-free run and a run
with faults. Files under ``--out``:

- ``samples-rank{R}.jsonl``: one line per commit, ``{"step", "generation", "samples"}``; a
  step redone after a rollback is written again (the last line of a step is what counts);
- ``rank{R}.json``: ``{"rank", "digest"`` (``ctx.state_digest()``), ``"model_sha"``,
  ``"optimizer_sha"``, ...``}`` at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

import resilience

# Noise of a library, not of the runs: torchdata calls a deprecated torch API.
warnings.filterwarnings("ignore", message=r"'set_vital' is deprecated")


def parse_args(
    description: str,
    *,
    steps: int = 16,
    batch: int = 4,
    lr: float = 1e-3,
    flags: tuple[tuple[str, str], ...] = (),
    paths: tuple[tuple[str, str], ...] = (),
) -> argparse.Namespace:
    """The zoo's common arguments; ``flags``: (name, help) of a case's own on/off options;
    ``paths``: (name, help) of its own path options."""
    parser = argparse.ArgumentParser(description=description)
    for name, text in flags:
        parser.add_argument(name, action="store_true", help=text)
    for name, text in paths:
        parser.add_argument(name, type=Path, help=text)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=batch, help="samples per rank and step")
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dataset-size",
        type=int,
        default=1024,
        help="samples in the synthetic dataset (one epoch covers the whole run)",
    )
    parser.add_argument(
        "--sleep-s",
        type=float,
        default=0.0,
        help="seconds of simulated compute per step (tests: lets warm standbys start)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, help="samples-rank<R>.jsonl and rank<R>.json go here"
    )
    # benchmarks/frameworks.py: the framework's own classic resume, under torchrun, for comparison.
    parser.add_argument(
        "--classic-every",
        type=int,
        default=0,
        help="no sres pieces: the framework's own checkpoint every K steps, resumed from the last",
    )
    parser.add_argument("--crash-at", type=int, default=-1, help="rank 1 exits as step S begins, once")
    parser.add_argument(
        "--step-times", action="store_true", help="rank 0 writes steps.jsonl (step, wall time)"
    )
    return parser.parse_args()


USER_THREADS = "ZOO_USER_THREADS"
"""Set (to anything): the script leaves torch's threads as the launcher gave them, as the new
user's own GPT-2 script did (``benchmarks/rank_threads.py``)."""


def deterministic() -> None:
    """What a careful user does for bitwise reproducible runs on CPU."""
    if not os.environ.get(USER_THREADS):
        torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --- data ------------------------------------------------------------------------------------


class SyntheticDataset(Dataset):
    """``size`` samples, each made by ``make(generator)`` from a generator seeded by (seed, index):
    sample ``i`` is the same whatever process, worker or order reads it."""

    def __init__(
        self, size: int, seed: int, make: Callable[[torch.Generator], dict[str, torch.Tensor]]
    ) -> None:
        self.size, self.seed, self.make = size, seed, make

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        return {"index": index, **self.make(g)}


def tokens(size: int, seed: int, *, seq_len: int, vocab: int, low: int = 0) -> SyntheticDataset:
    """Sequences of token ids in [low, vocab)."""
    return SyntheticDataset(
        size, seed, lambda g: {"input_ids": torch.randint(low, vocab, (seq_len,), generator=g)}
    )


def vectors(size: int, seed: int, *, dim: int, classes: int) -> SyntheticDataset:
    """Feature vectors and a class label (a fixed function of the features)."""

    def make(g: torch.Generator) -> dict[str, torch.Tensor]:
        x = torch.randn(dim, generator=g)
        return {"x": x, "y": (x[:classes].argmax())}

    return SyntheticDataset(size, seed, make)


CLASSIFIER_DIM, CLASSES = 16, 4
"""The frameworks' cases (Lightning, Fabric, accelerate): a small classifier over ``vectors``."""


def classifier() -> torch.nn.Module:
    """A small classifier with dropout (what the random streams must reproduce after a fault)."""
    return torch.nn.Sequential(
        torch.nn.Linear(CLASSIFIER_DIM, 64),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(64, CLASSES),
    )


def shuffled(args: argparse.Namespace) -> torch.utils.data.DataLoader:
    """A framework's default data path: a plain ``DataLoader(shuffle=True)`` the framework gets as
    it is (it injects its own sampler, or shards it)."""
    return torch.utils.data.DataLoader(
        vectors(args.dataset_size, args.seed, dim=CLASSIFIER_DIM, classes=CLASSES),
        batch_size=args.batch,
        shuffle=True,
        drop_last=True,
    )


def loader(
    dataset: Dataset, args: argparse.Namespace, *, num_workers: int = 0, collate_fn: Callable | None = None
) -> StatefulDataLoader:
    """This rank's shuffled share of ``dataset`` (DistributedSampler) in a StatefulDataLoader."""
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True)
    return StatefulDataLoader(
        dataset,
        batch_size=args.batch,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        drop_last=True,
    )


# --- records ---------------------------------------------------------------------------------


def step_began(args: argparse.Namespace, rank: int, step: int) -> None:
    """The classic run's crash (``--crash-at``): rank 1 exits as the step begins, in the first
    attempt only (a marker file says it happened; its time is the fault's)."""
    marker = args.out / "crashed.json"
    if step == args.crash_at and rank == 1 and not marker.exists():
        marker.write_text(json.dumps({"step": step, "t": time.time()}))
        os._exit(1)


def step_done(args: argparse.Namespace, rank: int, step: int) -> None:
    """``--step-times``: rank 0's wall time at the end of each step, in ``steps.jsonl``."""
    if args.step_times and rank == 0:
        with (args.out / "steps.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "t": time.time()}) + "\n")


class SampleLog:
    """Appends the samples of each committed step to ``<out>/samples-rank<R>.jsonl``; call
    :meth:`record` inside ``ctx.commit()``."""

    def __init__(self, ctx: resilience.Context, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.ctx, self.path = ctx, out / f"samples-rank{ctx.rank}.jsonl"

    def record(self, step: int, samples: torch.Tensor | list[int]) -> None:
        ids = samples.tolist() if isinstance(samples, torch.Tensor) else list(samples)
        line = json.dumps({"step": step, "generation": self.ctx.generation, "samples": ids}) + "\n"
        with self.path.open("a") as f:
            f.write(line)


def progress(
    ctx: resilience.Context, step: int, total: int, loss: torch.Tensor, args: argparse.Namespace
) -> None:
    """Rank 0 prints every 4th step's loss; then the simulated compute time, if any."""
    if ctx.rank == 0 and (step % 4 == 0 or step == total - 1):
        print(f"step {step:3d}/{total}  loss {loss.item():.6f}  gen {ctx.generation}", flush=True)
    if args.sleep_s:
        time.sleep(args.sleep_s)


def tensor_sha(items: Any) -> str:
    """SHA-256 of a nested structure of tensors (DTensors: their local shard) and plain values."""
    h = hashlib.sha256()
    _feed(h, items)
    return h.hexdigest()


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.to_local() if hasattr(obj, "to_local") else obj
        t = t.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=str):
            h.update(repr(key).encode())
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(obj).encode())


def finish(
    ctx: resilience.Context,
    args: argparse.Namespace,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    **extra: Any,
) -> None:
    """Write ``<out>/rank<R>.json``: the registered state's digest, and the model's parameters,
    the optimizer's state and each of ``extra`` (``<name>_sha``) on their own."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{ctx.rank}.json").write_text(
        json.dumps(
            {
                "rank": ctx.rank,
                "digest": ctx.state_digest(),
                "model_sha": tensor_sha(dict(model.named_parameters())),
                "optimizer_sha": tensor_sha(optimizer.state_dict()),
                "loss": loss.item(),
                "step": ctx.step,
                "generation": ctx.generation,
                "world_size": ctx.world_size,
                **{f"{name}_sha": tensor_sha(value) for name, value in extra.items()},
            }
        )
    )
