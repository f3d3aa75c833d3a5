"""Data for a world that changes size: the same global batch, every sample of an epoch once.

The samples form one endless stream, epoch after epoch (each epoch a permutation drawn from
the seed). Step ``s`` takes the next ``global_batch`` samples of the stream, so a batch may
span an epoch boundary and no sample is dropped or repeated. The stream position of a step
depends only on the global batches used before it, which change only when the world size
changes: the sampler's whole state is the list of *segments* (first step, stream position,
global batch) at which that happened. It is replicated state (identical on every rank), so
a replaced rank gets it from a peer like the model's parameters.

A world that does not divide the global batch gets the closest global batch it divides
(``keep-closest``) and a learning-rate scale (``linear``, ``sqrt`` or ``none``); the batch
actually used is reported (``ctx.batch``, the ``resize`` event).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from resilience.contract.elastic_config import BATCH_POLICIES, LR_SCALINGS
from resilience.contract.run_dir import RunDir
from resilience.errors import BatchError


@dataclass(frozen=True)
class BatchPlan:
    """How one step's global batch is split at one world size."""

    world_size: int
    global_batch: int
    """The global batch actually used (the configured one whenever the world divides it)."""
    per_rank: int
    micro_batches: tuple[int, ...]
    """Sizes of one rank's micro-batches; their count is the gradient-accumulation steps."""
    lr_scale: float
    wanted: int

    @property
    def accumulation(self) -> int:
        return len(self.micro_batches)

    @property
    def kept(self) -> bool:
        return self.global_batch == self.wanted


def batch_plan(
    global_batch: int,
    micro_batch: int,
    world_size: int,
    policy: str = "keep-closest",
    lr_scaling: str = "linear",
) -> BatchPlan:
    """Split ``global_batch`` over ``world_size`` ranks in micro-batches of at most ``micro_batch``. Pure.

    When the world does not divide the global batch, ``keep-closest`` uses the nearest
    multiple of the world size (the smaller one on a tie, never zero) and scales the learning
    rate by the ratio (``linear``), its square root (``sqrt``) or not at all.
    """
    if min(global_batch, micro_batch, world_size) < 1:
        raise BatchError(
            f"global batch {global_batch}, micro-batch {micro_batch}, world {world_size}: all must be >= 1"
        )
    if policy not in BATCH_POLICIES:
        raise BatchError(f"batch policy {policy!r}: one of {', '.join(BATCH_POLICIES)}")
    if lr_scaling not in LR_SCALINGS:
        raise BatchError(f"lr scaling {lr_scaling!r}: one of {', '.join(LR_SCALINGS)}")
    used = global_batch
    if global_batch % world_size:
        if policy == "fail":
            raise BatchError(f"a world of {world_size} ranks does not divide the global batch {global_batch}")
        below, above = (global_batch // world_size) * world_size, -(-global_batch // world_size) * world_size
        used = above if below == 0 or above - global_batch < global_batch - below else below
    per_rank = used // world_size
    count = -(-per_rank // micro_batch)
    sizes = tuple(min(micro_batch, per_rank - i * micro_batch) for i in range(count))
    ratio = used / global_batch
    scale = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[lr_scaling]
    return BatchPlan(world_size, used, per_rank, sizes, scale, global_batch)


class ElasticSampler:
    """Which samples each rank trains on at each step, whatever the world size.

    ``indices(step, rank, world_size)`` returns the rank's micro-batches of that step (lists
    of dataset indices). Register it (``ctx.register(sampler=sampler)``) so that its state
    follows commits and recoveries; committed steps are then recorded in the run's log dir.
    """

    def __init__(
        self,
        dataset_len: int,
        global_batch: int,
        micro_batch: int,
        seed: int = 0,
        *,
        policy: str | None = None,
        lr_scaling: str | None = None,
    ) -> None:
        """``policy``/``lr_scaling`` not given: the run's (``sres run --batch-policy/--lr-scaling``,
        applied by ``ctx.register``), else ``keep-closest`` and ``linear``."""
        if dataset_len < 1:
            raise BatchError(f"dataset_len {dataset_len}: at least 1")
        batch_plan(
            global_batch, micro_batch, 1, policy or "keep-closest", lr_scaling or "linear"
        )  # validates
        self.dataset_len, self.global_batch, self.micro_batch, self.seed = (
            dataset_len,
            global_batch,
            micro_batch,
            seed,
        )
        self._given = (policy, lr_scaling)
        self.policy, self.lr_scaling = policy or "keep-closest", lr_scaling or "linear"
        self.segments: list[tuple[int, int, int]] = [(0, 0, global_batch)]
        """(first step, stream position of that step, global batch from then on)."""
        self._perms: dict[int, torch.Tensor] = {}
        """The newest two epochs' permutations: a step across an epoch's end, or a batch cache
        asking ahead across it, reads both (one kept alone was drawn again at every ask)."""

    def use_run_defaults(self, policy: str, lr_scaling: str) -> None:
        """The run's batch settings, for what the constructor was not given (``ctx.register``)."""
        self.policy = self._given[0] or policy
        self.lr_scaling = self._given[1] or lr_scaling
        self.plan(1)  # validates

    # --- what a step uses -----------------------------------------------------------------------

    def plan(self, world_size: int) -> BatchPlan:
        return batch_plan(self.global_batch, self.micro_batch, world_size, self.policy, self.lr_scaling)

    def span(self, step: int, world_size: int) -> tuple[int, int]:
        """Stream positions ``[start, end)`` of ``step``'s global batch at ``world_size``.

        The first query at a new world size starts a segment; one that started at this same
        step (a step redone after a fault, in another world) is replaced: it was never committed.
        """
        used = self.plan(world_size).global_batch
        self.segments = [s for s in self.segments if s[0] <= step]
        first, position, batch = self.segments[-1]
        start = position + (step - first) * batch
        if batch != used:
            if first == step:
                self.segments.pop()
            self.segments.append((step, start, used))
        return start, start + used

    def indices(self, step: int, rank: int, world_size: int) -> list[list[int]]:
        """The rank's micro-batches at ``step``: dataset indices, in training order."""
        if not 0 <= rank < world_size:
            raise BatchError(f"rank {rank} is outside a world of {world_size}")
        plan = self.plan(world_size)
        start, _ = self.span(step, world_size)
        mine = self._samples(start + rank * plan.per_rank, plan.per_rank)
        out, offset = [], 0
        for size in plan.micro_batches:
            out.append(mine[offset : offset + size])
            offset += size
        return out

    def _samples(self, start: int, count: int) -> list[int]:
        out: list[int] = []
        while count > 0:
            epoch, offset = divmod(start, self.dataset_len)
            take = min(count, self.dataset_len - offset)
            out += self.permutation(epoch)[offset : offset + take].tolist()
            start, count = start + take, count - take
        return out

    def permutation(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {e: p for e, p in self._perms.items() if e in (epoch - 1, epoch + 1)}
            self._perms[epoch] = torch.randperm(self.dataset_len, generator=g)
        return self._perms[epoch]

    # --- state, for ctx.register ------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "dataset_len": self.dataset_len,
            "global_batch": self.global_batch,
            "micro_batch": self.micro_batch,
            "seed": self.seed,
            "segments": [list(s) for s in self.segments],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mine = (self.dataset_len, self.global_batch, self.micro_batch, self.seed)
        theirs = (state["dataset_len"], state["global_batch"], state["micro_batch"], state["seed"])
        if mine != theirs:
            raise BatchError(
                f"sampler state of (dataset_len, global_batch, micro_batch, seed) {theirs} "
                f"does not fit this sampler's {mine}"
            )
        self.segments = [tuple(s) for s in state["segments"]]

    # --- accounting -----------------------------------------------------------------------------

    def record(self, log_dir: str | Path, step: int, rank: int, world_size: int, generation: int) -> None:
        """Append what committed ``step`` trained on to ``<log_dir>/samples/rank-<rank>.jsonl``.

        Every rank writes the step's global span, so one surviving record is enough;
        :func:`coverage` keeps each step's newest generation (a step redone after a rollback).
        """
        start, end = self.span(step, world_size)
        files = RunDir(Path(log_dir))
        files.samples_dir.mkdir(parents=True, exist_ok=True)
        line = {
            "step": step,
            "generation": generation,
            "world_size": world_size,
            "rank": rank,
            "start": start,
            "end": end,
            "dataset_len": self.dataset_len,
            "seed": self.seed,
            "t": time.time(),
        }
        with files.samples(rank).open("a") as f:
            f.write(json.dumps(line) + "\n")


@dataclass(frozen=True)
class Coverage:
    """Committed steps read back from a run's sample records."""

    steps: int
    counts: dict[int, Counter]
    """epoch -> dataset index -> times trained."""
    gaps: tuple[tuple[int, int], ...]
    """Stream ranges no committed step covered (between the first and last)."""
    overlaps: tuple[tuple[int, int], ...]
    worlds: tuple[int, ...]
    """World size of each committed step, in order."""

    def complete_epochs(self, dataset_len: int) -> list[int]:
        return [e for e, c in sorted(self.counts.items()) if sum(c.values()) == dataset_len]


def coverage(log_dir: str | Path) -> Coverage:
    """Read ``<log_dir>/samples`` and count how often each sample of each epoch was trained."""
    newest: dict[int, dict] = {}
    for path in RunDir(Path(log_dir)).sample_files():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["step"] not in newest or rec["generation"] > newest[rec["step"]]["generation"]:
                newest[rec["step"]] = rec
    if not newest:
        return Coverage(0, {}, (), (), ())
    steps = [newest[s] for s in sorted(newest)]
    sampler = ElasticSampler(steps[0]["dataset_len"], 1, 1, steps[0]["seed"])
    counts: dict[int, Counter] = {}
    gaps, overlaps = [], []
    for prev, rec in zip([None] + steps[:-1], steps):
        if prev is not None and rec["start"] > prev["end"]:
            gaps.append((prev["end"], rec["start"]))
        if prev is not None and rec["start"] < prev["end"]:
            overlaps.append((rec["start"], prev["end"]))
        for index_pos in range(rec["start"], rec["end"]):
            epoch, offset = divmod(index_pos, sampler.dataset_len)
            counts.setdefault(epoch, Counter())[int(sampler.permutation(epoch)[offset])] += 1
    return Coverage(len(steps), counts, tuple(gaps), tuple(overlaps), tuple(r["world_size"] for r in steps))
