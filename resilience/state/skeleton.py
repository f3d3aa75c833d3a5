"""A snapshot's skeleton as data: the structure and plain values of a state, written as JSON.

A skeleton is read back from tier files and from peers. It used to be a pickle, and
unpickling runs whatever the bytes name: a file another user planted, or a forged neighbour
copy, was code run as the victim. JSON only ever decodes to data. What JSON lacks is tagged,
so that every state real loops register (torch optimizers and schedulers, GradScaler, EMA,
StatefulDataLoader, random streams; surveyed) comes back exactly:

- ``{"$t": [...]}``: a tuple (Adam's betas);
- ``{"$f": "<16 hex digits>"}``: a non-finite float by its IEEE bits (ReduceLROnPlateau's inf);
- ``{"$d": [[key, value], ...]}``: a dict with a key that is not a str, or starts with ``$``
  (optimizer state is keyed by int);
- ``{"$T": i}``: the i-th tensor, whose bytes live in the snapshot's flat buffers. The same
  memory seen the same way under two keys (tied weights) is one tensor, named twice.

Ints of any size, finite floats (by ``repr``: exact), str, bool and None are JSON's own. An
``OrderedDict`` comes back a plain dict (``load_state_dict`` takes either). Anything else (a
NumPy scalar, a dataclass, a set, a namedtuple) is refused at the commit with the path to it:
before this format it was pickled, so a restore ran its class's code.
"""

from __future__ import annotations

import json
import struct
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from resilience.errors import NotPlainData

FORMAT = 2
"""1 was the pickle; files of format 1 are read by :mod:`resilience.tiers.legacy_files`."""


@dataclass(frozen=True)
class TensorRef:
    """Where a tensor lives inside the flat buffers."""

    dtype: str
    offset: int
    shape: tuple[int, ...]


def dtype_named(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (``"float32"``): names come from files and peers, so
    only a dtype is ever looked up, never another attribute of torch."""
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return dtype


def dumps(states: Any, tensors: list[torch.Tensor]) -> tuple[bytes, list[TensorRef], dict[str, int]]:
    """The skeleton of ``states``, its tensors appended to ``tensors`` (in buffer order), their
    places and the element count of each dtype's buffer."""
    tree = _strip(states, tensors, {})
    sizes: dict[str, int] = {}
    refs: list[TensorRef] = []
    for t in tensors:
        key = str(t.dtype).removeprefix("torch.")
        refs.append(TensorRef(key, sizes.get(key, 0), tuple(t.shape)))
        sizes[key] = sizes.get(key, 0) + t.numel()
    return assemble(tree, refs), refs, sizes


def assemble(tree: Any, refs: list[TensorRef]) -> bytes:
    """The skeleton's bytes: a tree (see :func:`from_plain`) and its tensors' places."""
    doc = {"format": FORMAT, "refs": [[r.dtype, r.offset, list(r.shape)] for r in refs], "state": tree}
    return json.dumps(doc, allow_nan=False, separators=(",", ":")).encode()


def loads(data: bytes) -> tuple[Any, list[TensorRef]]:
    """The tree (tensors still ``{"$T": i}``) and the tensor places; ValueError if ``data`` is
    not a skeleton of this format."""
    doc = json.loads(data)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a skeleton of format {FORMAT}")
    return doc["state"], refs_of(doc["refs"])


def refs_of(raw: Any) -> list[TensorRef]:
    refs = []
    for dtype, offset, shape in raw:
        if not (_count(offset) and all(_count(d) for d in shape)):
            raise ValueError(f"bad tensor place {[dtype, offset, shape]}")
        dtype_named(dtype)
        refs.append(TensorRef(dtype, offset, tuple(shape)))
    return refs


def _count(n: Any) -> bool:
    return type(n) is int and n >= 0


def fill(tree: Any, tensors: list[torch.Tensor]) -> Any:
    """The state the tree describes, with ``tensors`` in their places."""
    if isinstance(tree, list):
        return [fill(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        ((tag, value),) = tree.items()
        if tag == "$T":
            return tensors[value]
        if tag == "$t":
            return tuple(fill(v, tensors) for v in value)
        if tag == "$f":
            return struct.unpack(">d", bytes.fromhex(value))[0]
        if tag == "$d":
            return {fill(k, tensors): fill(v, tensors) for k, v in value}
    return {k: fill(v, tensors) for k, v in tree.items()}


class TensorIndex:
    """The i-th tensor's place in a state read from a pickle-format skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def from_plain(obj: Any) -> Any:
    """``obj`` (tensors already replaced by :class:`TensorIndex`) as a tree: how a skeleton of the
    pickle format becomes one of this format. Raises NotPlainData for what a tree cannot hold."""
    return _strip(obj, [], {})


_PLAIN = (str, int, bool, type(None))
_NO_KEY = object()


def _strip(obj: Any, tensors: list[torch.Tensor], seen: dict[tuple[Any, ...], int]) -> Any:
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    if kind is float:
        return obj if obj - obj == 0 else {"$f": struct.pack(">d", obj).hex()}
    if isinstance(obj, torch.Tensor):
        view = _view_of(obj)
        if view is None or view not in seen:
            tensors.append(obj)
            if view is not None:
                seen[view] = len(tensors) - 1
        return {"$T": seen[view] if view is not None else len(tensors) - 1}
    if kind is TensorIndex:
        return {"$T": obj.index}
    key: Any = _NO_KEY
    try:
        if kind is list or kind is tuple:
            items = []
            for key, value in enumerate(obj):
                items.append(_strip(value, tensors, seen))
            return items if kind is list else {"$t": items}
        if kind is dict or kind is OrderedDict:
            if all(type(k) is str and not k.startswith("$") for k in obj):
                out = {}
                for key, value in obj.items():
                    out[key] = _strip(value, tensors, seen)
                return out
            pairs = []
            for key, value in obj.items():
                pairs.append([_strip(key, tensors, seen), _strip(value, tensors, seen)])
            return {"$d": pairs}
    except NotPlainData as err:
        err.path = f"[{key!r}]{err.path}" if key is not _NO_KEY else err.path
        raise
    raise NotPlainData(obj)


def _view_of(t: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two tensors the same memory seen the same way: tied weights appear in a state
    dict under two keys (GPT-2's embedding and head; ``state_dict`` detaches each into a tensor
    object of its own), and are kept and moved once. None for tensors of other kinds
    (DTensor, tensor subclasses), which are kept each time they appear, as before."""
    if (
        type(t) not in (torch.Tensor, torch.nn.Parameter)
        or t.layout != torch.strided
        or t.is_meta
        or not t.numel()
    ):
        return None
    return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), t.dtype, tuple(t.shape), t.stride())
