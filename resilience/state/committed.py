"""What a commit protects, taken as of the commit: the three parts of a rank's state.

A commit is the unit of truth (see ../../ARCHITECTURE.md). Ordinary loops change registered
objects between commits (a data iterator advances, dropout draws from the random streams, a
scheduler steps), so the state each part holds must be *taken* at the commit, not read later
from live objects that moved on:

- ``replicated``: the same on every data-parallel rank; any peer serves it. Model parameters
  and optimizer moments are large and change only in ``optimizer.step()`` (inside the commit
  block), so they are kept by reference; what changes elsewhere (module buffers such as
  BatchNorm statistics, the optimizer's hyper-parameters, which schedulers set) and every
  other registered object (scheduler, EMA, scaler, sampler, dicts) is copied.
- ``sharded``: this rank's shard (FSDP2, ``ShardedOptimizer``); copied in the background.
- ``rank``: state that is this rank's own and nobody else's: its random streams (Python,
  NumPy, torch CPU, every initialised CUDA device) and its data loaders' positions. Small,
  copied at once; it travels to buddies and into the tiers, and a replaced rank gets its own.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

PARTS = ("replicated", "sharded", "rank")
RNG = "__sres_rng__"
"""The name of the random streams in the ``rank`` part (no registered object may take it)."""


class PerRank:
    """Marks a registered object whose state differs between ranks (``ctx.register(x=PerRank(obj))``).

    Data loaders are per rank without it. Anything else is taken for replicated state: the
    same on every rank, served by any peer, resharded after a resize.
    """

    per_rank = True

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def state_dict(self) -> Any:
        return self.obj.state_dict() if hasattr(self.obj, "state_dict") else self.obj

    def load_state_dict(self, state: Any) -> None:
        if hasattr(self.obj, "load_state_dict"):
            self.obj.load_state_dict(state)
        else:
            self.obj.clear()
            self.obj.update(state)


def part_of(obj: Any) -> str:
    """Which part of the commit ``obj``'s state belongs to."""
    if getattr(obj, "sharded", False):
        return "sharded"
    if getattr(obj, "per_rank", False) or isinstance(obj, torch.utils.data.DataLoader):
        return "rank"
    return "replicated"


def take(objects: Mapping[str, Any], rng: bool) -> dict[str, dict[str, Any]]:
    """Every registered object's state as of now, by part (see the module's docstring)."""
    out: dict[str, dict[str, Any]] = {part: {} for part in PARTS}
    for name, obj in objects.items():
        out[part_of(obj)][name] = _state(obj)
    if rng:
        out["rank"][RNG] = rng_state()
    return out


def small(parts: Mapping[str, Mapping[str, Any]], objects: Mapping[str, Any]) -> dict[str, Any]:
    """What to compare between two takes, by name: copied values as they are, tensors kept by
    reference as (storage, in-place version), so that a change made to them in place after the
    commit (outside ``optimizer.step()``) is seen without reading them."""
    out: dict[str, Any] = {name: _marked(state) for name, state in parts["rank"].items()}
    for name, state in parts["replicated"].items():
        obj = objects.get(name)
        if isinstance(obj, torch.nn.Module):
            buffers = _buffer_keys(obj, state)
            out[name] = {k: (v if k in buffers else _marked(v, 0)) for k, v in state.items()}
        elif isinstance(obj, torch.optim.Optimizer):
            out[name] = _marked(state, 0)
        else:
            out[name] = _marked(state)
    return out


def changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """Names whose state differs (tensors compared bitwise)."""
    return sorted(
        name
        for name in set(before) | set(after)
        if name not in before or name not in after or not same(before[name], after[name])
    )


def same(a: Any, b: Any) -> bool:
    if type(a) in (dict, list, tuple) and type(a) is type(b):
        try:  # plain values compare in C; a tensor inside makes == ambiguous: then item by item
            if (a == b) is True:
                return True
        except (RuntimeError, TypeError, ValueError):
            pass
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - objects without a usable ==: different unless the same object
        return a is b


LARGE = 64 * 1024
"""Bytes above which a registered object's tensor is kept by reference, not copied at each
commit (an EMA of the weights, say): its in-place version says whether it changed since."""


def _state(obj: Any) -> Any:
    if isinstance(obj, torch.nn.Module):
        state = obj.state_dict()
        buffers = _buffer_keys(obj, state)
        return {k: (v.clone() if k in buffers else v) for k, v in state.items()}
    if isinstance(obj, torch.optim.Optimizer) or getattr(obj, "sharded", False):
        return obj.state_dict()  # moments by reference (changed in step()); param_groups are fresh dicts
    return _copy(obj.state_dict() if hasattr(obj, "state_dict") else obj)


def _copy(value: Any) -> Any:
    """A copy that shares tensors larger than ``LARGE`` (their versions are compared instead)."""
    if isinstance(value, torch.Tensor):
        return value if value.numel() * value.element_size() > LARGE else value.detach().clone()
    if type(value) is dict:
        return {k: _copy(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_copy(v) for v in value)
    return copy.deepcopy(value)


def _marked(value: Any, large: int = LARGE) -> Any:
    """``value`` with every tensor kept by reference (over ``large`` bytes) replaced by
    (storage, in-place version)."""
    if isinstance(value, torch.Tensor):
        if value.numel() * value.element_size() > large:
            return ("tensor kept by reference", value.data_ptr(), value._version)
        return value
    if isinstance(value, Mapping):
        return {k: _marked(v, large) for k, v in value.items()}
    if type(value) in (list, tuple):  # a namedtuple is not built from one iterable
        return type(value)(_marked(v, large) for v in value)
    return value


def _buffer_keys(module: torch.nn.Module, state: Mapping[str, Any]) -> set[str]:
    params = {name for name, _ in module.named_parameters()}
    return {k for k in state if k not in params}


# --- random streams ----------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every random stream this process draws from, as tensors and plain values."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "mt": torch.from_numpy(np.array(mt, dtype=np.int64)), "gauss": gauss},
        "numpy": {
            "name": name,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["mt"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state(
        (n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.to(torch.uint8) for s in state["cuda"]])
