"""`accelerate`: the loop its guide writes, made exact under sres with one wrapper for the loader.

    ddp, optimizer, data, scheduler = accelerator.prepare(model, optimizer, DataLoader(...), scheduler)
    batches = resumable(data)
    ctx.register(model=model, optimizer=optimizer, scheduler=scheduler, loader=batches)
    it = iter(batches)
    for step in ctx.steps(total):
        batch = next(it)
        accelerator.backward(loss_of(ddp, batch))
        with ctx.commit():
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
    accelerator.end_training()      # sres keeps the group until every rank is done

A prepared loader without ``use_stateful_dataloader`` cannot say where it is (its ``state_dict``
fails: "no attribute 'dl_state_dict'"), and it creates its iterator lazily, at the first batch,
drawing from the global random stream and re-seeding its sampler then. ``resumable`` gives it a
position (epoch, batches of the epoch, the sampler's generator as the epoch began) and, resumed
inside an epoch, skips the trained batches with accelerate's ``skip_first_batches`` (indices only)
while keeping the global streams as the fault-free run had them at that step.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

try:
    from accelerate.data_loader import skip_first_batches
except ImportError as missing:  # the framework is the user's; sres does not depend on it
    raise ImportError(
        f"{__name__} needs accelerate: pip install 'slurm-resilience[accelerate]' ({missing})"
    ) from missing

from resilience.state.committed import PerRank


def resumable(loader: Any) -> "Resumable":
    """Batches of an ``Accelerator.prepare``-d loader, epoch after epoch, with a position a commit
    holds (register it: ``ctx.register(loader=resumable(data))``)."""
    return Resumable(loader)


class Resumable(PerRank):
    """An endless iterator over a prepared loader's epochs (see the module)."""

    def __init__(self, loader: Any) -> None:
        super().__init__({})
        self.loader = loader
        self.epoch = 0
        self.batches = 0
        """Batches of ``epoch`` handed out."""
        self._generator_at_start: torch.Tensor | None = None
        self._iterator: Iterator[Any] | None = None
        self._resumed = False

    def __iter__(self) -> "Resumable":
        return self

    def __next__(self) -> Any:
        while True:
            if self._iterator is None:
                self._iterator = self._start_epoch()
            try:
                batch = next(self._iterator)
            except StopIteration:
                self.epoch, self.batches, self._iterator = self.epoch + 1, 0, None
                continue
            self.batches += 1
            return batch

    def _start_epoch(self) -> Iterator[Any]:
        generator = getattr(self.loader, "synchronized_generator", None)
        if self._resumed and self._generator_at_start is not None and generator is not None:
            generator.set_state(self._generator_at_start)  # this epoch's order again
        elif generator is not None:
            self._generator_at_start = generator.get_state()
        self.loader.set_epoch(self.epoch)
        skip, self._resumed = (self.batches if self._resumed else 0), False
        if not skip:
            return iter(self.loader)
        # Inside the epoch: the fault-free run drew its iterator's seed from the global stream when
        # the epoch began, long before this step; drawing it again here would shift every later draw.
        with torch.random.fork_rng(devices=[]):
            iterator = iter(skip_first_batches(self.loader, skip))
            try:
                first = next(iterator)
            except StopIteration:  # the commit took the epoch's last batch: the next epoch begins
                return iter(())
        return _chain(first, iterator)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches": self.batches, "generator": self._generator_at_start}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self._generator_at_start = state["generator"]
        self._iterator, self._resumed = None, True


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
