"""A framework's loader as one endless stream of batches, epoch after epoch, whose position a commit
holds: what ``ctx.register`` needs of a loader a framework wrapped (Fabric's, accelerate's).

Such a loader cannot say where it is, and it makes its iterator lazily, at the first batch of an
epoch, drawing its seed from the global random stream then. Resumed inside an epoch, the batches
the epoch trained are skipped (each framework's way: one method) and the new iterator is made
without touching the global stream: the fault-free run drew that seed when the epoch began, long
before this step, and a second draw here shifted every random number after it (the batches
matched; every dropout mask differed).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch


class EpochBatches:
    """Batches of ``loader``, epoch after epoch; ``state_dict`` is the position (per rank)."""

    per_rank = True  # committed.part_of: the rank part
    data_position = True
    """A loader's position, per rank: refused in a run whose world may change size (after a
    resize no rank would have one to resume from)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.epoch = 0
        self.batches = 0
        """Batches of ``epoch`` handed out."""
        self._iterator: Iterator[Any] | None = None
        self._resumed = False

    # --- the one extension point --------------------------------------------------------------

    def epoch_batches(self, skip: int) -> Iterable[Any]:
        """This epoch's batches (``self.epoch``) from its ``skip``-th on; ``resumed`` tells a
        pass that goes on from a commit from a new one."""
        raise NotImplementedError

    def extra_state(self) -> dict[str, Any]:
        """What else a position needs (a sampler's generator as the epoch began)."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Takes back what :meth:`extra_state` gave."""

    # --- the stream ------------------------------------------------------------------------------

    @property
    def resumed(self) -> bool:
        """The epoch about to begin goes on from a commit (loaded, not yet started)."""
        return self._resumed

    def __iter__(self) -> "EpochBatches":
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
        skip = self.batches if self._resumed else 0
        if not skip:
            iterator = iter(self.epoch_batches(0))
            self._resumed = False
            return iterator
        with torch.random.fork_rng(devices=[]):
            iterator = iter(self.epoch_batches(skip))
            self._resumed = False
            try:
                first = next(iterator)
            except StopIteration:  # the commit took the epoch's last batch: the next epoch begins
                return iter(())
        return _chain(first, iterator)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches": self.batches, **self.extra_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batches = int(state["epoch"]), int(state["batches"])
        self.load_extra_state(state)
        self._iterator, self._resumed = None, True


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
