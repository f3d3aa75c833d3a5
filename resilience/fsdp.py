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

After a resize, or from a persistent checkpoint of another world size, a rank is handed every
old rank's snapshot form (``{"shards": [...]}``): each DTensor is then assembled whole from
its shards and cut again for the new mesh (``distribute_tensor``), so FSDP2 state reshards
both from peers' memory and from the persistent tier. That holds the whole state on each rank
for the moment of the load: the price of resharding without a checkpoint library's planner.
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
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import _clear_sharding_prop_cache

from resilience.errors import ResilienceError

DTENSOR = "__sres_dtensor__"
"""Marks a DTensor's snapshot form: ``{DTENSOR: local, "placements", "shape", "stride", "index"}``;
``index`` is the shard's coordinate along each sharded mesh dimension (0 along replicated ones,
so that HSDP twins hold equal forms)."""


class ShardedModel:
    """An FSDP2 module's parameters and buffers: this rank's shards."""

    sharded = True

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def state_dict(self) -> dict[str, Any]:
        return to_local(get_model_state_dict(self.module))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_model_state_dict(self.module, on_mesh(state, mesh_of(self.module)))

    def twins(self) -> tuple[int, ...]:
        return twins(self.module)


class ShardedModelOptimizer:
    """The optimizer of an FSDP2 module: its state is sharded as the parameters are."""

    sharded = True

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        if not self.optimizer.state:
            # Before its first step. DCP would make the lazy state by stepping on zero gradients,
            # which AdamW counts: every later step's bias correction was one step off, and the
            # run ended with other parameters than the same run without sres.
            return {"state": {}, "param_groups": _hyperparameters(self.optimizer)}
        return to_local(get_optimizer_state_dict(self.module, self.optimizer))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = on_mesh(state, mesh_of(self.module))
        if not state["state"]:  # taken before the first step: nothing but the hyperparameters
            for group, saved in zip(self.optimizer.param_groups, state["param_groups"], strict=True):
                group.update(_without_params(saved))
            return
        set_optimizer_state_dict(self.module, self.optimizer, state)

    def twins(self) -> tuple[int, ...]:
        return twins(self.module)


def _hyperparameters(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [_without_params(group) for group in optimizer.param_groups]


def _without_params(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


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
    raise TypeError(
        f"register({name}=...): the optimizer's parameters are FSDP2 shards of a model that is not "
        f"registered; register the model too: ctx.register(model=model, {name}={name})"
    )


def to_local(state: Any) -> Any:
    """``state`` with each DTensor replaced by its snapshot form (local tensor and layout)."""
    if isinstance(state, DTensor):
        coordinate = state.device_mesh.get_coordinate() or [0] * state.device_mesh.ndim
        return {
            DTENSOR: state.to_local(),
            "placements": _placements_out(state.placements),
            "shape": tuple(state.shape),
            "stride": tuple(state.stride()),
            "index": tuple(c if p.is_shard() else 0 for c, p in zip(coordinate, state.placements)),
        }
    if isinstance(state, dict):
        return {k: to_local(v) for k, v in state.items()}
    if isinstance(state, list):
        return [to_local(v) for v in state]
    return state


def from_local(state: Any, mesh: Any) -> Any:
    """The inverse of :func:`to_local`, on ``mesh``."""
    if isinstance(state, dict) and DTENSOR in state:
        return DTensor.from_local(
            state[DTENSOR],
            mesh,
            _placements_in(state["placements"]),
            run_check=False,
            shape=torch.Size(state["shape"]),
            stride=state["stride"],
        )
    if isinstance(state, dict):
        return {k: from_local(v, mesh) for k, v in state.items()}
    if isinstance(state, list):
        return [from_local(v, mesh) for v in state]
    return state


def mesh_of(module: torch.nn.Module) -> Any:
    """The one device mesh of ``module``'s DTensor parameters.

    FSDP2 as its documentation and torchtitan apply it (``fully_shard`` on each block, then on
    the root) gives each call its own mesh object unless one is passed in: meshes are therefore
    one mesh when they are equal (:func:`mesh_key`), whatever their number of objects.
    """
    meshes = {mesh_key(p.device_mesh): p.device_mesh for p in module.parameters() if isinstance(p, DTensor)}
    if len(meshes) != 1:
        described = "; ".join(_describe(key) for key in meshes) or "none"
        raise ResilienceError(
            f"an FSDP2 model with parameters on {len(meshes)} different device meshes ({described}): "
            "sres supports one mesh (1-D FSDP or 2-D HSDP) per registered model"
        )
    return next(iter(meshes.values()))


def mesh_key(mesh: Any) -> tuple[Any, ...]:
    """What makes two device meshes the same mesh: device type, rank layout and dimension names
    (not the object, nor its process groups: those are the same ranks' in one generation)."""
    return mesh.device_type, tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()), mesh.mesh_dim_names


def _describe(key: tuple[Any, ...]) -> str:
    device_type, shape, ranks, names = key
    return f"{device_type} {'x'.join(map(str, shape))} ranks {list(ranks)}" + (
        f" dims {list(names)}" if names else ""
    )


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
    """Placements as plain values: a snapshot's skeleton holds data only (``Shard`` objects
    would be refused at the commit), and equal states must write equal skeletons."""
    out = []
    for placement in placements:
        if isinstance(placement, Shard):
            out.append(("shard", placement.dim))
        elif isinstance(placement, Replicate):
            out.append(("replicate", 0))
        else:
            raise ResilienceError(
                f"a DTensor placed as {placement}: sres keeps Shard and Replicate placements only"
            )
    return tuple(out)


def _placements_in(placements: Iterable[tuple[str, int]]) -> tuple[Placement, ...]:
    return tuple(Shard(dim) if kind == "shard" else Replicate() for kind, dim in placements)


def on_mesh(state: dict[str, Any], mesh: Any) -> Any:
    """A snapshot form (this rank's, or every old rank's after a resize) as DTensors on ``mesh``."""
    if "shards" in state:  # every old rank's form: another world size
        return reshard(state["shards"], mesh)
    return from_local(state, mesh)


def forget_old_meshes() -> None:
    """Clear DTensor's caches of sharding decisions; called at each formation of a generation.

    They are keyed by device meshes, and meshes of two generations compare equal when their
    shapes are (equality ignores the process groups and this process's rank), so a cached
    decision hands new DTensors the mesh of an earlier generation, with this process's old
    coordinate on it. Measured: a process that was rank 2 of a first 4-rank generation and
    rank 1 of a later one got FSDP2 parameters whose mesh said coordinate 2, and resharding
    cut it rank 2's rows.
    """
    _clear_sharding_prop_cache()


def reshard(shards: list[Any], mesh: Any) -> Any:
    """This rank's state on ``mesh``, from the snapshot forms of every rank of another world.

    Each DTensor is assembled whole and cut for ``mesh`` with its old placements (the mesh
    must have as many dimensions as the old one); any other value is taken from the first
    form (the same on every rank: hyperparameters, AdamW's step).
    """
    first = shards[0]
    if isinstance(first, dict) and DTENSOR in first:
        placements = _placements_in(first["placements"])
        if len(placements) != mesh.ndim:
            raise ResilienceError(
                f"FSDP2 state saved on a {len(placements)}-D device mesh cannot load on a "
                f"{mesh.ndim}-D one: keep the mesh's dimensions when the world size changes"
            )
        return distribute_tensor(assemble(shards), mesh, placements, src_data_rank=None)
    if isinstance(first, dict):
        return {k: reshard([s[k] for s in shards], mesh) for k in first}
    if isinstance(first, list):
        return [reshard([s[i] for s in shards], mesh) for i in range(len(first))]
    return first


def assemble(forms: list[dict[str, Any]]) -> torch.Tensor:
    """The whole tensor from the snapshot forms of its shards (twins' forms may repeat). Pure."""
    first = forms[0]
    sharded = [(mesh_dim, dim) for mesh_dim, (kind, dim) in enumerate(first["placements"]) if kind == "shard"]
    if not sharded:
        return first[DTENSOR]
    if len(sharded) > 1:
        raise ResilienceError(
            f"a DTensor sharded along {len(sharded)} mesh dimensions: sres reshards FSDP2 and "
            "HSDP state (one sharded mesh dimension) only"
        )
    mesh_dim, dim = sharded[0]
    by_index = {form["index"][mesh_dim]: form[DTENSOR] for form in forms}
    if sorted(by_index) != list(range(len(by_index))):
        raise ResilienceError(
            f"resharding needs every shard of a tensor; shards {sorted(by_index)} were found"
        )
    whole = torch.cat([by_index[i] for i in range(len(by_index))], dim=dim)
    if tuple(whole.shape) != tuple(first["shape"]):
        raise ResilienceError(
            f"shards assemble to shape {tuple(whole.shape)}, not the saved {tuple(first['shape'])}"
        )
    return whole
