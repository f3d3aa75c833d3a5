"""Fixed-point gradient sums: the same bits whatever the grouping and order of micro-batches,
and a clear refusal (or a skipped step) when a gradient cannot be represented."""

from __future__ import annotations

import contextlib
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from resilience import fixed_point
from resilience.exact import ExactDataParallel, GradientNotRepresentable
from resilience.fixed_point import ExactSum, plan_sum


def micro_batch_grads(seed: int, count: int, numel: int = 257) -> list[torch.Tensor]:
    """Gradients of different scales, signs and sparsity, like a step's micro-batches."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        scale = 2.0 ** float(torch.randint(-12, 6, (), generator=g))
        grad = torch.randn(numel, generator=g) * scale
        grad[torch.rand(numel, generator=g) < 0.2] = 0.0
        out.append(grad)
    return out


def summed_in_groups(grads: list[torch.Tensor], groups: list[list[int]]) -> torch.Tensor:
    """What ExactDataParallel computes when each group of micro-batches is one rank's share."""
    slots = [ExactSum(torch.zeros(grads[0].shape, dtype=torch.float64)) for _ in groups]
    for slot, members in zip(slots, groups):
        for n, index in enumerate(members, start=1):
            slot.add(grads[index], grads[index].abs().max().item(), n)
    reduced = [max(column) for column in zip(*(s.header() for s in slots))]  # the MAX all-reduce
    plan = plan_sum([reduced], bound_count=len(groups) * max(len(m) for m in groups))
    assert plan.problem == fixed_point.OK
    wires = [torch.empty(grads[0].shape, dtype=torch.int64) for _ in slots]
    for slot, wire in zip(slots, wires):
        slot.export(wire, plan.lows[0])
    total = sum(wires)  # the SUM all-reduce
    return fixed_point.dequantize(total, plan.lows[0], len(grads), torch.float32)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000), count=st.integers(1, 24), ranks=st.integers(1, 6), shuffle=st.integers(0, 99)
)
def test_any_grouping_and_order_gives_the_same_bits(seed, count, ranks, shuffle):
    grads = micro_batch_grads(seed, count)
    alone = summed_in_groups(grads, [list(range(count))])
    order = list(range(count))
    random.Random(shuffle).shuffle(order)
    groups = [order[r::ranks] for r in range(ranks) if order[r::ranks]]
    assert torch.equal(summed_in_groups(grads, groups), alone)
    assert torch.allclose(
        alone, torch.stack(grads).mean(0), rtol=0, atol=2.0**-22 * max(g.abs().max() for g in grads)
    )


def test_elements_near_the_largest_are_kept_exactly():
    grad = torch.tensor([1.0, -0.75, 2.0**-8 + 2.0**-30, 3.0 * 2.0**-40, 0.0])
    wide, default = (
        ExactSum(torch.zeros(5, dtype=torch.float64)),
        ExactSum(torch.zeros(5, dtype=torch.float64)),
    )
    wide.add(grad, 1.0, 1, bits=32)
    back = fixed_point.dequantize(wide.total, wide.low, 1, torch.float32)
    assert torch.equal(back[:3], grad[:3])  # within 2**-8 of the largest: every float32 bit kept
    assert back[3] == 0.0  # below 2**-32 of the largest: rounded away
    default.add(grad, 1.0, 1)  # 24 bits
    back = fixed_point.dequantize(default.total, default.low, 1, torch.float32)
    assert torch.equal(back[:2], grad[:2]) and back[2] == 2.0**-8  # 2**-30 is below the unit, 2**-23


def test_a_sum_that_cannot_fit_is_refused_not_wrapped():
    assert fixed_point.fits(10, 10 - 32, 2**20)
    assert not fixed_point.fits(10, 10 - 32, 2**31)
    slot = ExactSum(torch.zeros(3, dtype=torch.float64))
    slot.add(torch.tensor([1.0, 0.5, 0.0]), 1.0, 1)
    slot.add(torch.tensor([2.0**-40, 0.0, 0.0]), 2.0**-40, 2)  # 2**41 apart: more than a rank's 53 - 24 bits
    assert slot.problem == fixed_point.RANGE
    slot.add(torch.tensor([math.inf, 0.0, 0.0]), math.inf, 3)
    plan = plan_sum([slot.header()], bound_count=3)
    assert plan.problem == fixed_point.NONFINITE and plan.culprit == 0


class TwoLayers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first, self.second = torch.nn.Linear(8, 8), torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


def accumulate(model: ExactDataParallel, batches: list[torch.Tensor], scale: float = 1.0) -> None:
    for i, x in enumerate(batches):
        sync = model.no_sync() if i < len(batches) - 1 else contextlib.nullcontext()
        with sync:
            (model(x).square().mean() * scale).backward()


def test_micro_batch_order_does_not_change_the_gradient():
    batches = [
        torch.randn(4, 8, generator=torch.Generator().manual_seed(i)) * 10 ** (i % 3) for i in range(5)
    ]
    grads = []
    for order in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        model = ExactDataParallel(TwoLayers())
        accumulate(model, [batches[i] for i in order])
        grads.append([p.grad.clone() for p in model.module.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_non_finite_gradient_is_a_clear_error_or_a_skipped_step():
    batches = [torch.randn(4, 8), torch.randn(4, 8)]
    model = ExactDataParallel(TwoLayers())
    with pytest.raises(GradientNotRepresentable, match="gradient of 'first.weight' holds inf or NaN"):
        accumulate(model, batches, scale=math.inf)
    skipping = ExactDataParallel(TwoLayers(), on_overflow="skip")
    before = [p.detach().clone() for p in skipping.module.parameters()]
    opt = torch.optim.AdamW(skipping.module.parameters(), lr=0.1)
    accumulate(skipping, batches, scale=math.nan)
    assert all(p.grad is None for p in skipping.module.parameters())
    opt.step()
    assert skipping.skipped_steps == 1
    assert all(torch.equal(a, p) for a, p in zip(before, skipping.module.parameters()))
    accumulate(skipping, batches)  # the next step is clean again
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in skipping.module.parameters())


def test_a_module_wrapped_again_feeds_only_the_new_wrapper():
    """train() may keep its module across re-entries and wrap it anew: one quantization per backward."""
    module = TwoLayers()
    first = ExactDataParallel(module)
    second = ExactDataParallel(module)
    with second.no_sync():
        module(torch.randn(4, 8)).sum().backward()
    assert (first._count, second._count) == (0, 1)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="on_overflow"):
        ExactDataParallel(TwoLayers(), on_overflow="ignore")
    with pytest.raises(ValueError, match="bits=4"):
        ExactDataParallel(TwoLayers(), bits=4)


def test_a_step_whose_sums_fit_31_bits_travels_as_int32():
    assert plan_sum([[0, 24, 0, 1]], bound_count=16).narrow  # 24 bits + log2(16)
    assert not plan_sum([[0, 24, 0, 1], [3, 30, 0, 1]], bound_count=16).narrow  # a spread of 2**9 on top
