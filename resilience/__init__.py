"""Inside each rank: keeping training state alive across faults (see ARCHITECTURE.md).

import resilience

def train(ctx: resilience.Context) -> None:
    ...
    ctx.register(model=model, optimizer=opt)
    for step in ctx.steps(total_steps):
        ...
        with ctx.commit():
            opt.step(); opt.zero_grad()

resilience.run(train)

The names below load on first use (PEP 562): ``import resilience.x`` runs this file first, and
the torch-free parts (``resilience.errors``, ``resilience.contract``, the RAM tier's paths and
cleanup that the admins' epilog uses) must not pull in torch through it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resilience.api import run
    from resilience.context import Context
    from resilience.data.batch_cache import BatchCache
    from resilience.data.batch_source import BatchSource, FunctionSource, SampleSource
    from resilience.ddp import ddp
    from resilience.elastic import ElasticSampler
    from resilience.errors import GradientNotRepresentable, Unrecoverable
    from resilience.exact import ExactDataParallel
    from resilience.micro_random import micro_batch_ids, micro_batch_rng
    from resilience.sharded import ShardedOptimizer
    from resilience.state.committed import PerRank

_WHERE = {
    "BatchCache": "resilience.data.batch_cache",
    "BatchSource": "resilience.data.batch_source",
    "Context": "resilience.context",
    "FunctionSource": "resilience.data.batch_source",
    "SampleSource": "resilience.data.batch_source",
    "run": "resilience.api",
    "ddp": "resilience.ddp",
    "ElasticSampler": "resilience.elastic",
    "ExactDataParallel": "resilience.exact",
    "GradientNotRepresentable": "resilience.errors",
    "PerRank": "resilience.state.committed",
    "ShardedOptimizer": "resilience.sharded",
    "Unrecoverable": "resilience.errors",
    "micro_batch_ids": "resilience.micro_random",
    "micro_batch_rng": "resilience.micro_random",
}
"""Each public name -> the module that defines it."""

__all__ = [
    "BatchCache",
    "BatchSource",
    "Context",
    "FunctionSource",
    "SampleSource",
    "run",
    "ddp",
    "ElasticSampler",
    "ExactDataParallel",
    "GradientNotRepresentable",
    "PerRank",
    "ShardedOptimizer",
    "Unrecoverable",
    "micro_batch_ids",
    "micro_batch_rng",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'resilience' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # once: later uses do not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """``resilience.ddp`` is the function users call, and also the name of the module that
    defines it: importing that module (the agent does) must not put the module in the
    function's place, as the import system would."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "ddp" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # By reference, as a plain module pickles: a function submitted from a script's
        # ``__main__`` names ``resilience`` among its globals, and cloudpickle finds no reducer
        # for a module subclass (its table is keyed by exact type).
        return importlib.import_module, (self.__name__,)


sys.modules[__name__].__class__ = _Package
