"""``resilience.BatchCache``: each rank's batch for a step from a node-local, memory-mapped cache,
ready at once after a restart, a recovery or a resize (contract: the class, its arguments and
``batch(step)``; see docs/guide/batch-cache.md).

The rank names the batch it needs (its source's ``want``: for a dataset, the samples its
sampler gives at this world size) and the entries of the next ``prefetch`` steps; the node's
producer (:mod:`resilience.data.producer`, a process of its own that the supervisor keeps
running when ``resilience.run(train, batches=...)`` names the source) makes them ahead of time.
Entries are keyed by step and samples, never by rank layout, so a resized world keeps reading
the same cache, and the ``lookback`` steps before the current one stay, so a rank that re-enters
at a recent commit finds its batches. An entry that is missing or corrupt is made from the
source by the rank itself: a batch is always the source's, bitwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilience.data import wants
from resilience.data.batch_link import BatchLink
from resilience.data.batch_source import BatchSource
from resilience.data.batch_store import BatchStore, check_room, key_of
from resilience.errors import CorruptBatch, OptionError

if TYPE_CHECKING:
    from resilience.context import Context

log = logging.getLogger("resilience")

POLL_S = 0.002


class BatchCache:
    """Batches of ``source`` by step, from the node's cache. Register it (``ctx.register(batches=
    cache)``) before the first ``batch(step)``; register the source's sampler too."""

    def __init__(
        self, source: BatchSource, *, prefetch: int = 10, lookback: int = 2, wait_s: float = 30.0
    ) -> None:
        if prefetch < 1 or lookback < 0 or wait_s < 0:
            raise OptionError(
                f"BatchCache(prefetch={prefetch}, lookback={lookback}, wait_s={wait_s}): "
                "prefetch >= 1, lookback >= 0, wait_s >= 0"
            )
        self.source, self.prefetch, self.lookback, self.wait_s = source, prefetch, lookback, wait_s
        self._ctx: Context | None = None
        self._link: BatchLink | None = None
        self._entries: BatchStore | None = None
        self._wants: Path | None = None
        self._first = True
        self._room_checked = False
        self._producer_keeps_up = True
        """False from a wait for the producer that timed out to the next entry it made: a dead
        producer costs one ``wait_s``, not one per step until the supervisor restarts it."""
        self.clock: Callable[[], float] = time.monotonic

    @property
    def sampler(self) -> Any:
        """The source's sampler, if it has one (register it: its state follows commits)."""
        return getattr(self.source, "sampler", None)

    # --- ctx.register --------------------------------------------------------------------------

    def sres_bind(self, ctx: Context, link: BatchLink | None) -> None:
        """Called by ``ctx.register`` on each entry of ``train``: the rank, world and node now."""
        self._ctx, self._link, self._first = ctx, link, True
        self._entries = BatchStore(link.root, link.job) if link is not None else None
        self._wants = wants.folder(link.root) if link is not None else None

    def state_dict(self) -> dict[str, Any]:
        return {}  # what a batch is lives in the sampler's state; the cache holds only copies

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    # --- what the loop calls -------------------------------------------------------------------

    def batch(self, step: int) -> Any:
        """This rank's batch at ``step``: mapped from the cache (in-place changes stay this
        process's: the file is mapped copy-on-write), or made from the source when absent."""
        ctx = self._ctx
        if ctx is None:
            raise OptionError("BatchCache.batch() before ctx.register(batches=cache): register it first")
        t0 = self.clock()
        args = self.source.want(step, ctx.rank, ctx.world_size)
        if self._entries is None:  # no sres run around it: a pass-through
            return self.source.make(step, args)
        key = key_of(args)
        later = (
            (s, self.source.want(s, ctx.rank, ctx.world_size)) for s in range(step + 1, step + self.prefetch)
        )
        ahead = [wants.Want(s, key_of(a), a) for s, a in later]
        assert self._wants is not None
        wants.write(
            self._wants,
            wants.RankWants(ctx.rank, step, self.lookback, (wants.Want(step, key, args), *ahead)),
        )
        if not self._link.producer and ctx.local_rank == 0:  # no producer to drop what is past
            self._entries.keep(step - self.lookback, 1 << 62)
        batch, where = self._cached(step, key), "cache"
        if batch is None:
            batch, where = self.source.make(step, args), "source"
            size = self._entries.put(step, batch, args)
            self._check_room(size)
        if self._first:
            self._first = False
            assert self._link is not None
            seconds = round(self.clock() - t0, 6)
            self._link.push_event(
                "first-batch",
                rank=ctx.rank,
                step=step,
                generation=ctx.generation,
                source=where,
                seconds=seconds,
            )
        return batch

    def _cached(self, step: int, key: str) -> Any:
        assert self._entries is not None and self._link is not None
        deadline = self.clock() + (self.wait_s if self._link.producer and self._producer_keeps_up else 0.0)
        while True:
            try:
                cached = self._entries.get(step, key)
            except CorruptBatch as err:
                self._link.push_event(
                    "batch-corrupt", rank=self._ctx.rank if self._ctx else -1, step=step, error=str(err)
                )
                log.warning("batch cache: %s; made again from the source", err)
                return None
            if cached is not None:
                self._check_room(cached.size)
                self._producer_keeps_up = True
                return cached.batch
            if self.clock() >= deadline:
                if self._link.producer and self._producer_keeps_up:
                    self._producer_keeps_up = False  # a dead one is restarted: meanwhile, no wait per step
                    log.warning(
                        "batch cache: step %d not produced within %.0f s; made here", step, self.wait_s
                    )
                return None
            time.sleep(POLL_S)

    def _check_room(self, entry_bytes: int) -> None:
        if not self._room_checked and self._ctx is not None and self._entries is not None:
            self._room_checked = True
            ranks = self._ctx.place.local_world_size
            check_room(self._entries.root, entry_bytes, ranks * (self.prefetch + self.lookback + 1))
