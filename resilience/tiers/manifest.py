"""One rank's checkpoint on disk: its state files and the manifest that makes them valid.

A tier root holds ``step-<S>/rank-<R>/`` directories. Each holds one file per kind of
state (``replicated.bin``, ``sharded.bin``: a snapshot's skeleton and flat per-dtype
buffers, 64-byte aligned so that a reader can map them without a copy) and
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

import mmap
import os
import pickle
import shutil
import struct
import time
from collections.abc import Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

# The names of resilience.tiers.checkpoint_dirs (torch-free, for the epilog) and of the
# checkpoint errors stay importable from here, where the tiers and the tests take them.
from resilience.errors import CheckpointError as CheckpointError
from resilience.errors import CheckpointInvalid
from resilience.errors import OtherJob as OtherJob
from resilience.state.snapshot import Snapshot, checksum, matches
from resilience.tiers.checkpoint_dirs import MANIFEST, FileEntry, Manifest, rank_dir, read_manifest
from resilience.tiers.checkpoint_dirs import ranks_in as ranks_in
from resilience.tiers.checkpoint_dirs import step_dir as step_dir
from resilience.tiers.checkpoint_dirs import steps_in as steps_in

MAGIC = b"SRESCKP1"
ALIGN = 64


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
) -> Path:
    """Write a rank's snapshots (kind -> snapshot) as a checkpoint; the manifest last, then an
    atomic rename. Files named in ``share`` are not written: the manifest says which rank's
    directory holds them (see the module doc). Returns the checkpoint directory."""
    share = {name: owner for name, owner in (share or {}).items() if name[:-4] in snaps}
    final = rank_dir(root, step, rank)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        files = {}
        for kind, snap in snaps.items():
            name = f"{kind}.bin"
            files[name] = snapshot_entry(snap) if name in share else _write_snapshot(tmp / name, snap, fsync)
        layout = {kind: {k: v.numel() for k, v in snap.buffers.items()} for kind, snap in snaps.items()}
        manifest = Manifest(
            job_id, step, world_size, rank, files, layout, time.time() if now is None else now, shared=share
        )
        _write_atomic(tmp / MANIFEST, manifest.to_json().encode(), fsync)
        publish_dir(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def publish_dir(tmp: Path, final: Path) -> None:
    """Rename a finished checkpoint directory into place, replacing an older one of the same step."""
    if final.exists():
        old = final.with_name(f"{final.name}.old-{os.getpid()}")
        os.rename(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.rename(tmp, final)


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


def _header(snap: Snapshot) -> tuple[bytes, dict[str, int]]:
    """The file header (skeleton, per-dtype sizes and offsets) and the offsets themselves."""
    offsets: dict[str, int] = {}
    sizes = {k: v.numel() for k, v in snap.buffers.items()}
    # Offsets depend on the header length, which depends on the offsets: fix the header room.
    room = _align(16 + len(snap.skeleton) + 64 * (len(sizes) + 1) + 256)
    pos = room
    for key in sorted(snap.buffers):
        offsets[key] = pos
        pos = _align(pos + snap.buffers[key].numel() * snap.buffers[key].element_size())
    header = pickle.dumps(
        {"step": snap.step, "skeleton": snap.skeleton, "sizes": sizes, "offsets": offsets, "room": room},
        protocol=pickle.HIGHEST_PROTOCOL,
    )
    if 16 + len(header) > room:
        raise AssertionError("checkpoint header larger than its room")  # our bug, never user input
    return header, offsets


def snapshot_entry(snap: Snapshot) -> FileEntry:
    """The size and checksum of ``snap``'s file, without writing it."""
    header, offsets = _header(snap)
    return FileEntry(
        _file_size(snap, header, offsets), checksum(header, [snap.buffers[k] for k in sorted(snap.buffers)])
    )


def _file_size(snap: Snapshot, header: bytes, offsets: dict[str, int]) -> int:
    """The end of the last buffer (the header's end when there is none)."""
    if not snap.buffers:
        return 16 + len(header)
    last = max(snap.buffers)
    return offsets[last] + snap.buffers[last].numel() * snap.buffers[last].element_size()


def _write_snapshot(path: Path, snap: Snapshot, fsync: bool) -> FileEntry:
    header, offsets = _header(snap)
    size = _file_size(snap, header, offsets)
    with open(path, "wb") as f:
        f.write(MAGIC + struct.pack("<Q", len(header)) + header)
        for key in sorted(snap.buffers):
            f.seek(offsets[key])
            f.write(_bytes_of(snap.buffers[key]))
        f.truncate(size)  # an empty last buffer: a seek past the end alone does not extend the file
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return FileEntry(size, checksum(header, [snap.buffers[k] for k in sorted(snap.buffers)]))


def _bytes_of(t: torch.Tensor) -> memoryview:
    return memoryview(t.contiguous().view(torch.uint8).numpy())


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


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
        snap, header, buffers = _read_snapshot(where, copy)
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


def _read_snapshot(path: Path, copy: bool) -> tuple[Snapshot, bytes, list[torch.Tensor]]:
    try:
        with open(path, "rb") as f:
            check_writer(path, os.fstat(f.fileno()).st_uid)
            if copy:
                # Uninitialized memory: a zero-filled bytearray would touch every page twice.
                data: memoryview | mmap.mmap = memoryview(
                    torch.empty(os.fstat(f.fileno()).st_size, dtype=torch.uint8).numpy()
                ).cast("B")
                _read_fully(f, data)
            else:
                size = os.fstat(f.fileno()).st_size
                data = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) if size else memoryview(b"")
        if bytes(data[:8]) != MAGIC:
            raise CheckpointInvalid(f"{path}: not a checkpoint file (bad magic)")
        (length,) = struct.unpack("<Q", bytes(data[8:16]))
        header = bytes(data[16 : 16 + length])
        meta = pickle.loads(header)
        buffers = {}
        for key in sorted(meta["sizes"]):
            dtype = getattr(torch, key)
            count = meta["sizes"][key]
            if count == 0:
                buffers[key] = torch.empty(0, dtype=dtype)
                continue
            buffers[key] = torch.frombuffer(data, dtype=dtype, count=count, offset=meta["offsets"][key])
    except CheckpointInvalid:
        raise
    except FileNotFoundError:
        raise CheckpointInvalid(f"{path}: missing") from None
    except Exception as err:  # noqa: BLE001 - any parse failure is a bad file
        raise CheckpointInvalid(f"{path}: unreadable ({type(err).__name__}: {err})") from None
    snap = Snapshot(step=int(meta["step"]), skeleton=meta["skeleton"], buffers=buffers)
    return snap, header, [buffers[k] for k in sorted(buffers)]


def check_writer(path: Path, uid: int) -> None:
    """Refuse a checkpoint file another user wrote: its header (and the state's skeleton) is a
    pickle, and unpickling is running code. The run's own files are this user's (0700 RAM root,
    authenticated neighbour copies); one of another uid can only come from someone else
    (a shared persistent directory)."""
    if uid != os.geteuid():
        raise CheckpointInvalid(
            f"{path}: written by uid {uid}, not by this user: not read (a checkpoint file is code "
            "when unpickled; only the user's own are loaded)"
        )


def _read_fully(f: Any, view: memoryview) -> None:
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            raise CheckpointInvalid(f"{f.name}: shorter than its size")
        done += n


def copy_checkpoint(
    src: Path,
    dst_root: Path,
    step: int,
    rank: int,
    fsync: bool = False,
    share: Mapping[str, int] | None = None,
) -> Path:
    """Copy a complete checkpoint directory into another tier root; manifest last, then rename.
    Files named in ``share`` are not copied: the copy's manifest says which rank's directory
    of the same step holds them."""
    final = rank_dir(dst_root, step, rank)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
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
        publish_dir(tmp, final)
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
