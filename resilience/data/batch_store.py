"""A node's batch cache on disk: one :mod:`batch file <resilience.data.batch_file>` per step.

It lives in the job's RAM-tier directory on the node (``$SRES_RAM_ROOT/job-J/node-N/batches``,
:func:`batches_dir`): the user's alone (mode 0700, never a link: :mod:`resilience.private_paths`),
one copy for every rank of the node, outliving rank processes, and removed with the rest of the
job's RAM tier when the run ends or by the epilog (``job_cleanup``) when it could not.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from resilience.data import batch_file
from resilience.data.batch_file import CachedBatch
from resilience.errors import CacheTooSmall, CorruptBatch
from resilience.private_paths import private_dir
from resilience.tiers.layout import NodeKey, node_dir

NAME = re.compile(r"step-(\d{12})\.batch")


def batches_dir(job_id: str, node: NodeKey, root: Path | None = None) -> Path:
    return node_dir(job_id, node, root) / "batches"


class BatchStore:
    """The batch files of one cache directory, by step."""

    def __init__(self, root: Path) -> None:
        self.root = private_dir(root)

    def path(self, step: int) -> Path:
        return self.root / f"step-{step:012d}.batch"

    def put(self, step: int, batch: Any, indices: Sequence[int]) -> int:
        """Keep step ``step``'s batch (its samples ``indices``); the file's size."""
        return batch_file.write(self.path(step), step, batch, indices)

    def get(self, step: int) -> CachedBatch | None:
        """Step ``step``'s batch, mapped; None when it is not here. A file that is not whole is
        removed and raises :class:`CorruptBatch`: its batch must be made again, never used."""
        path = self.path(step)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise CorruptBatch(f"{path} is not a regular file")
        except FileNotFoundError:
            return None
        try:
            cached = batch_file.read(path)
        except CorruptBatch:
            path.unlink(missing_ok=True)
            raise
        if cached.step != step:
            path.unlink(missing_ok=True)
            raise CorruptBatch(f"{path} holds step {cached.step}")
        return cached

    def steps(self) -> list[int]:
        """The steps held, oldest first."""
        found = (NAME.fullmatch(name) for name in os.listdir(self.root))
        return sorted(int(m.group(1)) for m in found if m)

    def keep(self, first: int, last: int) -> list[int]:
        """Remove every step outside ``first..last``; the steps removed."""
        gone = [step for step in self.steps() if not first <= step <= last]
        for step in gone:
            self.path(step).unlink(missing_ok=True)
        return gone

    def size(self) -> int:
        """Bytes held by the batch files."""
        return sum(self.path(step).stat().st_size for step in self.steps())


def check_room(root: Path, entry_bytes: int, entries: int) -> None:
    """Refuse, naming what is needed, a cache whose ``entries`` batches of ``entry_bytes`` would
    not fit in the filesystem of ``root`` (with what it already holds): the run would otherwise
    fail at a full /dev/shm in the middle of training, or push the node into swap."""
    vfs = os.statvfs(root)
    free = vfs.f_bavail * vfs.f_frsize
    held = sum(f.stat().st_size for f in Path(root).glob("step-*.batch"))
    needed = entry_bytes * entries
    if needed > free + held:
        raise CacheTooSmall(
            f"the batch cache needs {needed / 2**20:.1f} MiB ({entries} batches of "
            f"{entry_bytes / 2**20:.1f} MiB) in {root}, which has {(free + held) / 2**20:.1f} MiB: "
            "lower prefetch or lookback, or give the node's /dev/shm more room"
        )
