"""One checkpoint tier: what it offers for a job, and writing, reading and pruning a rank's copy.

Every tier keeps checkpoints in the same on-disk form (``step-S/rank-R/``, manifest last:
:mod:`resilience.tiers.manifest`); a tier is *where* they live and *who* can read them.
The restore plan, the saver and the epilog use tiers only through this interface, so a new
tier is one module and one line in :mod:`resilience.tiers.registry`: the saver gives every
tier a job's saves feed a background lane of its own that calls ``write``
(:mod:`resilience.tiers.saver`), and the contract tests (tests/unit/test_tier_contract.py)
run against each tier through that same ``write``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from resilience.state.snapshot import Snapshot
from resilience.tiers import manifest as mf
from resilience.tiers.layout import NodeKey, TierConfig, prune
from resilience.tiers.transport import NeighbourLink

Source = Mapping[str, Snapshot] | Path
"""What a tier's ``write`` copies: a rank's state itself (kind -> snapshot: the saver's capture
buffers), or a complete checkpoint directory another tier wrote (copied file by file)."""

Report = Callable[[str, int, int, str], None]
"""``report(tier, owner, step, why)``: a copy was refused (becomes a ``checkpoint-invalid`` event)."""

SHARED_HOLDER = -1
"""Holder of an offer of a shared tier: every rank reads it itself."""


@dataclass(frozen=True)
class Where:
    """A rank's view of the tiers: its job's configuration, its node, the RAM root."""

    config: TierConfig
    node: NodeKey = 0
    ram_base: Path | None = None
    neighbour: Callable[[], NeighbourLink | None] | None = None
    """The next node's neighbour server, asked when a copy is sent: the plan, and with it the
    next node, changes between generations. None where nothing is sent."""
    generation: int = 0
    """The writing rank's generation: its manifests and neighbour copies carry it."""


@dataclass(frozen=True)
class Saving:
    """How the saver feeds a tier, besides ``write`` (:mod:`resilience.tiers.saver`)."""

    every_commit: bool = True
    """Takes every commit the saver captures. False: only those the configuration marks
    (every ``persist_every``-th) and flushes, for a tier too slow to take them all."""
    warn_each_failure: bool = False
    """Every failed save is a ``tier-warning`` ("NAME tier save failed"). False: one warning
    per streak of failures and a ``tier-resumed`` when a save works again."""
    announce: bool = False
    """Rank 0 emits ``checkpoint-saved`` (tier, step, seconds) for each copy: the saves that
    the run's metrics count, those a restarted job can resume from."""
    failures: tuple[type[BaseException], ...] = (OSError,)
    """The errors that mean "this copy failed" (a warning; training goes on and the next save
    retries). Any other error is a bug: the lane logs it."""


@dataclass(frozen=True)
class Offer:
    """A complete copy of ``owner``'s checkpoint at ``step`` that ``holder`` can serve."""

    tier: str
    holder: int
    owner: int
    step: int
    world_size: int
    interchangeable: bool = False
    """The copy holds no shard: its replicated state, the same on every rank, can serve any rank."""
    per_rank: bool = False
    """The copy holds its owner's own part too (random streams, loader positions): another rank
    served from it gets the replicated state only, and is no longer exact."""
    generation: int = 0
    """The generation that wrote it: a step's copies are restored from one generation."""


class Tier(ABC):
    """Where a job's checkpoints can live. Subclasses say where (``root``) and whether a job's
    saves write it (``saves``, ``keep``, ``saving``); they may change how offers are listed or
    how a copy gets there (``write``). The rest is the same for every tier."""

    name: ClassVar[str]
    """The tier's name in events and plans: a contract (``ram``, ``neighbour``, ``persistent``)."""
    shared: ClassVar[bool] = False
    """Every rank reads it directly (a shared filesystem), instead of a node's process serving it.
    Data-parallel ranks may then store their replicated state once (``persist_replicated_once``)."""
    saving: ClassVar[Saving] = Saving()

    @abstractmethod
    def root(self, where: Where) -> Path | None:
        """The directory of this job's checkpoints as seen from ``where``; None when the tier is off."""

    @abstractmethod
    def saves(self, config: TierConfig) -> bool:
        """Whether this job's saves write this tier (it may be readable when they do not)."""

    def keep(self, config: TierConfig) -> int | None:
        """How many complete copies of a rank the saver keeps after each of its writes; None
        when the saver never prunes this tier (whoever receives the copies does)."""
        return None

    def path(self, where: Where, step: int, owner: int) -> Path:
        return mf.rank_dir(self._root(where), step, owner)

    def offers(self, where: Where, holder: int, report: Report) -> list[Offer]:
        """Copies of this job held here with a valid manifest; every other copy is reported."""
        root = self.root(where)
        if root is None:
            return []
        out = []
        for step in mf.steps_in(root):
            for owner in mf.ranks_in(root, step):
                try:
                    m = mf.read_manifest(mf.rank_dir(root, step, owner), where.config.job_id)
                except mf.CheckpointInvalid as err:
                    report(self.name, owner, step, str(err))
                    continue
                kinds = set(m.layout)
                out.append(
                    Offer(
                        self.name,
                        holder,
                        owner,
                        step,
                        m.world_size,
                        "replicated" in kinds and "sharded" not in kinds,
                        "rank" in kinds,
                        m.generation,
                    )
                )
        return out

    def write(
        self,
        where: Where,
        step: int,
        world_size: int,
        rank: int,
        source: Source,
        share: Mapping[str, int] | None = None,
    ) -> Path | None:
        """Write ``rank``'s copy of ``step`` into this tier (manifest last, atomic): the state
        itself when this is the first tier a save reaches, else the first tier's directory,
        so that a slow tier never holds a capture buffer. ``share``: files left to another
        rank's directory of the same step (manifest.py).

        Returns the new copy's directory; None when the tier has nowhere to put it now (the
        copy is skipped: neither a success nor a failure). Raises ``saving.failures`` when
        the copy failed."""
        root, fsync = self._root(where), self.shared and where.config.fsync
        group = self.shared and where.config.share_group
        if isinstance(source, Path):
            return mf.copy_checkpoint(source, root, step, rank, fsync=fsync, share=share, group=group)
        return mf.write(
            root,
            where.config.job_id,
            step,
            world_size,
            rank,
            source,
            fsync=fsync,
            share=share,
            group=group,
            generation=where.generation,
        )

    def read(
        self, where: Where, step: int, owner: int, world_size: int, kinds: Collection[str] | None = None
    ) -> dict[str, Snapshot]:
        """``owner``'s snapshots at ``step``, every checksum verified; a bad copy raises
        CheckpointInvalid naming this tier and the file."""
        path = self.path(where, step, owner)
        try:
            m = mf.read_manifest(path, where.config.job_id, world_size)
            if m.step != step or m.rank != owner:
                raise mf.CheckpointInvalid(f"{path / mf.MANIFEST}: says step {m.step} rank {m.rank}")
            # A shared filesystem's pages are not this node's memory: copy them in.
            return mf.load(path, m, verify=True, copy=self.shared, kinds=tuple(kinds) if kinds else None)
        except mf.CheckpointInvalid as err:
            raise mf.CheckpointInvalid(f"{self.name} tier: {err}") from None

    def prune(self, where: Where, keep: int, pinned: Collection[int] = (), owner: int | None = None) -> None:
        """Keep the newest ``keep`` complete copies (and anything newer); never a pinned step."""
        root = self.root(where)
        if root is not None:
            prune(root, keep, set(pinned), owner, where.config.job_id)

    def _root(self, where: Where) -> Path:
        root = self.root(where)
        if root is None:
            raise mf.CheckpointError(f"the {self.name} tier is off for job {where.config.job_id}")
        return root
