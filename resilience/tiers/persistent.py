"""The persistent tier: a directory on a shared filesystem, written every K commits.

Every rank reads it directly, so only complete checkpoints (a manifest for every rank) are
offered, and a step's replicated state may be stored once (rank 0's file; see manifest.py).
"""

from __future__ import annotations

from pathlib import Path

from resilience.tiers import manifest as mf
from resilience.tiers.base import SHARED_HOLDER, Offer, Report, Tier, Where
from resilience.tiers.layout import complete_steps


class PersistentTier(Tier):
    name = "persistent"
    shared = True

    def root(self, where: Where) -> Path | None:
        return Path(where.config.persistent_dir) if where.config.persistent_dir else None

    def offers(self, where: Where, holder: int, report: Report) -> list[Offer]:
        root = self.root(where)
        if root is None:
            return []
        complete = complete_steps(root, where.config.job_id)
        out = []
        for step in mf.steps_in(root):
            if step in complete:
                out += [Offer(self.name, SHARED_HOLDER, r, step, complete[step]) for r in range(complete[step])]
                continue
            for owner in mf.ranks_in(root, step):
                try:
                    mf.read_manifest(mf.rank_dir(root, step, owner), job_id=where.config.job_id)
                except mf.OtherJob:  # another job's checkpoints in the same directory are not our business
                    continue
                except mf.CheckpointInvalid as err:
                    report(self.name, owner, step, str(err))
        return out
