"""Modules built for a restore skip their random initialization: ``register`` overwrites it.

Every rank builds its model again on each entry of ``train``, survivors and replacement alike,
and ``ctx.register`` then loads the recovered state over every parameter. The initialization is
work the restore throws away: at 252 MiB the example MLP's took 0.1-0.3 s of the re-entry on this
machine, about a third of what the first step after a recovery costs beyond a steady one. Hugging
Face skips it the same way when it loads a checkpoint (``no_init_weights``).

Only ``torch.nn.init``'s functions are skipped (what ``reset_parameters`` of torch's layers
calls); a tensor filled any other way is filled as before. The tensors are allocated as usual, so
that every buffer a module computes at construction (rotary frequencies, masks) is still computed.
A parameter built inside and not then restored by ``register`` would hold uninitialized memory:
:meth:`Unfilled.check` refuses it at the first step, in one line. Outside a restore (the first
entry of a run, or nothing to restore) nothing is skipped: initialization stays exact.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from resilience.errors import RegistrationError

_SKIPPED = (
    "uniform_",
    "normal_",
    "trunc_normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "orthogonal_",
    "sparse_",
)


def _unchanged(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return tensor


class Unfilled:
    """The parameters built while initialization was skipped, until ``register`` restores them."""

    def __init__(self) -> None:
        self._built: list[tuple[weakref.ref[torch.nn.Module], str, weakref.ref[torch.Tensor]]] = []
        self._filled: set[int] = set()

    def built(self, module: torch.nn.Module, name: str, param: torch.Tensor | None) -> None:
        if param is not None:
            self._built.append((weakref.ref(module), name, weakref.ref(param)))

    def restored(self, module: torch.nn.Module) -> None:
        """``module``'s whole state was just loaded from the commit."""
        self._filled.update(id(p) for p in module.parameters())

    def check(self) -> None:
        """Refuse a parameter built inside the block that still holds its uninitialized memory:
        still a module's (FSDP2 replaces them with its shards) and not restored."""
        for module_ref, name, param_ref in self._built:
            module, param = module_ref(), param_ref()
            if module is None or param is None or module._parameters.get(name) is not param:
                continue
            if id(param) not in self._filled:
                raise RegistrationError(
                    f"a {type(module).__name__} built inside ctx.skip_init() was not restored by "
                    f"ctx.register(): its parameter {name!r} holds uninitialized memory; register "
                    f"the model that holds it, or build it outside skip_init()"
                )


@contextlib.contextmanager
def skipped(unfilled: Unfilled) -> Iterator[None]:
    """``torch.nn.init``'s functions leave their tensor as it is inside the block; every
    parameter registered meanwhile is noted in ``unfilled``."""
    saved = {name: getattr(torch.nn.init, name) for name in _SKIPPED if hasattr(torch.nn.init, name)}
    handle = register_module_parameter_registration_hook(unfilled.built)
    try:
        for name in saved:
            setattr(torch.nn.init, name, _unchanged)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.nn.init, name, fn)
        handle.remove()
