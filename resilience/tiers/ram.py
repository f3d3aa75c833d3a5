"""The RAM tier: this node's own copies in /dev/shm, outliving the processes that wrote them."""

from __future__ import annotations

from pathlib import Path

from resilience.tiers.base import Saving, Tier, Where
from resilience.tiers.layout import TierConfig, own_root


class RamTier(Tier):
    name = "ram"
    saving = Saving(warn_each_failure=True)
    """A failed RAM-tier save leaves that commit nowhere the other tiers could copy it from:
    each one is said."""

    def root(self, where: Where) -> Path | None:
        return own_root(where.config.job_id, where.node, where.ram_base) if where.config.ram else None

    def saves(self, config: TierConfig) -> bool:
        return config.ram

    def keep(self, config: TierConfig) -> int | None:
        return config.keep_ram
