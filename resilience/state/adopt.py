"""A recovered module takes the restored tensors as its own instead of copying them in.

``register`` runs on every rank at each re-entry, over a model just built (its initialization
skipped: :mod:`resilience.skip_init`). ``load_state_dict`` copies every restored tensor into that
model's fresh parameters: 88 MB at 252 MiB of state, 0.03-0.05 s of the first step after a
recovery on our 2-core machine, on survivors and the replacement alike, and the fresh parameters'
pages touched only to be overwritten. The restored tensors are this rank's alone (the failed
generation's own objects, which nothing uses again, or state received apart for this recovery:
:class:`~resilience.state.transfer.Apart`), which the optimizer already relies on: its
``load_state_dict`` keeps the restored tensors as its state without a copy.

So each parameter and buffer is pointed at its restored tensor (``tensor.data = restored``). The
Parameter objects stay the same, so an optimizer built over them before ``register`` still steps
them; ``load_state_dict(assign=True)`` would make new Parameters and leave that optimizer
stepping tensors the model no longer uses. It is done only where the result is exactly what
``load_state_dict`` gives, and everything is copied the usual way otherwise:

- every module loads the plain way: torch's own ``_load_from_state_dict`` and extra state, no
  hooks (BatchNorm, FSDP and quantized modules load their own way);
- each tensor, on both sides, is the whole of its allocation: a parameter that is a view into
  something else (``ZeroRedundancyOptimizer``'s bucket views) must stay in it, and a restored
  tensor that is a view of a bigger buffer would make ``torch.save`` write that buffer whole;
- same shape, dtype, device and contiguity (``load_state_dict`` would cast or move), and no
  restored tensor under two keys that the model keeps apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_OWN_LOADING = (
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
)


def load_module(module: torch.nn.Module, state: Mapping[str, Any]) -> None:
    """``module.load_state_dict(state)``, without the copy where the result is the same."""
    own = _plain_state(module)
    if own is None or own.keys() != state.keys() or not _adoptable(own, state):
        module.load_state_dict(state)
        return
    with torch.no_grad():
        for key, tensor in own.items():
            tensor.data = state[key]


def _plain_state(module: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The module's own tensors by state-dict key, or None where loading is not plain."""
    for m in module.modules():
        kind = type(m)
        if (
            kind._load_from_state_dict is not torch.nn.Module._load_from_state_dict
            or kind.get_extra_state is not torch.nn.Module.get_extra_state
            or any(getattr(m, hooks) for hooks in _OWN_LOADING)
        ):
            return None
    own = module.state_dict(keep_vars=True)
    return own if all(type(t) in _PLAIN for t in own.values()) else None


def _adoptable(own: Mapping[str, torch.Tensor], state: Mapping[str, Any]) -> bool:
    if not all(_fits(own[k], state[k]) for k in own):
        return False
    pairs = {(id(own[k]), state[k].data_ptr()) for k in own}  # tied weights: one tensor, two keys
    return len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs})


def _fits(mine: torch.Tensor, restored: Any) -> bool:
    return (
        type(restored) is torch.Tensor
        and not restored.requires_grad
        and restored.shape == mine.shape
        and restored.dtype == mine.dtype
        and restored.device == mine.device
        and _whole(restored)
        and _whole(mine)
    )


def _whole(t: torch.Tensor) -> bool:
    """Contiguous and the whole of its allocation: nothing else can see or keep its memory."""
    return (
        t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    )
