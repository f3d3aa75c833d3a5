"""The RAM tier: this node's own copies in /dev/shm, outliving the processes that wrote them."""

from __future__ import annotations

from pathlib import Path

from resilience.tiers.base import Tier, Where
from resilience.tiers.layout import own_root


class RamTier(Tier):
    name = "ram"

    def root(self, where: Where) -> Path | None:
        return own_root(where.config.job_id, where.node, where.ram_base) if where.config.ram else None
