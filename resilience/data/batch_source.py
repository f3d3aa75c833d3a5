"""Where a cached batch comes from: a :class:`BatchSource` (one rank asks, the producer makes).

A source is split in two so that the cache can be keyed by what a batch *is*, not by who asks:
``want(step, rank, world)`` runs in the rank and names the batch as JSON data (a dataset's:
the indices of its samples, which the rank's :class:`~resilience.ElasticSampler` gives from its
committed state, so a resized world asks for the right ones); ``make(step, args)`` runs in the
node's producer and builds the batch from those data alone. Two ranks, or two worlds, that want
the same samples read the same entry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from resilience.elastic import ElasticSampler


class BatchSource(Protocol):
    """What a batch cache reads from; :class:`SampleSource` and :class:`FunctionSource` are two."""

    workers: int
    """Processes the node's producer makes batches with (0: in the producer itself)."""

    def want(self, step: int, rank: int, world_size: int) -> Any:
        """The batch of ``rank`` at ``step`` as JSON data (lists, numbers, strings): its entry's key."""

    def make(self, step: int, args: Any) -> Any:
        """The batch that ``args`` (from :meth:`want`) names: tensors in dicts, lists, tuples."""


class SampleSource:
    """A map-style dataset, an :class:`~resilience.ElasticSampler` and a collate function: a
    rank's batch at a step is its micro-batches (``sampler.indices``), each collated.

    The producer needs the dataset and ``collate`` only; the sampler's state (which follows
    commits and resizes) stays in the ranks, which must register it (``ctx.register(sampler=...)``).
    """

    def __init__(
        self,
        dataset: Any,
        sampler: ElasticSampler,
        collate: Callable[[list[Any]], Any] | None = None,
        workers: int = 0,
    ) -> None:
        if collate is None:
            from torch.utils.data import default_collate

            collate = default_collate
        self.dataset, self.sampler, self.collate, self.workers = dataset, sampler, collate, workers

    def want(self, step: int, rank: int, world_size: int) -> list[list[int]]:
        """The cache asks for the step being trained first: a new world size starts its segment
        there, and asking ahead at that size changes nothing of the sampler's state."""
        return self.sampler.indices(step, rank, world_size)

    def make(self, step: int, args: Sequence[Sequence[int]]) -> list[Any]:
        return [self.collate([self.dataset[i] for i in micro]) for micro in args]


class FunctionSource:
    """``fn(step, rank, world_size)``, a batch: for loops whose batches are a function of where
    a rank is (synthetic data, a sharded stream addressed by step). Keyed by (rank, world size):
    a resized world's batches are other entries."""

    def __init__(self, fn: Callable[[int, int, int], Any], workers: int = 0) -> None:
        self.fn, self.workers = fn, workers

    def want(self, step: int, rank: int, world_size: int) -> list[int]:
        return [rank, world_size]

    def make(self, step: int, args: Sequence[int]) -> Any:
        return self.fn(step, int(args[0]), int(args[1]))
