"""One snapshot as one file: the ``*.bin`` of a checkpoint directory, in the safetensors format.

safetensors is a JSON header and raw tensor bytes; loading it runs no code, and any tool
that reads safetensors opens our checkpoints. A snapshot's flat per-dtype buffers are its
tensors (named by dtype: ``float32``), and the header's ``__metadata__`` carries the step
and the data-only skeleton (:mod:`resilience.state.skeleton`). A dtype safetensors has no
code for is stored as its bytes (``U8``) under its own name, and read back as that dtype.

The file is written here rather than by ``safetensors.torch.save_file``: the header must be
known without writing (a manifest names the size and checksum of a file another rank writes),
and the buffers go out from the snapshot's memory as they are. It is read by the library
(``safe_open`` maps the file: no copy). Buffers are laid out by element size, largest first,
after a header padded to 64 bytes, so each starts aligned to its element.

Files of the format before (a pickle header, magic ``SRESCKP1``) are read by
:mod:`resilience.tiers.legacy_files`, where that is safe. A file of another uid is refused before
it is read (:func:`check_writer`): its state would become the model.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from resilience.errors import CheckpointInvalid
from resilience.state import skeleton as skel
from resilience.state.snapshot import Snapshot, as_bytes, checksum
from resilience.tiers import legacy_files
from resilience.tiers.checkpoint_dirs import FileEntry

FORMAT = "sres-snapshot"
_CODES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_ALIGN = 64


def entry(snap: Snapshot) -> FileEntry:
    """The size and checksum of ``snap``'s file, without writing it."""
    return _entry(snap, *_header(snap))


def write(path: Path, snap: Snapshot, fsync: bool) -> FileEntry:
    header, order = _header(snap)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        for key in order:
            f.write(as_bytes(snap.buffers[key]))
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    return _entry(snap, header, order)


def read(path: Path, copy: bool) -> tuple[Snapshot, bytes, list[torch.Tensor]]:
    """The snapshot in ``path``, the header bytes and the buffers in file order (what the
    manifest's checksum covers). Without ``copy`` the buffers map the file. Every failure is a
    CheckpointInvalid naming the file; a file another user wrote is refused before it is read."""
    try:
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            check_writer(path, status.st_uid)
            start = f.read(8)
            if start == legacy_files.MAGIC:
                return legacy_files.read(path, _whole(f, status.st_size, copy))
            header = f.read(int.from_bytes(start, "little")) if len(start) == 8 else b""
        with safe_open(path, framework="pt") as st:
            meta = st.metadata() or {}
            if meta.get("format") != FORMAT:
                raise CheckpointInvalid(f"{path}: not a checkpoint file of sres (no {FORMAT} metadata)")
            buffers = {key: _typed(st.get_tensor(key), key, copy) for key in _order(st.keys())}
        step, skeleton = int(meta["step"]), meta["skeleton"].encode()
        skel.loads(skeleton)
    except CheckpointInvalid:
        raise
    except FileNotFoundError:
        raise CheckpointInvalid(f"{path}: missing") from None
    except Exception as err:  # noqa: BLE001 - any parse failure is a bad file
        raise CheckpointInvalid(f"{path}: unreadable ({type(err).__name__}: {err})") from None
    return Snapshot(step, skeleton, buffers), header, list(buffers.values())


def check_writer(path: Path, uid: int) -> None:
    """Refuse a checkpoint file another user wrote. Nothing in one runs code any more, but its
    state would become this run's model: the run's own files are this user's (0700 RAM root,
    authenticated neighbour copies), so one of another uid can only come from someone else
    (a shared persistent directory)."""
    if uid != os.geteuid():
        raise CheckpointInvalid(
            f"{path}: written by uid {uid}, not by this user: not read (only the user's own "
            "checkpoint files are loaded)"
        )


def _header(snap: Snapshot) -> tuple[bytes, list[str]]:
    order = _order(snap.buffers)
    entries: dict[str, Any] = {
        "__metadata__": {"format": FORMAT, "step": str(snap.step), "skeleton": snap.skeleton.decode()}
    }
    pos = 0
    for key in order:
        buf = snap.buffers[key]
        nbytes = buf.numel() * buf.element_size()
        code = _CODES.get(buf.dtype)
        shape = [buf.numel()] if code else [nbytes]
        entries[key] = {"dtype": code or "U8", "shape": shape, "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    raw = json.dumps(entries, separators=(",", ":")).encode()
    return raw + b" " * (-(8 + len(raw)) % _ALIGN), order


def _order(names: Any) -> list[str]:
    """Largest element first, then by name: every buffer starts aligned to its element."""
    return sorted(names, key=lambda k: (-skel.dtype_named(k).itemsize, k))


def _entry(snap: Snapshot, header: bytes, order: list[str]) -> FileEntry:
    """The file's size and the checksum of its header and buffers, in file order."""
    size = 8 + len(header) + sum(b.numel() * b.element_size() for b in snap.buffers.values())
    return FileEntry(size, checksum(header, [snap.buffers[k] for k in order]))


def _typed(t: torch.Tensor, key: str, copy: bool) -> torch.Tensor:
    dtype = skel.dtype_named(key)
    t = t if t.dtype == dtype else t.view(dtype)
    return t.clone() if copy else t


def _whole(f: Any, size: int, copy: bool) -> memoryview | mmap.mmap:
    if not copy:
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) if size else memoryview(b"")
    # Uninitialized memory: a zero-filled bytearray would touch every page twice.
    view = memoryview(torch.empty(size, dtype=torch.uint8).numpy()).cast("B")
    f.seek(0)
    done = 0
    while done < size:
        n = f.readinto(view[done:])
        if not n:
            raise CheckpointInvalid(f"{f.name}: shorter than its size")
        done += n
    return view
