"""One rank's checkpoint on disk: its state files and the manifest that makes them valid.

A tier root holds ``step-<S>/rank-<R>/`` directories. Each holds one file per kind of
state (``replicated.bin``, ``sharded.bin``: a snapshot in the safetensors format,
:mod:`resilience.tiers.tier_file`, which a reader maps without a copy) and
``manifest.json`` (step, job, world size, shard layout, per-file size and checksum).
A manifest may say that one of its files lives in another rank's directory of the same step
(``shared``): in the persistent tier, data-parallel ranks leave their replicated state to
rank 0's directory, so it is stored once; the reader checks that file against the sharing
rank's own checksum, so a rank whose state differed never loads rank 0's.

The files are written into a temporary directory, the manifest last, and the directory is
renamed into place: a checkpoint without a valid manifest is never complete, and a reader
never uses one. Every failure a reader can meet is a :class:`CheckpointInvalid` whose
message names the file and why, so that the events log can say it. Naming the directories
and reading a manifest need no torch: :mod:`resilience.tiers.checkpoint_dirs` (the epilog's).
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import time
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

# The names of resilience.tiers.checkpoint_dirs (torch-free, for the epilog) and of the
# checkpoint errors stay importable from here, where the tiers and the tests take them.
from resilience.errors import CheckpointError as CheckpointError
from resilience.errors import CheckpointInvalid
from resilience.errors import OtherJob as OtherJob
from resilience.state.snapshot import Snapshot, matches
from resilience.tiers import tier_file
from resilience.tiers.checkpoint_dirs import MANIFEST, Manifest, rank_dir, read_manifest, staging_dir
from resilience.tiers.checkpoint_dirs import STAGING as STAGING
from resilience.tiers.checkpoint_dirs import FileEntry as FileEntry
from resilience.tiers.checkpoint_dirs import ranks_in as ranks_in
from resilience.tiers.checkpoint_dirs import staging_pid as staging_pid
from resilience.tiers.checkpoint_dirs import step_dir as step_dir
from resilience.tiers.checkpoint_dirs import steps_in as steps_in


# --- writing --------------------------------------------------------------------------------------


def write(
    root: Path,
    job_id: str,
    step: int,
    world_size: int,
    rank: int,
    snaps: Mapping[str, Snapshot],
    fsync: bool = False,
    now: float | None = None,
    share: Mapping[str, int] | None = None,
    group: bool = False,
    generation: int = 0,
) -> Path:
    """Write a rank's snapshots (kind -> snapshot) as a checkpoint; the manifest last, then an
    atomic rename. Files named in ``share`` are not written: the manifest says which rank's
    directory holds them (see the module doc). ``group``: readable by the directory's group
    (:func:`private_step_dir`). Returns the checkpoint directory."""
    share = {name: owner for name, owner in (share or {}).items() if name[:-4] in snaps}
    final = rank_dir(root, step, rank)
    tmp = staging_dir(final)
    shutil.rmtree(tmp, ignore_errors=True)
    private_step_dir(tmp, group)
    try:
        files = {}
        for kind, snap in snaps.items():
            name = f"{kind}.bin"
            files[name] = tier_file.entry(snap) if name in share else tier_file.write(tmp / name, snap, fsync)
        layout = {kind: {k: v.numel() for k, v in snap.buffers.items()} for kind, snap in snaps.items()}
        manifest = Manifest(
            job_id,
            step,
            world_size,
            rank,
            files,
            layout,
            time.time() if now is None else now,
            shared=share,
            generation=generation,
        )
        _write_atomic(tmp / MANIFEST, manifest.to_json().encode(), fsync)
        if group:
            _readable_by_group(tmp)
        publish_dir(tmp, final, fsync)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def private_step_dir(tmp: Path, group: bool = False) -> None:
    """Make a rank's temporary directory and its step's, mode 0700 (the root's with the umask):
    a checkpoint is the user's alone by default, whatever the umask (022 left every step of a
    shared persistent directory readable by all), and no one else can plant a file beside its
    files. Inside a 0700 directory the files' own modes do not matter.

    ``group`` (the tiers' ``share_group``, asked for explicitly): 0750, and the files 0640 once
    written (:func:`_readable_by_group`), so the directory's group (a project's, where the root
    is setgid) can read and copy the checkpoint; it can never write into it. A run loads only
    its user's own files all the same."""
    mode = 0o750 if group else 0o700
    tmp.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if group:
        fd = os.open(tmp.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            if os.fstat(fd).st_uid == os.geteuid():  # another rank's of this user made it 0700
                os.fchmod(fd, mode)
        finally:
            os.close(fd)
    tmp.mkdir(mode=mode)
    os.chmod(tmp, mode)  # whatever the umask took away


def _readable_by_group(tmp: Path) -> None:
    for entry in os.scandir(tmp):
        if entry.is_file(follow_symlinks=False):
            os.chmod(entry.path, 0o640, follow_symlinks=False)


def publish_dir(tmp: Path, final: Path, fsync: bool = False) -> None:
    """Rename a finished checkpoint directory into place. A copy of the same step already there
    is exchanged with the new one in one step (``renameat2(RENAME_EXCHANGE)``) where the
    filesystem can, else renamed aside just before the new one goes in (both stay on disk in
    between), and removed after: there is no moment at which a crash loses the step. With
    ``fsync`` the parent directory is synced, so that the rename itself survives a crash."""
    if final.exists():
        if not _exchange(tmp, final):
            old = final.with_name(f"{final.name}.old-{os.getpid()}")
            os.rename(final, old)
            os.rename(tmp, final)
            tmp = old
        shutil.rmtree(tmp, ignore_errors=True)  # the replaced copy, now under a temporary name
    else:
        os.rename(tmp, final)
    if fsync:  # the rank's entry in the step's directory, and the step's (maybe new) entry in the root
        fsync_dir(final.parent)
        fsync_dir(final.parent.parent)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically; False where the kernel, libc or filesystem cannot (NFS)."""
    renameat2 = getattr(_libc(), "renameat2", None)
    if renameat2 is None:
        return False
    return bool(renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0)


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def write_manifest(path: Path, manifest: Manifest, name: str = MANIFEST, fsync: bool = False) -> None:
    """Write a manifest atomically (write, then rename): readers see all of it or nothing."""
    _write_atomic(Path(path) / name, manifest.to_json().encode(), fsync)


def _write_atomic(path: Path, data: bytes, fsync: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    os.rename(tmp, path)


# --- reading ------------------------------------------------------------------------------------


def load(
    path: Path,
    manifest: Manifest,
    verify: bool = True,
    copy: bool = False,
    kinds: Collection[str] | None = None,
) -> dict[str, Snapshot]:
    """kind -> snapshot of a checkpoint directory (only ``kinds`` when given), checksums
    verified.

    Without ``copy`` the buffers map the files (no copy: a RAM-tier file in /dev/shm is
    already memory); with it they are read into fresh memory.
    """
    out = {}
    for name, entry in manifest.files.items():
        kind = name[:-4] if name.endswith(".bin") else name
        if kinds is not None and kind not in kinds:
            continue
        where = manifest.path_of(path, name)
        snap, header, buffers = tier_file.read(where, copy)
        if verify and not matches(entry.checksum, header, buffers):
            why = (
                "file corrupt"
                if name not in manifest.shared
                else f"file corrupt, or it is not rank {manifest.rank}'s state"
            )
            raise CheckpointInvalid(f"{where}{manifest.sharer_note(name)}: checksum mismatch ({why})")
        out[kind] = snap
    return out


def verify(path: Path, manifest: Manifest) -> None:
    load(path, manifest, verify=True, copy=False)


def copy_checkpoint(
    src: Path,
    dst_root: Path,
    step: int,
    rank: int,
    fsync: bool = False,
    share: Mapping[str, int] | None = None,
    group: bool = False,
) -> Path:
    """Copy a complete checkpoint directory into another tier root; manifest last, then rename.
    Files named in ``share`` are not copied: the copy's manifest says which rank's directory
    of the same step holds them."""
    final = rank_dir(dst_root, step, rank)
    tmp = staging_dir(final)
    shutil.rmtree(tmp, ignore_errors=True)
    private_step_dir(tmp, group)
    try:
        try:
            manifest = read_manifest(src) if share else None
        except CheckpointInvalid:
            manifest = None  # copied as it is: a reader judges it, as it would have the original
        for entry in sorted(Path(src).iterdir(), key=lambda p: p.name == MANIFEST):
            if manifest is not None and (entry.name in share or entry.name == MANIFEST):
                continue
            _copy_file(entry, tmp / entry.name, fsync)
        if manifest is not None:
            shared = {**manifest.shared, **{n: o for n, o in share.items() if n in manifest.files}}
            write_manifest(tmp, replace(manifest, shared=shared), fsync=fsync)
        if group:
            _readable_by_group(tmp)
        publish_dir(tmp, final, fsync)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _copy_file(src: Path, dst: Path, fsync: bool) -> None:
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        size = os.fstat(fin.fileno()).st_size
        sent = 0
        while sent < size:
            n = os.sendfile(fout.fileno(), fin.fileno(), sent, min(size - sent, 1 << 30))
            if n == 0:
                raise OSError(f"short copy of {src}")
            sent += n
        if fsync:
            fout.flush()
            os.fsync(fout.fileno())
