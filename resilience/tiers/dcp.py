"""``torch.distributed.checkpoint`` through the tiers, for users of ``dcp.save/async_save/load``.

    writer = TieredStorageWriter(step, job_id="J", persistent_dir="/shared/ckpt")
    dcp.save(state_dict, storage_writer=writer)          # or dcp.async_save(...)
    dcp.load(state_dict, storage_reader=TieredStorageReader(job_id="J", persistent_dir="/shared/ckpt"))

The writer puts DCP's files in the RAM tier (``job-J/dcp/step-S`` on this node), each rank
seals its own files with a manifest (sizes, checksums) and copies them to the persistent
directory; the coordinator writes DCP's ``.metadata`` and the checkpoint's manifest last.
The reader takes the newest (or the given) step whose manifests and checksums all verify,
from the RAM tier first, else the persistent directory, and says which copy it refused and
why. DCP itself reshards, so a checkpoint loads on another world size.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from resilience.private_paths import NotPrivate, open_own_dir, open_private_dir, private_dir
from resilience.state.snapshot import checksum, matches
from resilience.tiers import manifest as mf
from resilience.tiers import tier_file
from resilience.tiers.layout import job_ram_dir
from resilience.tiers.registry import PERSISTENT, RAM

log = logging.getLogger("resilience")

DCP_DIR = "dcp"


def _rank_manifest(rank: int) -> str:
    return f"manifest-rank-{rank:05d}.json"


def _world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def _locations(
    job_id: str, persistent_dir: str | os.PathLike | None, ram: bool, ram_root: Path | None
) -> list[tuple[str, Path]]:
    out = []
    if ram:
        out.append((RAM.name, job_ram_dir(job_id, ram_root) / DCP_DIR))
    if persistent_dir is not None:
        out.append((PERSISTENT.name, Path(persistent_dir) / DCP_DIR))
    return out


class TieredStorageWriter(FileSystemWriter):
    """A DCP StorageWriter into the RAM tier and the persistent directory (see module doc)."""

    def __init__(
        self,
        step: int,
        *,
        job_id: str,
        persistent_dir: str | os.PathLike | None = None,
        ram: bool = True,
        ram_root: Path | None = None,
        sync_files: bool = True,
        **kwargs: Any,
    ) -> None:
        locations = _locations(job_id, persistent_dir, ram, ram_root)
        if not locations:
            raise ValueError("TieredStorageWriter needs the RAM tier or a persistent directory")
        self.step, self.job_id = step, job_id
        self.paths = [mf.step_dir(root, step) for _, root in locations]
        """Where the copies are; written through :attr:`targets`, their held descriptors."""
        self._sync = sync_files
        self.targets = []
        for path in self.paths:
            private_dir(path.parent)
            self.targets.append(_held(self, open_private_dir(path)))
        super().__init__(self.targets[0], sync_files=sync_files, **kwargs)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)  # the step given at construction names the checkpoint

    def write_data(self, plan: Any, planner: Any) -> Future:
        results = super().write_data(plan, planner).wait()
        rank, world = _world()
        names = sorted({r.storage_data.relative_path for r in results})
        entries = {name: file_entry(self.targets[0] / name) for name in names}
        sealed = mf.Manifest(self.job_id, self.step, world, rank, entries, created=time.time())
        mf.write_manifest(self.targets[0], sealed, _rank_manifest(rank), fsync=self._sync)
        for target in self.targets[1:]:
            for name in names:
                shutil.copyfile(self.targets[0] / name, target / name)
            mf.write_manifest(target, sealed, _rank_manifest(rank), fsync=self._sync)
        done: Future = Future()
        done.set_result(results)  # sealed: every file of this rank has its checksum
        return done

    def finish(self, metadata: Any, results: list) -> None:
        super().finish(metadata, results)
        _, world = _world()
        meta = file_entry(self.targets[0] / ".metadata")
        final = mf.Manifest(self.job_id, self.step, world, -1, {".metadata": meta}, created=time.time())
        for target in self.targets[1:]:
            shutil.copyfile(self.targets[0] / ".metadata", target / ".metadata")
        for target in self.targets:
            mf.write_manifest(target, final, fsync=self._sync)  # last: the checkpoint is complete


def file_entry(path: Path) -> mf.FileEntry:
    """Size and checksum of any file: DCP writes its own files, which are sealed this way."""
    data = _file_words(path)
    return mf.FileEntry(data.numel(), checksum(b"", [data]))


def file_matches(path: Path, entry: mf.FileEntry) -> bool:
    """Whether a file has the size and checksum of ``entry`` (of this version or an older one)."""
    data = _file_words(path)
    whole = data.numel() // 8 * 8  # how versions before xxHash cut a file (sum_checksum)
    words = [data[:whole].view(torch.int64), data[whole:]]
    return data.numel() == entry.size and matches(entry.checksum, b"", words)


def _file_words(path: Path) -> torch.Tensor:
    import numpy as np

    return torch.from_numpy(np.fromfile(path, dtype=np.uint8))


def _held(owner: object, fd: int) -> Path:
    """The path that reads and writes through ``fd``, closed when ``owner`` goes."""
    weakref.finalize(owner, os.close, fd)
    return Path(f"/proc/self/fd/{fd}")


def open_step(root: Path, step: int) -> int:
    """A descriptor of the step's directory when it and ``root`` are this user's and closed to
    others (see :func:`resilience.private_paths.open_own_dir`); raises CheckpointInvalid. DCP
    unpickles ``.metadata``: handed a path, torch would reopen it after our checks, and in a
    directory another user can write, a rename in between ran their code as this user."""
    path = mf.step_dir(root, step)
    try:
        root_fd = open_own_dir(Path(root))
    except NotPrivate as err:
        raise _refusal(Path(root), err) from None
    try:
        return open_own_dir(path, dir_fd=root_fd)
    except NotPrivate as err:
        raise _refusal(path, err) from None
    finally:
        os.close(root_fd)


def _refusal(path: Path, err: NotPrivate) -> mf.CheckpointInvalid:
    try:
        uid = os.lstat(path).st_uid
    except OSError:
        uid = os.geteuid()
    if uid != os.geteuid():
        return mf.CheckpointInvalid(
            f"{path}: written by uid {uid}, not by this user: not read (only the user's own "
            "checkpoints are loaded)"
        )
    return mf.CheckpointInvalid(str(err))


def verify_dcp_checkpoint(path: Path, job_id: str | None = None) -> mf.Manifest:
    """Check a DCP checkpoint directory: its manifest, every rank's manifest, every checksum.
    Raises CheckpointInvalid naming the bad file. The directory is read through a held
    descriptor (:func:`open_step`), so what is checked is what DCP loads after."""
    path = Path(path)
    fd = open_step(path.parent, int(path.name[5:]))
    try:
        return _verify_held(Path(f"/proc/self/fd/{fd}"), path, job_id)
    finally:
        os.close(fd)


def _verify_held(held: Path, path: Path, job_id: str | None) -> mf.Manifest:
    try:
        return _verify(held, job_id)
    except mf.CheckpointInvalid as err:
        raise type(err)(str(err).replace(str(held), str(path))) from None


def _verify(path: Path, job_id: str | None) -> mf.Manifest:
    top = mf.read_manifest(path, job_id)
    for item in Path(path).iterdir():  # DCP's .metadata is a pickle: nothing of another user's is read
        tier_file.check_writer(item, item.lstat().st_uid)
    for rank in range(top.world_size):
        ranked = mf.read_manifest(path, job_id, top.world_size, name=_rank_manifest(rank))
        for name, entry in {**ranked.files, **top.files}.items():
            if not file_matches(path / name, entry):
                raise mf.CheckpointInvalid(f"{path / name}: checksum mismatch (file corrupt)")
    return top


class TieredStorageReader(FileSystemReader):
    """A DCP StorageReader that picks a verified copy: RAM tier first, then persistent."""

    def __init__(
        self,
        step: int | None = None,
        *,
        job_id: str,
        persistent_dir: str | os.PathLike | None = None,
        ram: bool = True,
        ram_root: Path | None = None,
        on_refused: Callable[[str, Path, str], None] | None = None,
        **kwargs: Any,
    ) -> None:
        self.job_id = job_id
        self.refused: list[tuple[str, Path, str]] = []
        candidates = []
        for order, (tier, root) in enumerate(_locations(job_id, persistent_dir, ram, ram_root)):
            for s in [step] if step is not None else mf.steps_in(root):
                path = mf.step_dir(root, s)
                try:
                    fd = open_step(root, s)
                    held = _held(self, fd)
                    _verify_held(held, path, job_id)
                except mf.CheckpointInvalid as err:
                    self.refused.append((tier, path, str(err)))
                    log.warning("%s tier: refused %s", tier, err)
                    if on_refused is not None:
                        on_refused(tier, path, str(err))
                    continue
                candidates.append((s, -order, tier, path, held))
                break  # the newest valid copy of this tier
        if not candidates:
            why = "; ".join(f"{t}: {e}" for t, _, e in self.refused) or "no checkpoint found"
            raise mf.CheckpointInvalid(f"no valid DCP checkpoint of job {job_id}: {why}")
        # Newest step wins (a RAM tier re-written after a wipe may be older); cheapest tier on a tie.
        s, _, tier, self.path_shown, held = max(candidates)
        self.tier, self.step = tier, s
        super().__init__(held, **kwargs)  # DCP reads the directory that was verified

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        super().reset(None)
