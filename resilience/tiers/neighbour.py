"""The neighbour tier: copies of the previous node's RAM tier, kept in this node's RAM.

They arrive over TCP after each save (:mod:`resilience.tiers.transport`), so that a node
that is lost whole can be restored from its neighbour's memory instead of from disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from resilience.tiers import manifest as mf
from resilience.tiers.base import Saving, Source, Tier, Where
from resilience.tiers.layout import TierConfig, neighbour_root
from resilience.tiers.transport import push_checkpoint


class NeighbourTier(Tier):
    name = "neighbour"
    saving = Saving(failures=(OSError, ValueError))  # ValueError: an address or a header refused

    def root(self, where: Where) -> Path | None:
        return neighbour_root(where.config.job_id, where.node, where.ram_base) if where.config.ram else None

    def saves(self, config: TierConfig) -> bool:
        return config.neighbour

    def write(
        self,
        where: Where,
        step: int,
        world_size: int,
        rank: int,
        source: Source,
        share: Mapping[str, int] | None = None,
    ) -> Path | None:
        """Send ``rank``'s RAM-tier copy (a directory) to the next node's server, which keeps it
        in that node's neighbour root and prunes there; returns the directory sent, or None
        while there is no next node to send to. No collective: a dead neighbour costs a
        failed connect, never a hung rank."""
        link = where.neighbour() if where.neighbour is not None else None
        if link is None:
            return None
        if not isinstance(source, Path):
            raise mf.CheckpointError("the neighbour tier sends the RAM tier's directory, not the state")
        push_checkpoint(link, source, where.config.job_id, rank, step, generation=where.generation)
        return source
