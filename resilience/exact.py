"""Data parallelism whose result does not depend on the world size: ``resilience.ddp(model, exact=True)``.

Each backward pass (a micro-batch) is turned into integers as soon as it ends
(:mod:`resilience.fixed_point`), accumulated as integers, and summed across ranks as integers at the
step's last backward (the one outside ``no_sync()``, as with DDP). The optimizer receives the
mean over every micro-batch of the step, on every rank: the same bits whether 1 rank did all
of them or 4 ranks did a quarter each, and whatever re-formations happened in between. Runs
are then comparable bit for bit across elastic resizes, not only across faults.

A loop that leaves out ``no_sync()`` (every backward synchronizes) stays exact: a backward
outside ``no_sync()`` sums every micro-batch of the step so far, not only its own, and the
step goes on until the gradients it handed out are changed (``zero_grad()``, in place or to
None). Such a loop pays one all-reduce per micro-batch, as with DDP, and ends with the bits
of the loop that uses ``no_sync()``; summing per micro-batch and adding the means (DDP's way)
would round differently at each world size.

What the user keeps in mind: every backward counts as one micro-batch of equal weight (give
the loss of each micro-batch its own mean; do not divide by the number of accumulation steps,
which changes with the world size), and the micro-batches themselves must be the same at
every world size (``ElasticSampler`` makes them so when the micro-batch divides each rank's
share of the global batch).

Written for gloo and NCCL: the collectives are one small int64 MAX and one int32 or int64 SUM per
step, on the parameters' device.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.graph import get_gradient_edge

from resilience import fixed_point
from resilience.agent import step_timer
from resilience.errors import GradientNotRepresentable

log = logging.getLogger(__name__)

ON_OVERFLOW = ("raise", "skip")

_hooks: "weakref.WeakKeyDictionary[torch.nn.Module, list[Any]]" = weakref.WeakKeyDictionary()
"""Gradient hooks of the newest exact wrapper of each module: a module wrapped again (after a
re-entry that kept it) must not feed two wrappers."""


class ExactDataParallel(torch.nn.Module):
    """Averages gradients over every micro-batch of a step, bitwise independent of the world size.

    ``on_overflow``: ``raise`` (default) stops with :class:`GradientNotRepresentable` naming the
    tensor; ``skip`` drops the step's gradients on every rank (the optimizer then skips
    the step, as AMP's GradScaler does) and counts it in ``skipped_steps``. In a loop without
    ``no_sync()`` a skip hands out no gradient to tell whether the step goes on: it ends the step
    at that backward (use ``no_sync()`` where steps may be skipped).
    """

    def __init__(
        self,
        module: torch.nn.Module,
        *,
        process_group: Any = None,
        bits: int = fixed_point.BITS,
        on_overflow: str = "raise",
        broadcast_buffers: bool = True,
    ) -> None:
        super().__init__()
        if on_overflow not in ON_OVERFLOW:
            raise ValueError(f"on_overflow={on_overflow!r}: one of {', '.join(ON_OVERFLOW)}")
        if not 8 <= bits <= fixed_point.SUM_BITS - 8:
            raise ValueError(f"bits={bits}: between 8 and {fixed_point.SUM_BITS - 8}")
        self.module = module
        self.process_group = process_group
        self.bits, self.on_overflow, self.broadcast_buffers = bits, on_overflow, broadcast_buffers
        self.skipped_steps = 0
        self._named = [(n, p) for n, p in module.named_parameters() if p.requires_grad and p.numel()]
        device = self._named[0][1].device if self._named else torch.device("cpu")
        sizes = [p.numel() for _, p in self._named]
        self._offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        # This rank's sums (integer-valued float64), and the step's integers as they travel:
        # one all-reduce for every parameter, with the step's micro-batch count last.
        self._sums = torch.zeros(self._offsets[-1], dtype=torch.float64, device=device)
        self._wires = {
            dtype: torch.empty(0, dtype=dtype, device=device) for dtype in (torch.int32, torch.int64)
        }
        self._slots = [
            fixed_point.ExactSum(self._sums[a:b].view(p.shape))
            for (_, p), a, b in zip(self._named, self._offsets, self._offsets[1:])
        ]
        self._scratch = torch.empty(max(sizes, default=0), device=device)
        self._sync, self._queued, self._count = True, False, 0
        self._handed: list[tuple[torch.nn.Parameter, torch.Tensor, int]] | None = None
        """The gradients the step's newest sum handed out, with their versions; None while no
        sum was made since the step began."""
        self._accumulators: list[Any] = []
        self._attach_hooks()
        if self._world() > 1:
            self._broadcast_initial_state()

    # --- what DDP users call ----------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.broadcast_buffers and self._world() > 1:
            for buf in self.module.buffers():
                dist.broadcast(buf, src=self._global_rank(0), group=self.process_group)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate locally; one outside sums the step so far."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    # --- the mechanism --------------------------------------------------------------------------

    def _attach_hooks(self) -> None:
        """A hook before each parameter's gradient accumulation: the first of a backward pass
        decides, before autograd adds into ``p.grad``, whether the pass continues the step
        (:meth:`_before_backward`). A hook on the accumulation node runs only when a backward
        accumulates (``torch.autograd.grad`` does not); the nodes are kept, or autograd makes
        new ones without the hook."""
        for handle in _hooks.pop(self.module, []):
            handle.remove()
        me = weakref.ref(self)

        def before_accumulation(_: Any) -> None:
            wrapper = me()
            if wrapper is not None and not wrapper._queued:
                wrapper._queued = True
                wrapper._before_backward()
                torch.autograd.Variable._execution_engine.queue_callback(wrapper._after_backward)

        self._accumulators = [get_gradient_edge(p).node for _, p in self._named]
        _hooks[self.module] = [node.register_prehook(before_accumulation) for node in self._accumulators]

    def _before_backward(self) -> None:
        """A backward pass begins: one more micro-batch of the step, or the first of a new one.

        After a sum, the step goes on only if every gradient it handed out is untouched (a loop
        without ``no_sync()``): they are set aside, to be summed again with this micro-batch.
        A gradient changed or dropped (``zero_grad()``) means the optimizer had them: a new step.
        """
        handed, self._handed = self._handed, None
        if handed is None:
            return
        if handed and all(p.grad is grad and grad._version == version for p, grad, version in handed):
            for p, _, _ in handed:
                p.grad = None
            return
        self._new_step()

    def _new_step(self) -> None:
        # The next micro-batch's first add overwrites the sums: no zeroing pass.
        for slot in self._slots:
            slot.reset()
        self._count = 0

    def _after_backward(self) -> None:
        """End of a backward pass: fold this micro-batch into the integer sums."""
        self._queued = False
        self._count += 1
        grads = [p.grad for _, p in self._named]
        zero = torch.zeros((), dtype=torch.float64, device=self._sums.device)
        # max |g| without a temporary |g|: aminmax reads the gradient once.
        maxima = torch.stack(
            [
                torch.stack(g.detach().aminmax()).abs().amax().double() if g is not None else zero
                for g in grads
            ]
        ).tolist()
        for slot, (_, p), grad, max_abs in zip(self._slots, self._named, grads, maxima):
            if grad is not None:
                slot.add(grad, max_abs, self._count, self.bits, self._scratch)
                p.grad = None
        if self._sync:
            self._reduce()

    def _reduce(self) -> None:
        """Sum the step across ranks and hand the mean to ``p.grad`` (or raise / skip)."""
        step_timer.collective_started()
        world = self._world()
        header = torch.tensor(
            [s.header() for s in self._slots] + [[self._count, 0, 0, 0]],
            dtype=torch.int64,
            device=self._sums.device,
        )
        if world > 1:
            dist.all_reduce(header, op=dist.ReduceOp.MAX, group=self.process_group)
        rows = header.tolist()
        plan = fixed_point.plan_sum(rows[:-1], bound_count=world * rows[-1][0])
        handed: list[tuple[torch.nn.Parameter, torch.Tensor, int]] = []
        try:
            if plan.problem:
                self._refuse(plan)
                return
            wire = self._wire(torch.int32 if plan.narrow else torch.int64)
            for slot, a, b, low in zip(self._slots, self._offsets, self._offsets[1:], plan.lows):
                slot.export(wire[a:b].view(slot.total.shape), low if low is not None else 0)
            wire[-1] = self._count
            if world > 1:
                dist.all_reduce(wire, op=dist.ReduceOp.SUM, group=self.process_group)
            count = int(wire[-1])
            for (_, p), a, b, low, seen in zip(
                self._named, self._offsets, self._offsets[1:], plan.lows, plan.seen
            ):
                if low is not None:
                    p.grad = fixed_point.dequantize(wire[a:b].view(p.shape), low, count, p.dtype)
                elif seen:
                    p.grad = torch.zeros_like(p)
                else:
                    continue
                handed.append((p, p.grad, p.grad._version))
        finally:  # the sums are kept: the step may go on (a loop without no_sync)
            self._handed = handed

    def _wire(self, dtype: torch.dtype) -> torch.Tensor:
        """The all-reduced integers: int32 when every sum fits (half the bytes), else int64."""
        if self._wires[dtype].numel() != self._offsets[-1] + 1:
            self._wires[dtype] = torch.empty(self._offsets[-1] + 1, dtype=dtype, device=self._sums.device)
        return self._wires[dtype]

    def _refuse(self, plan: fixed_point.SumPlan) -> None:
        name = self._named[plan.culprit][0] if plan.culprit is not None else "?"
        what = (
            "holds inf or NaN"
            if plan.problem == fixed_point.NONFINITE
            else f"spans more than the integer sums hold at bits={self.bits} "
            "(micro-batches differ too much in scale)"
        )
        message = f"exact gradient sum: the step's gradient of {name!r} {what}"
        if self.on_overflow == "raise":
            raise GradientNotRepresentable(message + "; on_overflow='skip' skips such steps instead")
        self.skipped_steps += 1
        if self._rank() == 0:
            log.warning("%s: step skipped (%d so far)", message, self.skipped_steps)

    # --- process group ----------------------------------------------------------------------------

    def _world(self) -> int:
        return dist.get_world_size(self.process_group) if dist.is_initialized() else 1

    def _rank(self) -> int:
        return dist.get_rank(self.process_group) if dist.is_initialized() else 0

    def _global_rank(self, group_rank: int) -> int:
        if self.process_group is None:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    @torch.no_grad()
    def _broadcast_initial_state(self) -> None:
        """Rank 0's parameters and buffers everywhere, as DDP does; skipped for a module that
        ``ctx.register`` just loaded from a commit (already identical on every rank)."""
        from resilience.context import _restored_modules

        if self.module in _restored_modules:
            return
        for tensor in [*self.module.parameters(), *self.module.buffers()]:
            dist.broadcast(tensor, src=self._global_rank(0), group=self.process_group)
