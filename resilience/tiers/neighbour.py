"""The neighbour tier: copies of the previous node's RAM tier, kept in this node's RAM.

They arrive over TCP after each save (:mod:`resilience.tiers.transport`), so that a node
that is lost whole can be restored from its neighbour's memory instead of from disk.
"""

from __future__ import annotations

from pathlib import Path

from resilience.tiers.base import Tier, Where
from resilience.tiers.layout import neighbour_root


class NeighbourTier(Tier):
    name = "neighbour"

    def root(self, where: Where) -> Path | None:
        return neighbour_root(where.config.job_id, where.node, where.ram_base) if where.config.ram else None
