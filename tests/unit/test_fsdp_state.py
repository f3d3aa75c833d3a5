"""FSDP2 state through a snapshot and back (one process, a world of 1: FSDP2 still makes
every parameter and optimizer state a DTensor), and registration's refusals."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from resilience.context import Context
from resilience.errors import ResilienceError
from resilience.fsdp import DTENSOR, assemble, forget_old_meshes, mesh_of
from resilience.state import snapshot


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def build(mesh, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def train_step(model, opt, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    model(torch.randn(5, 8, generator=g)).square().mean().backward()
    opt.step()
    opt.zero_grad()


def flat(state) -> list[torch.Tensor]:
    if isinstance(state, DTensor):
        return [state.to_local()]
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state, key=str) for t in flat(state[k])]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in flat(v)]
    return []


def test_fsdp_state_goes_through_a_snapshot_and_loads_into_a_new_model(world_of_one):
    model, opt = build(world_of_one)
    for seed in range(3):
        train_step(model, opt, seed)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=2)
    ctx.register(optimizer=opt, model=model)  # either order: models are taken first
    states = ctx.states()
    assert set(states["sharded"]) == {"model", "optimizer"} and ctx.has_sharded
    assert DTENSOR in states["sharded"]["model"]["0.weight"]  # kept as its local shard and layout
    restored = snapshot.materialize(snapshot.capture(states["sharded"], 2))

    model2, opt2 = build(world_of_one, seed=1)  # other initial values: all must be overwritten
    ctx2 = Context(rank=0, world_size=1, local_rank=0, generation=2, step=2, restored=restored)
    ctx2.register(model=model2, optimizer=opt2)
    assert ctx2.state_digest() == ctx.state_digest()  # what runs are compared by
    for a, b in zip(
        flat(model.state_dict()) + flat(get_optimizer_state_dict(model, opt)),
        flat(model2.state_dict()) + flat(get_optimizer_state_dict(model2, opt2)),
        strict=True,
    ):
        assert torch.equal(a, b)
    train_step(model, opt, 9)
    train_step(model2, opt2, 9)
    assert all(torch.equal(a, b) for a, b in zip(flat(model.state_dict()), flat(model2.state_dict())))


def test_a_commit_before_the_first_step_leaves_the_training_unchanged(world_of_one):
    """The state taken before any step (every run's first boundary) must not step the optimizer:
    DCP's ``get_optimizer_state_dict`` makes AdamW's lazy state by stepping on zero gradients,
    which counted a step, so every sres run with FSDP2 ended with other parameters than the same
    loop without sres (torchtitan's Llama under sres against torchtitan alone: another loss)."""
    model, opt = build(world_of_one)
    plain, plain_opt = build(world_of_one)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=-1)
    ctx.register(model=model, optimizer=opt)
    taken = ctx.states()["sharded"]["optimizer"]
    assert taken["state"] == {} and not opt.state  # hyperparameters only; nothing made
    for seed in range(3):
        train_step(model, opt, seed)
        train_step(plain, plain_opt, seed)
    pairs = zip(flat(model.state_dict()), flat(plain.state_dict()), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    fresh, fresh_opt = build(world_of_one, seed=1)
    ctx2 = Context(rank=0, world_size=1, local_rank=0, generation=2, step=-1)
    ctx2.register(model=fresh, optimizer=fresh_opt)
    ctx2._objects["optimizer"].load_state_dict(taken)  # a state of no step loads as hyperparameters
    assert not fresh_opt.state and fresh_opt.param_groups[0]["lr"] == 0.1


def test_an_optimizer_of_an_unregistered_fsdp_model_is_refused(world_of_one):
    _, opt = build(world_of_one)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=-1)
    with pytest.raises(TypeError, match=r"register the model too: ctx.register\(model=model, opt=opt\)"):
        ctx.register(opt=opt)


def split(form, parts: int) -> list:
    """``form`` as ``parts`` ranks of a 1-D FSDP2 mesh would have saved it (torch.chunk: FSDP2's cut)."""
    if isinstance(form, dict) and DTENSOR in form:
        chunks = torch.chunk(form[DTENSOR], parts, dim=0)
        chunks += (form[DTENSOR][:0],) * (parts - len(chunks))
        return [{**form, DTENSOR: chunk, "index": (i,)} for i, chunk in enumerate(chunks)]
    if isinstance(form, dict):
        per_key = {k: split(v, parts) for k, v in form.items()}
        return [{k: per_key[k][i] for k in form} for i in range(parts)]
    if isinstance(form, list):
        per_item = [split(v, parts) for v in form]
        return [[item[i] for item in per_item] for i in range(parts)]
    return [form] * parts


def test_state_saved_by_another_world_size_is_assembled_and_cut_for_this_mesh(world_of_one):
    """A checkpoint of 3 ranks (twins of rank 1 included, as HSDP holds them) loads on 1 rank."""
    model, opt = build(world_of_one)
    for seed in range(3):
        train_step(model, opt, seed)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=2)
    ctx.register(model=model, optimizer=opt)
    forms = snapshot.materialize(snapshot.capture(ctx.states()["sharded"], 2))
    shards = {name: split(form, 3) for name, form in forms.items()}
    restored = {name: {"shards": parts + [parts[1]]} for name, parts in shards.items()}

    model2, opt2 = build(world_of_one, seed=1)
    ctx2 = Context(rank=0, world_size=1, local_rank=0, generation=2, step=2, restored=restored)
    ctx2.register(model=model2, optimizer=opt2)
    assert ctx2.state_digest() == ctx.state_digest()


def test_assembling_refuses_missing_shards_and_two_sharded_mesh_dimensions():
    form = {
        DTENSOR: torch.arange(6.0),
        "placements": (("shard", 0),),
        "shape": (6,),
        "stride": (1,),
        "index": (0,),
    }
    parts = split(form, 3)
    assert torch.equal(assemble(parts[::-1]), torch.arange(6.0))
    with pytest.raises(ResilienceError, match=r"every shard of a tensor; shards \[0, 2\]"):
        assemble([parts[0], parts[2]])
    two_d = {**form, "placements": (("shard", 0), ("shard", 1)), "index": (0, 0)}
    with pytest.raises(ResilienceError, match="one sharded mesh dimension"):
        assemble([two_d])


def test_blocks_sharded_on_default_meshes_are_one_mesh(world_of_one):
    """``fully_shard`` per block, then the root, each call making its own mesh object (FSDP2's
    documentation, torchtitan): equal meshes are one mesh, and the state loads back."""
    forget_old_meshes()  # else DTensor's cache hands out an equal mesh of an earlier test
    model, opt = build(None)
    assert len({id(p.device_mesh) for p in model.parameters()}) > 1  # what this test is about
    train_step(model, opt, 0)
    ctx = Context(rank=0, world_size=1, local_rank=0, generation=1, step=0)
    ctx.register(model=model, optimizer=opt)
    restored = snapshot.materialize(snapshot.capture(ctx.states()["sharded"], 0))
    model2, opt2 = build(None, seed=1)
    ctx2 = Context(rank=0, world_size=1, local_rank=0, generation=2, step=0, restored=restored)
    ctx2.register(model=model2, optimizer=opt2)
    assert ctx2.state_digest() == ctx.state_digest()


def test_parameters_on_truly_different_meshes_are_refused_with_one_line(world_of_one):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    fully_shard(model[0], mesh=init_device_mesh("cpu", (1,), mesh_dim_names=("dp",)))
    fully_shard(model, mesh=world_of_one)
    with pytest.raises(
        ResilienceError,
        match=r"on 2 different device meshes \(cpu 1 ranks \[0\] dims \['dp'\]; "
        r"cpu 1 ranks \[0\]\): sres supports one mesh",
    ):
        mesh_of(model)
