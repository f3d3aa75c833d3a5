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
from safetensors.torch import save_file

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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.rename(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.stat().st_size


def read(path: Path, verify: bool = True) -> CachedBatch:
    """The batch in ``path``, its tensors mapped; :class:`CorruptBatch` when it is not whole."""
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise CorruptBatch(f"{path}: not a batch file of this format ({meta.get('format')!r})")
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - not a dict
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
