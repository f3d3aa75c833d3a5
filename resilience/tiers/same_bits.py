"""Files a node already holds bit for bit, found by their manifest entry: a neighbour copy links
them instead of receiving them again.

In pure data parallelism every rank's replicated state (parameters and optimizer moments) is the
same at a step, and it is most of a RAM-tier copy. The node a copy is sent to has just written
the same file into its own RAM tier (its own rank took the same commit), and its earlier
receipts of that step may hold it too. A file is taken only where a complete copy of the same
job and step names it with the same size and checksum in its manifest (a manifest is written
last, so a copy that has one is complete); the checksum is verified again whenever the copy
is restored, as every copy's is, so a file that differs only fails that restore, as a corrupt
one would. Sharded state differs between ranks and is always sent. Linked, the bytes are held
once: a RAM tier's pruning of its own copy leaves the neighbour's link whole.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from resilience.tiers import manifest as mf


class SameBits:
    """Finds, in this node's own RAM tier (``own``) and the copies it received before
    (``received``), a file to link for another copy of one job."""

    WAIT_S = 2.0
    """How long a copy waits for this node's own copy of its step while one is being written:
    the two ranks took the same commit at the same time, and the sender's own write came first."""

    def __init__(
        self,
        job_id: str,
        own: Path | None,
        received: Path,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.job_id = job_id
        self.own = own
        self.roots = [r for r in (own, received) if r is not None]
        self.clock, self.sleep = clock, sleep

    def link(self, step: int, name: str, entry: mf.FileEntry | None, to: Path) -> bool:
        """Link a file of ``step`` named ``name`` whose manifest entry is ``entry`` to ``to``;
        False when this node holds none (or could not link it: another filesystem)."""
        if entry is None:
            return False
        deadline = self.clock() + self.WAIT_S
        while not self._link_one(step, name, entry, to):
            if not self._writing(step):
                return self._link_one(step, name, entry, to)  # it may have ended since the look
            if self.clock() >= deadline:
                return False
            self.sleep(0.005)
        return True

    def _writing(self, step: int) -> bool:
        """Whether this node's own copy of ``step`` is being written (its directory not yet
        renamed into place). Never other receipts: they wait on their senders, and two receipts
        of one step would wait on each other."""
        if self.own is None:
            return False
        try:
            entries = list(mf.step_dir(self.own, step).iterdir())
        except OSError:
            return False
        return any(_written_now(e.name) for e in entries)

    def _link_one(self, step: int, name: str, entry: mf.FileEntry, to: Path) -> bool:
        for found in self._candidates(step, name, entry):
            try:
                os.link(found, to, follow_symlinks=False)
                return True
            except FileNotFoundError:
                continue  # pruned meanwhile: another may still be there
            except OSError as err:
                if err.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    return False
                raise
        return False

    def _candidates(self, step: int, name: str, entry: mf.FileEntry) -> Iterator[Path]:
        for root in self.roots:
            for owner in mf.ranks_in(root, step):
                where = mf.rank_dir(root, step, owner)
                try:
                    manifest = mf.read_manifest(where, self.job_id)
                except mf.CheckpointInvalid:
                    continue
                path = where / name
                if name not in manifest.shared and manifest.files.get(name) == entry and _plain_file(path):
                    yield path


def _written_now(name: str) -> bool:
    """Whether ``name`` is a copy being written by a live process (:func:`mf.staging_dir`): a
    rank killed mid-write leaves its directory behind, and a copy waiting on it would wait its
    whole bound at every recovery."""
    pid = mf.staging_pid(name)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone's: alive
    return True


def _plain_file(path: Path) -> bool:
    """A regular file of this user's (never a link someone could have put there)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
