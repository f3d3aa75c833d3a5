"""Checkpoint files of the format before safetensors (magic ``SRESCKP1``): read only what is data.

Their header and the state's skeleton are pickles. A run upgraded between a save and a
restore (a requeue, a resume from the persistent tier) still has such files, and they are
its own (the caller refused any of another uid). They are unpickled by an unpickler that
knows three names, the ones that format's writer used for plain data (its tensor place and
reference, ``OrderedDict``); a pickle naming anything else would run code, and is refused
with one line naming the file and the name. The skeleton comes back in the data-only
format, so nothing past this module ever sees a pickle.
"""

from __future__ import annotations

import io
import pickle
import struct
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from resilience.errors import CheckpointInvalid, NotPlainData
from resilience.state import skeleton as skel
from resilience.state.snapshot import Snapshot

MAGIC = b"SRESCKP1"


class _OldRef:
    """The old format's tensor reference (a dataclass, rebuilt from its fields)."""

    dtype: str
    offset: int
    shape: tuple[int, ...]


_KNOWN: dict[tuple[str, str], Any] = {
    ("resilience.state.snapshot", "_Slot"): skel.TensorIndex,
    ("resilience.state.snapshot", "_TensorRef"): _OldRef,
    ("collections", "OrderedDict"): OrderedDict,
}


class _DataOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _KNOWN:
            return _KNOWN[(module, name)]
        raise pickle.UnpicklingError(f"it names {module}.{name}")


def _unpickle(data: bytes) -> Any:
    return _DataOnly(io.BytesIO(data)).load()


def read(path: Path, data: Any) -> tuple[Snapshot, bytes, list[torch.Tensor]]:
    """The snapshot in an old-format file whose bytes are ``data``, its header and its
    buffers in file order (what that format's checksum covers)."""
    try:
        (length,) = struct.unpack("<Q", bytes(data[8:16]))
        header = bytes(data[16 : 16 + length])
        meta = _unpickle(header)
        tree, old_refs = _unpickle(meta["skeleton"])
        skeleton = skel.assemble(
            skel.from_plain(tree), skel.refs_of([[r.dtype, r.offset, r.shape] for r in old_refs])
        )
        buffers = {}
        for key in sorted(meta["sizes"]):
            dtype, count = skel.dtype_named(key), meta["sizes"][key]
            buffers[key] = (
                torch.frombuffer(data, dtype=dtype, count=count, offset=meta["offsets"][key])
                if count
                else torch.empty(0, dtype=dtype)
            )
    except (pickle.UnpicklingError, NotPlainData) as err:
        raise CheckpointInvalid(
            f"{path}: a checkpoint of an older sres (pickle format) that is not plain data ({err}): "
            "not loaded; restore it with the sres that wrote it"
        ) from None
    return Snapshot(int(meta["step"]), skeleton, buffers), header, [buffers[k] for k in sorted(buffers)]
