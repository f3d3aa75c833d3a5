"""DistributedDataParallel whose gradient sums do not depend on DDP's bucket history.

Cause, found on torch 2.13 with gloo: a new DDP puts each bucket's parameters in
registration order; after its first iteration it rebuilds the buckets in the order their
gradients became ready (reverse order for a feed-forward model). Gloo's all-reduce sums an
element in an order set by its offset in the flat bucket (ring chunks), so the first step
of every new DDP, which ``train`` builds after each re-formation, sums in another order than
a long-lived DDP at the same step: a few ulps, carried to the end of the run (measured: the
fresh DDP's first gradients differ by up to 2.3e-10, its second ones are bitwise equal; a
plain-DDP run with a node loss ended 4.5e-8 away). All-reducing each parameter's gradient
on its own makes the sum a function of the tensor alone, so a recovered run ends bitwise
equal to a run without faults. Under ``resilience.run`` every DDP built in ``train`` gets
this hook unless its code registers its own (:func:`deterministic_by_default`; opt out with
``resilience.run(train, deterministic_ddp=False)``). It costs one collective per tensor.

``resilience.ddp(model, exact=True)`` goes further: results independent of the world size
(:mod:`resilience.exact`).
"""

from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from resilience.agent import step_timer


def per_parameter_allreduce(
    process_group: Any, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: average every gradient of the bucket with its own all-reduce.

    (Annotations are real types, not strings: DDP checks them when the hook is registered.)
    """
    step_timer.collective_started()
    world = dist.get_world_size(process_group)
    # One collective at a time: gloo runs them one after another anyway, and with several
    # queued, a wait on a later one once spun forever after the generation's sockets were
    # shut down (seen once in CI); a single pending op fails at once.
    for grad in bucket.gradients():
        dist.all_reduce(grad, group=process_group)
    buffer = bucket.buffer()
    buffer.div_(world)
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future


def ddp(module: torch.nn.Module, *, exact: bool = False, **kwargs: Any) -> torch.nn.Module:
    """``DistributedDataParallel(module, **kwargs)`` with :func:`per_parameter_allreduce`.

    ``gradient_as_bucket_view=True`` makes the gradients views of the bucket buffer, which
    the hook relies on (it reduces the views and returns the buffer). After a recovery,
    ``ctx.register`` loaded the same committed state on every rank, so DDP's initial
    broadcast of the parameters is skipped for such a module (``init_sync=False``): it cost
    1.1-1.5 s per re-formation at 528 MiB on the test machine.

    ``exact=True``: an :class:`~resilience.exact.ExactDataParallel` instead, whose gradients
    are the same bits at any world size; it takes ``process_group``, ``bits``,
    ``on_overflow`` and ``broadcast_buffers``.
    """
    if exact:
        from resilience.exact import ExactDataParallel

        return ExactDataParallel(module, **kwargs)
    kwargs.setdefault("gradient_as_bucket_view", True)
    if _restored(module):
        kwargs.setdefault("init_sync", False)
    model = DistributedDataParallel(module, **kwargs)
    model.register_comm_hook(kwargs.get("process_group"), per_parameter_allreduce)
    return model


def deterministic_by_default() -> None:
    """Give every DDP built from now on :func:`per_parameter_allreduce`, at its first forward,
    unless a comm hook was registered on it by then (its code's own choice wins).

    Such a DDP also skips its initial broadcast of the module's state when ``ctx.register``
    just loaded all of it (:func:`ddp` does the same): every rank then holds the commit's bits,
    and the broadcast only cost the first step after each recovery time that grows with the
    model (0.13 s at 80 MiB of parameters, gloo, this machine), on survivors and replacements
    alike. An explicit ``init_sync`` is kept.

    Called by the rank agent before ``train`` (``resilience.run(..., deterministic_ddp=False)``
    leaves DDP alone). Patches the class once per process: user code builds its DDP itself.
    """
    if getattr(DistributedDataParallel, "_sres_deterministic", False):
        return
    original_init = DistributedDataParallel.__init__
    originals = {
        name: getattr(DistributedDataParallel, name)
        for name in ("register_comm_hook", "_register_builtin_comm_hook")
    }

    def init(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        if _restored(args[0] if args else kwargs.get("module")):
            kwargs.setdefault("init_sync", False)
        original_init(self, *args, **kwargs)
        self._sres_first_forward = self.register_forward_pre_hook(_hook_at_first_forward)

    def own_hook(name: str) -> Any:
        def register(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> Any:
            self._sres_own_hook = True
            return originals[name](self, *args, **kwargs)

        return register

    DistributedDataParallel.__init__ = init
    for name in originals:
        setattr(DistributedDataParallel, name, own_hook(name))
    DistributedDataParallel._sres_deterministic = True


def _restored(module: Any) -> bool:
    """Whether ``ctx.register`` just loaded ``module``'s whole state from a commit."""
    from resilience.context import _restored_modules  # the context imports the rank agent

    return module is not None and module in _restored_modules


def _hook_at_first_forward(module: DistributedDataParallel, _: Any) -> None:
    module._sres_first_forward.remove()
    if not getattr(module, "_sres_own_hook", False):
        module.register_comm_hook(module.process_group, per_parameter_allreduce)
