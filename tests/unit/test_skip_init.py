"""ctx.skip_init(): a model built for a restore skips torch.nn.init, and nothing else changes."""

from __future__ import annotations

import pytest
import torch

from resilience.context import Context
from resilience.errors import RegistrationError


def build(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))


def context(restored: dict | None) -> Context:
    step = 4 if restored else -1
    return Context(rank=0, world_size=1, local_rank=0, generation=2, step=step, restored=restored)


def test_a_restored_model_skips_init_and_ends_with_the_commits_state():
    committed = build(seed=1).state_dict()
    ctx = context({"model": {k: v.clone() for k, v in committed.items()}})
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    with ctx.skip_init():
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    assert torch.equal(before, torch.random.get_rng_state())  # no random number drawn: no init ran
    ctx.register(model=model)
    for step in ctx.steps(6):
        with ctx.commit():
            pass
    assert all(torch.equal(v, committed[k]) for k, v in model.state_dict().items())
    assert torch.nn.init.kaiming_uniform_.__name__ == "kaiming_uniform_"  # put back


def test_without_a_restore_the_model_is_initialized_exactly_as_outside():
    ctx = context(None)
    with ctx.skip_init():
        inside = build(seed=3)
    outside = build(seed=3)
    assert all(torch.equal(a, b) for a, b in zip(inside.state_dict().values(), outside.state_dict().values()))


def test_a_module_built_inside_and_never_restored_is_refused_at_the_first_step():
    committed = build(seed=1).state_dict()
    ctx = context({"model": committed})
    with ctx.skip_init():
        model = build()
        head = torch.nn.Linear(8, 3)  # never registered: its weight is uninitialized memory
    ctx.register(model=model)
    refused = r"Linear built inside ctx.skip_init\(\) was not restored.*'weight'"
    with pytest.raises(RegistrationError, match=refused):
        next(iter(ctx.steps(6)))
    del head


def test_a_module_built_inside_and_dropped_before_the_first_step_is_not_refused():
    ctx = context({"model": build(seed=1).state_dict()})
    with ctx.skip_init():
        model = build()
        torch.nn.Linear(8, 3)  # a throwaway: nothing can read its memory
    ctx.register(model=model)
    assert next(iter(ctx.steps(6))) == 5
