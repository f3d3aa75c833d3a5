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

from collections.abc import Iterable
from typing import Any

import torch

try:
    from accelerate.data_loader import skip_first_batches
except ImportError as missing:  # the framework is the user's; sres does not depend on it
    raise ImportError(
        f"{__name__} needs accelerate: pip install 'slurm-resilience[accelerate]' ({missing})"
    ) from missing

from resilience.integrations.epochs import EpochBatches


def resumable(loader: Any) -> "Resumable":
    """Batches of an ``Accelerator.prepare``-d loader, epoch after epoch, with a position a commit
    holds (register it: ``ctx.register(loader=resumable(data))``)."""
    return Resumable(loader)


class Resumable(EpochBatches):
    """A prepared loader's epochs; its position also holds the sampler's generator as the epoch
    began (accelerate seeds it once, at ``prepare``, and each epoch's order draws from it)."""

    def __init__(self, loader: Any) -> None:
        super().__init__(loader)
        self._generator_at_start: torch.Tensor | None = None

    def epoch_batches(self, skip: int) -> Iterable[Any]:
        generator = getattr(self.loader, "synchronized_generator", None)
        if generator is not None and self.resumed and self._generator_at_start is not None:
            generator.set_state(self._generator_at_start)  # this epoch's order again
        elif generator is not None:
            self._generator_at_start = generator.get_state()
        self.loader.set_epoch(self.epoch)
        return skip_first_batches(self.loader, skip) if skip else self.loader

    def extra_state(self) -> dict[str, Any]:
        return {"generator": self._generator_at_start}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self._generator_at_start = state["generator"]
