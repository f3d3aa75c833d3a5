"""What a rank's process pays before it is given a rank: first-use costs, while nothing waits."""

from __future__ import annotations

from resilience.context import dtensors_loaded
from resilience.state import snapshot


def warm_up() -> None:
    """Pay the first-use costs (lazy imports behind the optimizer and autograd, allocator
    growth) now, while nothing waits for this process: a warm spare that pays them after it
    is given a rank makes every survivor wait in DDP's first broadcast (measured: 1.1 s).
    The global random state is left as it was: a rank forked from a server that warmed up must
    draw what a rank started cold draws (a script seeded at import, its model built in ``train``)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(2, 8)).sum().backward()
        if torch.accelerator.device_count() == 0:  # else step()'s graph-capture check starts CUDA
            opt.step()
        opt.zero_grad()
        state = {"model": model.state_dict(), "opt": opt.state_dict()}
        states = snapshot.materialize(snapshot.capture(state, 0))
        model.load_state_dict(states["model"])
        opt.load_state_dict(states["opt"])
    if dtensors_loaded():
        # The optimizer's step imported DTensor, so every formation clears DTensor's caches
        # (``_form``) through resilience.fsdp: imported here once, not by a replacement on the
        # recovery's critical path (measured there: 0.065-0.09 s, in every forked rank).
        from resilience import fsdp  # noqa: F401
