"""FSDP2 (``fully_shard``) state as sres keeps it: each rank's local shards, with their layout.

Under FSDP2 every parameter and every optimizer state is a DTensor whose local shard exists
on one rank only (once per replica group under HSDP). That state is *sharded*, like
``ShardedOptimizer``'s: it is snapshot at each commit and copied to buddy ranks on other
nodes, and a replaced rank receives exactly its own shards. ``ctx.register`` wraps an FSDP2
module and its optimizer in the adapters below, so user code registers them as it would any
model. The state dicts come from ``torch.distributed.checkpoint.state_dict``, which knows
FSDP2's names and an optimizer's lazily created state; what is added here is only the
snapshot form: a DTensor becomes its local tensor plus its placements, global shape and
stride, and is rebuilt on load on the live model's device mesh (a mesh holds process groups
of this generation: it cannot be stored).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

from resilience.errors import ResilienceError

DTENSOR = "__sres_dtensor__"
"""Marks a DTensor's snapshot form: ``{DTENSOR: local, "placements", "shape", "stride"}``."""


class ShardedModel:
    """An FSDP2 module's parameters and buffers: this rank's shards."""

    sharded = True

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return to_local(get_model_state_dict(self.module))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.module, from_local(_refuse_reshard(state), mesh_of(self.module)))

    def twins(self) -> tuple[int, ...]:
        return twins(self.module)


class ShardedModelOptimizer:
    """The optimizer of an FSDP2 module: its state is sharded as the parameters are."""

    sharded = True

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        return to_local(get_optimizer_state_dict(self.module, self.optimizer))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_optimizer_state_dict(self.module, self.optimizer, from_local(_refuse_reshard(state), mesh_of(self.module)))

    def twins(self) -> tuple[int, ...]:
        return twins(self.module)


def adapt(name: str, obj: Any, registered: Iterable[Any]) -> Any:
    """``obj`` as ``ctx.register`` keeps it: FSDP2 modules and optimizers of their parameters
    in an adapter above, anything else as it is. An optimizer's module must be registered first
    (or in the same call: ``register`` takes modules first)."""
    if isinstance(obj, FSDPModule):
        return ShardedModel(obj)
    if not isinstance(obj, torch.optim.Optimizer):
        return obj
    params = [p for group in obj.param_groups for p in group["params"]]
    if not any(isinstance(p, DTensor) for p in params):
        return obj
    for other in registered:
        if isinstance(other, ShardedModel) and any(p is params[0] for p in other.module.parameters()):
            return ShardedModelOptimizer(other.module, obj)
    raise TypeError(f"register({name}=...): the optimizer's parameters are FSDP2 shards of a model that is not "
                    f"registered; register the model too: ctx.register(model=model, {name}={name})")


def to_local(state: Any) -> Any:
    """``state`` with each DTensor replaced by its snapshot form (local tensor and layout)."""
    if isinstance(state, DTensor):
        return {DTENSOR: state.to_local(), "placements": _placements_out(state.placements),
                "shape": tuple(state.shape), "stride": tuple(state.stride())}
    if isinstance(state, dict):
        return {k: to_local(v) for k, v in state.items()}
    if isinstance(state, list):
        return [to_local(v) for v in state]
    return state


def from_local(state: Any, mesh: Any) -> Any:
    """The inverse of :func:`to_local`, on ``mesh``."""
    if isinstance(state, dict) and DTENSOR in state:
        return DTensor.from_local(state[DTENSOR], mesh, _placements_in(state["placements"]), run_check=False,
                                  shape=torch.Size(state["shape"]), stride=state["stride"])
    if isinstance(state, dict):
        return {k: from_local(v, mesh) for k, v in state.items()}
    if isinstance(state, list):
        return [from_local(v, mesh) for v in state]
    return state


def mesh_of(module: torch.nn.Module) -> Any:
    """The one device mesh of ``module``'s DTensor parameters."""
    meshes = {id(p.device_mesh): p.device_mesh for p in module.parameters() if isinstance(p, DTensor)}
    if len(meshes) != 1:
        raise ResilienceError(f"an FSDP2 model with parameters on {len(meshes)} device meshes: sres supports one mesh "
                              "(1-D FSDP or 2-D HSDP) per registered model")
    return next(iter(meshes.values()))


def twins(module: torch.nn.Module) -> tuple[int, ...]:
    """The other ranks that hold this rank's shards: those differing from it only along the mesh
    dimensions where the parameters are replicated (HSDP's replica groups; none under FSDP)."""
    param = next(p for p in module.parameters() if isinstance(p, DTensor))
    mesh, coordinate = param.device_mesh, param.device_mesh.get_coordinate()
    replicated = [dim for dim, placement in enumerate(param.placements) if placement.is_replicate()]
    if not replicated or coordinate is None:
        return ()
    index = tuple(slice(None) if dim in replicated else c for dim, c in enumerate(coordinate))
    me = mesh.mesh[tuple(coordinate)].item()
    return tuple(r for r in mesh.mesh[index].flatten().tolist() if r != me)


def _placements_out(placements: Iterable[Placement]) -> tuple[tuple[str, int], ...]:
    """Placements as plain values: a snapshot's skeleton is pickled, and pickle writes objects
    shared between tensors (FSDP2's placements are) differently from equal ones that are not,
    which would make equal states digest differently."""
    out = []
    for placement in placements:
        if isinstance(placement, Shard):
            out.append(("shard", placement.dim))
        elif isinstance(placement, Replicate):
            out.append(("replicate", 0))
        else:
            raise ResilienceError(f"a DTensor placed as {placement}: sres keeps Shard and Replicate placements only")
    return tuple(out)


def _placements_in(placements: Iterable[tuple[str, int]]) -> tuple[Placement, ...]:
    return tuple(Shard(dim) if kind == "shard" else Replicate() for kind, dim in placements)


def _refuse_reshard(state: dict[str, Any]) -> dict[str, Any]:
    if "shards" in state:  # what peers hand over after a resize (ShardedOptimizer reshards those)
        raise ResilienceError("FSDP2 state cannot yet be resharded to another world size from peers' memory; "
                              "resize an FSDP2 run through the persistent tier")
    return state
