"""A recovered module takes its restored tensors without a copy, and only where that is the same
as ``load_state_dict``: the optimizer built before ``register`` still trains the model."""

from __future__ import annotations

import pytest
import torch

from resilience.state.adopt import load_module


def _restored(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a recovery hands ``register``: fresh tensors, as received from a peer."""
    return {k: v.detach().clone() + 1 for k, v in module.state_dict().items()}


def test_a_plain_module_adopts_the_restored_tensors_and_its_optimizer_still_steps_them():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 2))
    params = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before register, as loops do
    state = _restored(model)
    load_module(model, state)
    assert [p for p in model.parameters()] == params  # the same Parameter objects
    for key, tensor in model.state_dict().items():
        assert tensor.data_ptr() == state[key].data_ptr(), key  # no copy
    before = {k: v.clone() for k, v in state.items()}
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert all(not torch.equal(model.state_dict()[k], before[k]) for k in before if k.endswith("weight"))
    assert all(p.requires_grad for p in model.parameters())


def test_a_module_with_its_own_loading_is_loaded_the_usual_way():
    model = torch.nn.Linear(4, 4)
    seen: list[str] = []
    model._register_load_state_dict_pre_hook(lambda *args, **kwargs: seen.append("hook"))
    state = _restored(model)
    load_module(model, state)
    assert seen == ["hook"]
    assert model.weight.data_ptr() != state["weight"].data_ptr()
    assert torch.equal(model.weight, state["weight"])


def test_a_module_that_loads_its_own_way_is_copied_with_its_buffers():
    """BatchNorm overrides ``_load_from_state_dict`` (old checkpoints' missing counter)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    state = _restored(model)
    load_module(model, state)
    assert model[1].running_mean.data_ptr() != state["1.running_mean"].data_ptr()
    assert all(torch.equal(model.state_dict()[k], state[k]) for k in state)


@pytest.mark.parametrize(
    "change",
    [
        lambda t: t.double(),  # another dtype: load_state_dict casts
        lambda t: t.t() if t.dim() == 2 else t,  # not contiguous
        lambda t: t.requires_grad_(True),
    ],
)
def test_a_tensor_that_does_not_fit_is_copied_with_every_other(change):
    model = torch.nn.Linear(4, 4)
    state = _restored(model)
    state["weight"] = change(state["weight"].detach().clone().t().contiguous().t().contiguous())
    load_module(model, state)
    assert model.bias.data_ptr() != state["bias"].data_ptr()
    assert torch.allclose(model.weight.double(), state["weight"].detach().double())


def test_tied_weights_stay_tied():
    embed = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = embed.weight
    model = torch.nn.ModuleDict({"embed": embed, "head": head})
    state = _restored(model)
    state["head.weight"] = state["embed.weight"].clone()
    load_module(model, state)
    assert model["embed"].weight is model["head"].weight
    assert torch.equal(model["embed"].weight, state["embed.weight"])


def test_a_missing_key_fails_as_load_state_dict_does():
    model = torch.nn.Linear(4, 4)
    state = _restored(model)
    del state["bias"]
    with pytest.raises(RuntimeError, match="Missing key"):
        load_module(model, state)
