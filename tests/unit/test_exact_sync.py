"""Exact mode whatever the loop does between micro-batches (one process: a world of 1 sums
alone, with the same rounding as a wider one): with or without ``no_sync()``, zeroing to None or
in place, ``torch.autograd.grad`` in between, the optimizer gets the same bits."""

from __future__ import annotations

import contextlib

import pytest
import torch

from resilience.exact import ExactDataParallel

MICRO = 4


def micro_batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(step)
    return [(torch.randn(3, 6, generator=g), torch.randn(3, 2, generator=g)) for _ in range(MICRO)]


def train(steps: int, *, no_sync: bool, set_to_none: bool = True, probe: bool = False) -> list[torch.Tensor]:
    """``steps`` steps of ``MICRO`` micro-batches; the gradients handed to each step, and the final
    parameters."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    exact = ExactDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step in range(steps):
        for i, (x, y) in enumerate(micro_batches(step)):
            quiet = exact.no_sync() if no_sync and i < MICRO - 1 else contextlib.nullcontext()
            with quiet:
                torch.nn.functional.mse_loss(exact(x), y).backward()
        if probe:  # a gradient of the loss by the parameters that accumulates nothing
            torch.autograd.grad(exact(x).sum(), list(model.parameters()))
        seen += [p.grad.clone() for p in model.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
    return seen + [p.detach().clone() for p in model.parameters()]


def same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(a, b)
    )


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_loop_without_no_sync_gets_the_bits_of_one_with_it(set_to_none):
    """Each backward outside no_sync sums the step so far; the last one sums it all, as the
    loop with no_sync does once."""
    assert same_bits(train(3, no_sync=False, set_to_none=set_to_none), train(3, no_sync=True))


def test_steps_are_told_apart_by_the_gradients_being_consumed():
    """zero_grad() ends the step: the second step's gradients are its own micro-batches', not
    both steps' (the first step's are those of a one-step run)."""
    two = train(2, no_sync=False)
    params = 4
    assert same_bits(two[:params], train(1, no_sync=True)[:params])
    assert not same_bits(two[params : 2 * params], two[:params])


def test_autograd_grad_between_the_last_backward_and_the_step_changes_nothing():
    assert same_bits(train(2, no_sync=False, probe=True), train(2, no_sync=True))
