"""The tiers, cheapest first: the order in which a restore prefers them.

Adding a tier: one module with a :class:`~resilience.tiers.base.Tier`, one line below. The
saver then gives it a background lane when a job's saves feed it (``Tier.saves``), and the
contract tests run it.
"""

from __future__ import annotations

from resilience.tiers.base import Tier
from resilience.tiers.neighbour import NeighbourTier
from resilience.tiers.persistent import PersistentTier
from resilience.tiers.ram import RamTier

RAM, NEIGHBOUR, PERSISTENT = RamTier(), NeighbourTier(), PersistentTier()
"""The three tiers the save pipeline feeds, a lane each: RAM, then a push to the neighbour, then
every K-th commit to persistent storage (resilience.tiers.saver)."""

TIERS: tuple[Tier, ...] = (
    RAM,
    NEIGHBOUR,
    PERSISTENT,
)
NAMES: tuple[str, ...] = tuple(t.name for t in TIERS)


def tier(name: str) -> Tier:
    for t in TIERS:
        if t.name == name:
            return t
    raise KeyError(f"no checkpoint tier {name!r} (known: {', '.join(NAMES)})")


def cost(name: str) -> int:
    """A tier's rank in cost (0 = cheapest)."""
    return NAMES.index(name)
