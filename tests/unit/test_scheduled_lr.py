"""ctx.lr_scale under a scheduler that sets the LR at every step (issue 53.2): the step uses the
scheduler's LR times the scale, the scheduler keeps its own values, fixed worlds are untouched."""

from __future__ import annotations

import math

import torch

from resilience.context import Context
from resilience.elastic import ElasticSampler

BASE_LR = 0.1


def _loop(resizable: bool, scale_it_myself: bool = False) -> tuple[float, list[float], list[float]]:
    """Three steps of SGD under a cosine LambdaLR at world 3 (global batch 16 kept as 15: scale
    15/16): the LR each step used (from the parameter's move), and the scheduler's LRs."""
    torch.manual_seed(0)
    ctx = Context(rank=0, world_size=3, local_rank=0, generation=1, step=-1, resizable=resizable)
    model = torch.nn.Linear(1, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / 10)))
    ctx.register(model=model, optimizer=opt, sched=sched, sampler=ElasticSampler(64, 16, 1))
    if scale_it_myself:  # the elastic guide's line, kept by a user who also has a scheduler
        for g in opt.param_groups:
            g["lr"] = BASE_LR * ctx.lr_scale
    used, scheduled = [], []
    for _ in range(3):
        before = model.weight.detach().clone()
        model.weight.grad = torch.ones_like(model.weight)
        scheduled.append(opt.param_groups[0]["lr"])
        opt.step()
        used.append(float((before - model.weight.detach()).item()))
        sched.step()
    return ctx.lr_scale, used, scheduled


def test_a_resizable_run_steps_at_the_schedulers_lr_times_the_scale():
    scale, used, scheduled = _loop(resizable=True)
    assert scale == 15 / 16
    assert all(math.isclose(u, lr * scale, rel_tol=1e-6) for u, lr in zip(used, scheduled))
    assert scheduled[0] == BASE_LR and scheduled[2] < scheduled[1] < BASE_LR  # the schedule is its own


def test_a_loop_that_scaled_its_first_step_itself_is_not_scaled_twice():
    scale, used, scheduled = _loop(resizable=True, scale_it_myself=True)
    assert math.isclose(used[0], BASE_LR * scale, rel_tol=1e-6)
    assert all(math.isclose(u, lr * scale, rel_tol=1e-6) for u, lr in zip(used[1:], scheduled[1:]))


def test_a_fixed_world_is_left_alone():
    _, used, scheduled = _loop(resizable=False)
    assert all(math.isclose(u, lr, rel_tol=1e-6) for u, lr in zip(used, scheduled))
