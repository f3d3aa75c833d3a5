"""A node's batch cache on disk: one :mod:`batch file <resilience.data.batch_file>` per step and
what the batch is made of (its samples), so that any rank of any world layout finds it.

It lives in the job's RAM-tier directory on the node (``$SRES_RAM_ROOT/job-J/node-N/batches``,
:func:`batches_dir`): the user's alone (mode 0700, never a link: :mod:`resilience.private_paths`),
one copy for every rank of the node, outliving rank processes, and removed with the rest of the
job's RAM tier when the run ends or by the epilog (``job_cleanup``) when it could not.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import xxhash

from resilience.data import batch_file
from resilience.data.batch_file import CachedBatch
from resilience.errors import CacheTooSmall, CorruptBatch
from resilience.private_paths import private_dir
from resilience.tiers.layout import NodeKey, node_dir

NAME = re.compile(r"step-(\d{12})-([0-9a-f]{16})\.batch")


def batches_dir(job_id: str, node: NodeKey, root: Path | None = None) -> Path:
    return node_dir(job_id, node, root) / "batches"


def key_of(args: Any) -> str:
    """An entry's name for what its batch is made of (``args``, JSON data): the same samples
    give the same entry whichever rank, world or layout asks for them."""
    return xxhash.xxh3_64_hexdigest(json.dumps(args, separators=(",", ":")).encode())


class BatchStore:
    """The batch files of one cache directory, by step and key (:func:`key_of`), of one job."""

    def __init__(self, root: Path, job: str) -> None:
        self.root = private_dir(root)
        self.job = job

    def path(self, step: int, key: str) -> Path:
        return self.root / f"step-{step:012d}-{key}.batch"

    def put(self, step: int, batch: Any, args: Any) -> int:
        """Keep step ``step``'s batch, made of ``args``; the file's size."""
        return batch_file.write(self.path(step, key_of(args)), step, batch, args, self.job)

    def get(self, step: int, key: str) -> CachedBatch | None:
        """The entry, mapped; None when it is not here. A file that is not whole, or not this
        job's and step's, is removed and raises :class:`CorruptBatch`: its batch must be made
        again, never used."""
        path = self.path(step, key)
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise CorruptBatch(f"{path} is not a regular file")
        except FileNotFoundError:
            return None
        try:
            cached = batch_file.read(path)
            if (cached.step, cached.job) != (step, self.job) or key_of(cached.args) != key:
                raise CorruptBatch(f"{path} holds step {cached.step} of job {cached.job!r}, not this entry")
        except CorruptBatch:
            path.unlink(missing_ok=True)
            raise
        return cached

    def has(self, step: int, key: str) -> bool:
        return self.path(step, key).exists()

    def entries(self) -> list[tuple[int, str]]:
        """The (step, key) entries held, oldest step first."""
        found = (NAME.fullmatch(name) for name in os.listdir(self.root))
        return sorted((int(m.group(1)), m.group(2)) for m in found if m)

    def steps(self) -> list[int]:
        return sorted({step for step, _ in self.entries()})

    def keep(self, first: int, last: int) -> list[tuple[int, str]]:
        """Remove every entry of a step outside ``first..last``; the entries removed."""
        gone = [(step, key) for step, key in self.entries() if not first <= step <= last]
        for step, key in gone:
            self.path(step, key).unlink(missing_ok=True)
        return gone

    def size(self) -> int:
        """Bytes held by the batch files."""
        return sum(_size(self.path(*entry)) for entry in self.entries())


def _size(path: Path) -> int:
    """A batch file's bytes; 0 for one removed since it was listed (the producer and the other
    ranks of the node drop steps behind the window while this rank counts: seen in CI as a
    ``FileNotFoundError`` that failed a restarted rank's first step)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def check_room(root: Path, entry_bytes: int, entries: int) -> None:
    """Refuse, naming what is needed, a cache whose ``entries`` batches of ``entry_bytes`` would
    not fit in the filesystem of ``root`` (with what it already holds): the run would otherwise
    fail at a full /dev/shm in the middle of training, or push the node into swap."""
    vfs = os.statvfs(root)
    free = vfs.f_bavail * vfs.f_frsize
    held = sum(_size(f) for f in Path(root).glob("step-*.batch"))
    needed = entry_bytes * entries
    if needed > free + held:
        raise CacheTooSmall(
            f"the batch cache needs {needed / 2**20:.1f} MiB ({entries} batches of "
            f"{entry_bytes / 2**20:.1f} MiB) in {root}, which has {(free + held) / 2**20:.1f} MiB: "
            "lower prefetch or lookback, or give the node's /dev/shm more room"
        )
