"""Tiered checkpoints: RAM, a neighbour node's RAM, persistent storage (see ARCHITECTURE.md).

The names here are what the rest of the project (and users) import; the modules beside this
one each do one part: ``base`` (the ``Tier`` interface), ``ram``, ``neighbour``, ``persistent``
(the tiers) and ``registry``, ``layout`` (where files live, configuration), ``job_cleanup`` (the epilog's),
``manifest`` (one rank's checkpoint on disk), ``saver`` (asynchronous saves) with ``lanes``
(its background lanes, one per tier), ``flush`` (the supervisor's "persist now"),
``transport`` (moving checkpoints between nodes), ``restore`` (which tier serves whom),
``agent`` (the tiers inside a rank), ``dcp`` (``torch.distributed.checkpoint`` through the tiers).
"""

from __future__ import annotations

from typing import Any

from resilience.contract.tier_config import TIERS_ENV, TierConfig, TierConfigError
from resilience.tiers.job_cleanup import cleanup_job
from resilience.tiers.layout import (
    DEFAULT_RAM_ROOT,
    RAM_ROOT_ENV,
    NodeKey,
    complete_steps,
    default_job_id,
    job_ram_dir,
    neighbour_node,
    neighbour_root,
    node_dir,
    own_root,
    prune,
    ram_root,
    record_job_config,
    remove_job,
)

__all__ = [
    "DEFAULT_RAM_ROOT",
    "RAM_ROOT_ENV",
    "TIERS_ENV",
    "NodeKey",
    "TierConfig",
    "TierConfigError",
    "cleanup_job",
    "complete_steps",
    "default_job_id",
    "job_ram_dir",
    "neighbour_node",
    "neighbour_root",
    "node_dir",
    "own_root",
    "prune",
    "ram_root",
    "record_job_config",
    "remove_job",
    "TieredStorageWriter",
    "TieredStorageReader",
]


def __getattr__(name: str) -> Any:
    # The DCP adapters import torch.distributed.checkpoint: loaded on first use only.
    if name in ("TieredStorageWriter", "TieredStorageReader"):
        from resilience.tiers import dcp

        return getattr(dcp, name)
    raise AttributeError(name)
