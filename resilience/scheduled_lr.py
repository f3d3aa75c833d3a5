"""``ctx.lr_scale`` under a learning-rate scheduler: applied at each optimizer step, where no
scheduler can undo it.

After a resize that could not keep the global batch, the LR must be scaled (``ctx.lr_scale``).
A loop that sets ``g["lr"] = BASE_LR * ctx.lr_scale`` once per entry is right without a
scheduler, but a scheduler sets ``g["lr"]`` again at every ``sched.step()`` (``transformers``'
cosine schedule: a ``LambdaLR``), so at world 3 (scale 0.9375) the run trained at the unscaled
rate and nothing said so. So for a registered scheduler sres scales the LR around each
``optimizer.step()`` (a pre-hook multiplies, a post-hook puts the scheduler's value back), and only
a value the scheduler set: a loop that already scaled it for its first step is not scaled twice.
Fixed-world runs never get the hooks; a scale of 1 changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_OWNER = "_sres_scaled_by"
"""On the optimizer: (scheduler, scale) of the newest registration (each entry of ``train``)."""
_SAVED = "_sres_unscaled_lrs"


def follow(scheduler: Any, scale: Callable[[], float]) -> None:
    """Scale ``scheduler``'s optimizer's LR by ``scale()`` at each of its steps."""
    optimizer = scheduler.optimizer
    hooked = hasattr(optimizer, _OWNER)
    setattr(optimizer, _OWNER, (scheduler, scale))
    if not hooked:
        optimizer.register_step_pre_hook(_before)
        optimizer.register_step_post_hook(_after)


def _before(optimizer: Any, args: Any, kwargs: Any) -> None:
    scheduler, scale = getattr(optimizer, _OWNER)
    factor = scale()
    setattr(optimizer, _SAVED, None)
    if factor == 1.0:
        return
    saved = [g["lr"] for g in optimizer.param_groups]
    setattr(optimizer, _SAVED, saved)
    for group, lr, scheduled in zip(optimizer.param_groups, saved, scheduler.get_last_lr()):
        if lr == scheduled:  # the scheduler's value (a loop may have scaled it itself)
            group["lr"] = lr * factor


def _after(optimizer: Any, args: Any, kwargs: Any) -> None:
    saved = getattr(optimizer, _SAVED, None)
    if saved is not None:
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr
