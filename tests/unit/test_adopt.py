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


def _tied() -> torch.nn.Module:
    embed = torch.nn.Embedding(5, 4)
    head = torch.nn.Linear(4, 5, bias=False)
    head.weight = embed.weight
    return torch.nn.ModuleDict({"embed": embed, "head": head})


def test_tied_weights_restored_apart_stay_tied():
    """Two restored tensors for one tied weight (a snapshot of an older version): copied."""
    model = _tied()
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


def test_a_parameter_inside_a_bucket_stays_in_it():
    """``ZeroRedundancyOptimizer(parameters_as_bucket_view=True)`` makes each ``param.data`` a view
    into its bucket and updates the bucket: the restored values must land there."""
    model = torch.nn.Linear(4, 4)
    bucket = torch.zeros(20)
    with torch.no_grad():
        model.weight.data = bucket[:16].view(4, 4)
        model.bias.data = bucket[16:]
    state = _restored(model)
    load_module(model, state)
    assert model.weight.data_ptr() == bucket.data_ptr()
    assert torch.equal(bucket, torch.cat([state["weight"].reshape(-1), state["bias"]]))


def test_restored_views_of_one_buffer_are_copied_so_a_saved_model_is_the_model_alone(tmp_path):
    """A restored tensor that is a view of a bigger buffer (a snapshot's, one per dtype) would keep
    it whole: ``torch.save`` writes storages whole."""
    model = torch.nn.Linear(64, 64)
    flat = torch.cat([t.reshape(-1) for t in _restored(model).values()] + [torch.zeros(100_000)])
    state = {"weight": flat[: 64 * 64].view(64, 64), "bias": flat[64 * 64 : 64 * 65]}
    load_module(model, state)
    assert model.weight.data_ptr() != flat.data_ptr()
    torch.save(model.state_dict(), tmp_path / "m.pt")
    assert (tmp_path / "m.pt").stat().st_size < 64 * 65 * 4 + 4096


def test_a_module_with_extra_state_has_it_set():
    class Counted(torch.nn.Linear):
        def __init__(self) -> None:
            super().__init__(4, 4)
            self.seen = torch.zeros(1)

        def get_extra_state(self) -> torch.Tensor:
            return self.seen

        def set_extra_state(self, state: torch.Tensor) -> None:
            self.seen = state.clone() + 100

    model = Counted()
    state = _restored(model)
    load_module(model, state)
    assert model.seen.item() == 101
    assert torch.equal(model.weight, state["weight"])


def test_a_tied_weight_restored_once_is_adopted_once():
    """A snapshot keeps a tied weight once, so both keys restore the same tensor: taken, no copy."""
    model = _tied()
    state = _restored(model)
    state["head.weight"] = state["embed.weight"]
    load_module(model, state)
    assert model["embed"].weight is model["head"].weight
    assert model["head"].weight.data_ptr() == state["embed.weight"].data_ptr()
