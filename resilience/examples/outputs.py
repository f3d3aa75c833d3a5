"""What the examples print and write, which the tests, the demo and the benchmarks read.

Rank 0 prints a progress line every ``--progress-every`` steps and at the last one; with
``--out`` each rank writes ``<out>/rank<R>.json``: where it ended (its state digest, loss,
step, generation, process, world size) and its median step time. None of it is needed to
train: a training script of one's own leaves it out.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

import resilience


class StepClock:
    """The wall time of each step of this entry into ``train``, one ``tick`` per step."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._last = time.perf_counter()

    def tick(self) -> None:
        now = time.perf_counter()
        self.times.append(now - self._last)
        self._last = now

    def median_s(self) -> float | None:
        """Steady state: the first steps of a generation pay for warm-up and re-entry."""
        return statistics.median(self.times[2:]) if len(self.times) > 4 else None


def progress(ctx: resilience.Context, step: int, steps: int, loss: torch.Tensor, every: int) -> None:
    """Rank 0's line at every ``every``-th step and at the last."""
    if ctx.rank == 0 and (step % every == 0 or step == steps - 1):
        print(f"step {step:4d}/{steps}  loss {loss.item():.6f}  gen {ctx.generation}", flush=True)


def saved_bytes(*states: Any) -> int:
    """What ``torch.save`` of ``states`` writes for their tensors: every storage they reach, whole
    and once. A restored tensor that is a view of a bigger buffer shows here as the buffer."""
    seen: dict[int, int] = {}

    def visit(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, Mapping):
            for value in obj.values():
                visit(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                visit(value)

    visit(states)
    return sum(seen.values())


def write_result(
    out: Path,
    ctx: resilience.Context,
    loss: torch.Tensor,
    clock: StepClock,
    digests: Mapping[str, str | None],
    **extra: Any,
) -> None:
    """``<out>/rank<R>.json``: this rank's state digest and ``digests`` (of the model, ...),
    where it ended, its median step time, and ``extra``."""
    out.mkdir(parents=True, exist_ok=True)
    fields = {
        "rank": ctx.rank,
        "digest": ctx.state_digest(),
        **digests,
        "loss": loss.item(),
        "step": ctx.step,
        "generation": ctx.generation,
        "pid": os.getpid(),
        "world_size": ctx.world_size,
        "median_step_s": clock.median_s(),
        **extra,
    }
    (out / f"rank{ctx.rank}.json").write_text(json.dumps(fields))
