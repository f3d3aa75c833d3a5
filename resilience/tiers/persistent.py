"""The persistent tier: a directory on a shared filesystem, written every K commits.

Every rank reads it directly, so only complete checkpoints (a manifest for every rank) are
offered, a step's replicated state may be stored once (rank 0's file; see manifest.py), and
rank 0 alone prunes, whole steps. A write that fails (a full disk) removes what it had
written: a full disk must not stay full of our debris.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection, Mapping
from pathlib import Path

from resilience.tiers import manifest as mf
from resilience.tiers.base import SHARED_HOLDER, Offer, Report, Saving, Source, Tier, Where
from resilience.tiers.layout import TierConfig, complete_steps


class PersistentTier(Tier):
    name = "persistent"
    shared = True
    saving = Saving(every_commit=False, announce=True)
    """Every K-th commit and flushes only (shared storage is slow); each copy is what a requeued
    job resumes from, so rank 0 says it."""

    def root(self, where: Where) -> Path | None:
        return Path(where.config.persistent_dir) if where.config.persistent_dir else None

    def saves(self, config: TierConfig) -> bool:
        return bool(config.persistent_dir)

    def keep(self, config: TierConfig) -> int | None:
        return config.keep_persistent

    def write(
        self,
        where: Where,
        step: int,
        world_size: int,
        rank: int,
        source: Source,
        share: Mapping[str, int] | None = None,
    ) -> Path | None:
        try:
            return super().write(where, step, world_size, rank, source, share)
        except OSError:
            # Leave nothing half-written behind (a full disk must not stay full of our debris).
            for tmp in mf.step_dir(self._root(where), step).glob(f"rank-{rank:05d}{mf.STAGING}*"):
                shutil.rmtree(tmp, ignore_errors=True)
            raise

    def prune(self, where: Where, keep: int, pinned: Collection[int] = (), owner: int | None = None) -> None:
        """One decision for every rank's copy of a step: rank 0 removes whole steps (see
        ``layout.prune``), the other ranks nothing. Ranks that pruned their own parts kept
        different steps (a lane drops a pending copy when a newer one comes, so ranks skip
        different steps), and rank 0's part of a step could go while another rank's manifest,
        naming rank 0's replicated file, stayed: a step half pruned."""
        if owner in (None, 0):
            super().prune(where, keep, pinned)

    def offers(self, where: Where, holder: int, report: Report) -> list[Offer]:
        root = self.root(where)
        if root is None:
            return []
        complete = complete_steps(root, where.config.job_id)
        out = []
        for step in mf.steps_in(root):
            if step in complete:
                try:  # one generation wrote them all (complete_steps)
                    generation = mf.read_manifest(mf.rank_dir(root, step, 0), where.config.job_id).generation
                except mf.CheckpointInvalid:
                    continue  # pruned since
                out += [
                    Offer(self.name, SHARED_HOLDER, r, step, complete[step], generation=generation)
                    for r in range(complete[step])
                ]
                continue
            for owner in mf.ranks_in(root, step):
                try:
                    mf.read_manifest(mf.rank_dir(root, step, owner), job_id=where.config.job_id)
                except mf.OtherJob:  # another job's checkpoints in the same directory are not our business
                    continue
                except mf.CheckpointInvalid as err:
                    report(self.name, owner, step, str(err))
        return out


def other_jobs(root: Path, job_id: str) -> dict[str, list[int]]:
    """Jobs other than ``job_id`` with checkpoints under ``root``, and their steps: one manifest
    read per step (a step is one job's: each rank directory is a job's write of it)."""
    found: dict[str, list[int]] = {}
    for step in mf.steps_in(root) if root.is_dir() else []:
        for rank in mf.ranks_in(root, step)[:1]:
            try:
                owner = mf.read_manifest(mf.rank_dir(root, step, rank)).job_id
            except mf.CheckpointInvalid:
                continue  # half written or damaged: not evidence of another job
            if owner != job_id:
                found.setdefault(owner, []).append(step)
    return found
