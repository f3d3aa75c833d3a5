"""One step's batch as a file that every rank of a node maps without copying.

A batch is whatever a loader yields: tensors, in dicts (string keys), lists and tuples, with
plain values (numbers, strings, None) beside them. Its file is a safetensors file: a JSON header
then the tensors' raw bytes, which ``safe_open(...).get_tensor`` maps (a rank's batch costs no
copy and no memory of its own: measured, the pages count once per node, as shared memory). The
header's metadata holds the rest, as data, never as a pickle: the batch's structure with its
tensors named, the step, what the batch is made of (the source's ``args``: for a dataset, the
global indices of its samples, whatever the world's layout), the job it belongs to, and an xxh3
checksum of each tensor's bytes, checked on every read, so that a torn or corrupted file is
found and made again rather than trained on.

A file is written whole under a temporary name, then renamed: a reader sees the old file,
the new one, or none.

Every tensor a rank gets is 64-byte aligned, as one made in the loop is (torch's CPU allocator
aligns to 64): BLAS kernels take other paths for other alignments, and on AVX-512 machines an input
at 32 bytes past a boundary gives other bits than the same input aligned (measured here: 12 of 15
offsets change a linear layer's output and gradients). The writer therefore pads the header so that
the tensors' bytes start on a 64-byte boundary of the file (a mapping starts on a page), and the
reader copies any tensor that still is not aligned (one whose predecessor's size is not a multiple
of 64 bytes, or a file written before). Without that, a run fed from the cache trained on other bits
than the same run fed by the loop, on some machines and not others (the header's length decided).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from resilience.errors import CorruptBatch, UnsupportedBatch

FORMAT = "sres-batch/1"
TENSOR = "__sres_tensor__"
"""Marks a tensor's place in the structure: ``{TENSOR: name}``, the name of its bytes in the file."""
TUPLE = "__sres_tuple__"
"""Marks a tuple (JSON has lists only): ``{TUPLE: [items]}``."""
PLAIN = (bool, int, float, str, type(None))

__all__ = ["CachedBatch", "CorruptBatch", "UnsupportedBatch", "read", "write"]


@dataclass(frozen=True)
class CachedBatch:
    step: int
    batch: Any
    """Its tensors map the file copy-on-write: reading costs no copy, and a loop that changes its
    batch in place changes its own pages, never the file other ranks read."""
    args: Any
    """What the batch was made of, as JSON data (a dataset's: its samples' global indices)."""
    job: str = ""
    size: int = 0
    """The file's bytes."""


def write(path: Path, step: int, batch: Any, args: Any, job: str = "") -> int:
    """Write ``batch`` (step ``step``, made of ``args``, JSON data) to ``path``; its size in bytes."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(batch, tensors, "batch")
    metadata = {
        "format": FORMAT,
        "step": str(step),
        "job": job,
        "tree": json.dumps(tree),
        "args": json.dumps(args),
        "checksums": json.dumps({name: _checksum(t) for name, t in tensors.items()}),
    }
    data = _aligned(tensors, metadata)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.stat().st_size


ALIGN = 64
"""Bytes: the alignment of torch's CPU allocations, which a mapped tensor must match."""


def _aligned(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors bytes of ``tensors``, with the header's trailing spaces (which the format
    allows, and safetensors itself uses to reach a multiple of 8) extended so that the tensors'
    bytes start at a multiple of :data:`ALIGN`: one serialization, the data left as it is."""
    data = save(tensors, metadata=metadata)
    end = 8 + int.from_bytes(data[:8], "little")
    header = data[8:end].rstrip(b" ")
    length = -(-(8 + len(header)) // ALIGN) * ALIGN - 8
    return length.to_bytes(8, "little") + header.ljust(length) + data[end:]


def _own_aligned(t: torch.Tensor) -> torch.Tensor:
    return t if t.data_ptr() % ALIGN == 0 else t.clone()


def read(path: Path, verify: bool = True) -> CachedBatch:
    """The batch in ``path``, its tensors mapped; :class:`CorruptBatch` when it is not whole."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise CorruptBatch(f"{path}: not a batch file of this format ({meta.get('format')!r})")
            tensors = {name: _own_aligned(f.get_tensor(name)) for name in f.keys()}  # noqa: SIM118
        sums = json.loads(meta["checksums"])
        if set(sums) != set(tensors):
            raise CorruptBatch(f"{path}: its tensors are not those its header names")
        if verify:
            bad = sorted(name for name, t in tensors.items() if _checksum(t) != sums[name])
            if bad:
                raise CorruptBatch(f"{path}: checksum mismatch in {', '.join(bad)}")
        batch = _decode(json.loads(meta["tree"]), tensors)
        size = path.stat().st_size
        return CachedBatch(int(meta["step"]), batch, json.loads(meta["args"]), meta["job"], size)
    except FileNotFoundError:
        raise CorruptBatch(f"{path}: removed while read") from None
    except (SafetensorError, KeyError, ValueError, TypeError) as err:  # a torn header, a bad value
        raise CorruptBatch(f"{path}: {type(err).__name__}: {err}") from None


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(value, torch.Tensor):
        name = str(len(tensors))
        tensor = value.detach().cpu().contiguous()
        storage = tensor.untyped_storage().data_ptr()
        if any(storage == t.untyped_storage().data_ptr() for t in tensors.values()):
            tensor = tensor.clone()  # safetensors keeps no shared storage (the same tensor twice)
        tensors[name] = tensor
        return {TENSOR: name}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise UnsupportedBatch(f"{where}: a dict with keys that are not strings")
        if any(k.startswith("__sres_") for k in value):
            raise UnsupportedBatch(f"{where}: a key starting with '__sres_' (the file's own markers)")
        return {k: _encode(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if isinstance(value, list) else {TUPLE: items}
    if isinstance(value, PLAIN):
        return value
    raise UnsupportedBatch(
        f"{where}: {type(value).__name__!r} values cannot be cached; a cached batch holds tensors, dicts, "
        "lists, tuples and plain values (numbers, strings, None)"
    )


def _decode(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, dict):
        if set(tree) == {TENSOR}:
            return tensors[tree[TENSOR]]
        if set(tree) == {TUPLE}:
            return tuple(_decode(v, tensors) for v in tree[TUPLE])
        return {k: _decode(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_decode(v, tensors) for v in tree]
    return tree


def _checksum(tensor: torch.Tensor) -> str:
    """xxh3-64 of the tensor's bytes, read in place (any dtype, bfloat16 included)."""
    if tensor.numel() == 0:
        return xxhash.xxh3_64_hexdigest(b"")
    return xxhash.xxh3_64_hexdigest(tensor.reshape(-1).view(torch.uint8).numpy())
