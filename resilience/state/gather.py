"""What ranks tell each other over the state group before they move any state (what each holds,
what each tier offers, which copy failed): JSON, checked field by field, never a pickle.

``dist.all_gather_object`` unpickles what every peer sends, and gloo's connections are not
authenticated: a peer is found through the signed store, but its listening port takes any
connection, so bytes on a gloo socket are not proof that a rank of this run wrote them. A pickle
from there runs whatever it names in the rank, with the user's files and the model in reach.
JSON runs nothing; a message that does not decode, or whose fields are not of their declared
types, ends the recovery with :class:`~resilience.errors.Unrecoverable` on every rank alike
(the supervisor then tries again), never a value of another type deep in a plan.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from resilience.errors import Unrecoverable

MAX_BYTES = 64 << 20
"""Largest message a rank accepts from a peer: every rank checks the sizes it gathered before the
payloads, so all refuse alike instead of one allocating what a peer announced."""

D = TypeVar("D")


def all_gather_json(value: Any, group: dist.ProcessGroup | None, what: str) -> list[Any]:
    """``value`` (plain JSON data) from every rank of ``group``, in group rank order: the
    length of each rank's JSON first, then the bytes (as ``all_gather_object`` moves its
    pickles). ``what`` names the messages in the error a bad one raises."""
    data = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    world = dist.get_world_size(group)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=group)
    lengths = [int(s.item()) for s in sizes]
    wrong = [rank for rank, n in enumerate(lengths) if not 0 < n <= MAX_BYTES]
    if wrong:
        raise Unrecoverable(
            f"{what}: rank {wrong[0]} announced {lengths[wrong[0]]} bytes (1 to {MAX_BYTES} taken)"
        )
    longest = max(lengths)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    received = [torch.empty(longest, dtype=torch.uint8) for _ in range(world)]
    dist.all_gather(received, mine, group=group)
    return [
        decoded(raw[:n].numpy().tobytes(), f"{what} from rank {rank}")
        for rank, (raw, n) in enumerate(zip(received, lengths))
    ]


def decoded(data: bytes, what: str) -> Any:
    """A peer's JSON as data; anything else (bytes that are no UTF-8 JSON, NaN, nesting past
    Python's recursion limit) raises Unrecoverable naming ``what``, never another error."""
    try:
        return json.loads(data, parse_constant=_no_constant)
    except (ValueError, RecursionError) as err:  # JSONDecodeError is a ValueError
        raise Unrecoverable(f"{what} is not JSON ({str(err)[:200]})") from None


def to_json(instance: Any) -> dict[str, Any]:
    """A dataclass of plain fields as JSON data (tuples become lists, mapping keys strings)."""
    return dataclasses.asdict(instance)


def from_json(kind: type[D], data: Any, what: str) -> D:
    """``kind`` (a dataclass of ``int``, ``bool``, ``str``, ``tuple[int, ...]`` and
    ``Mapping[int, tuple[int, ...]]`` fields) from :func:`to_json`'s data: exactly its fields,
    each of its declared type (``true`` is no int here), else Unrecoverable naming ``what``."""
    hints = typing.get_type_hints(kind)
    names = [f.name for f in dataclasses.fields(kind)]  # type: ignore[arg-type]
    if not isinstance(data, dict) or sorted(data) != sorted(names):
        raise Unrecoverable(f"{what}: not the fields of {kind.__name__} ({str(data)[:200]})")
    try:
        return kind(**{name: _typed(data[name], hints[name]) for name in names})
    except (TypeError, ValueError) as err:
        raise Unrecoverable(f"{what}: {err}") from None


def _typed(value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in (int, bool, str):
        if type(value) is not hint:
            raise TypeError(f"{value!r:.80} is not {hint.__name__}")
        return value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if type(value) is not list:
            raise TypeError(f"{value!r:.80} is not a list")
        return tuple(_typed(v, args[0]) for v in value)
    if origin is Mapping and args[0] is int:
        if type(value) is not dict:
            raise TypeError(f"{value!r:.80} is not an object")
        return {_int_key(k): _typed(v, args[1]) for k, v in value.items()}
    raise TypeError(f"no JSON form for a field of type {hint}")  # our bug: a new field's type


def _int_key(key: str) -> int:
    """A mapping's int key, as ``json.dumps`` wrote it (``"7"``, ``"-1"``; not ``"07"``, ``" 7"``)."""
    number = int(key)
    if str(number) != key:
        raise ValueError(f"{key!r:.40} is not an int key")
    return number


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")
