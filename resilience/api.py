"""The training API's entry point: ``resilience.run(train)``.

Under ``sres run`` the rank's agent runs ``train(ctx)`` and re-enters it after every fault;
alone or under plain ``torchrun`` it runs ``train`` once (see :mod:`resilience.context` for
what ``ctx`` offers).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from resilience.context import Context
from resilience.contract import store_core
from resilience.contract.rank_env import RankEnv
from resilience.data.batch_source import BatchSource
from resilience import rank_log
from resilience.process_name import name_process
from resilience.rank_place import RankPlace


def run(
    train: Callable[[Context], None], *, batches: Callable[[], BatchSource] | None = None, **options: Any
) -> None:
    """Run ``train(ctx)``, re-entering it in-process after faults when started by ``sres run``.

    Under plain ``torchrun`` (or alone) it runs ``train`` once with a Context whose commits
    only count steps: adopt the API first, get recovery by launching with ``sres run``.
    Options (e.g. ``backend="nccl"``, ``tiers={...}``) override what ``sres run`` configured;
    an unknown option is refused (:class:`resilience.errors.OptionError`). ``batches``: what
    makes the source of a ``resilience.BatchCache``; each node then gets a producer process
    that runs this script, calls it and fills the cache ahead of the ranks.
    """
    from resilience.agent.rank_loop import Agent

    env = RankEnv.from_environ(os.environ, **options)
    if env is not None and env.fork_server:
        from resilience import fork_server
        from resilience.agent.warm_up import warm_up

        name_process(env.slot)
        fork_server.serve(warm_up)  # returns in a forked rank, whose environment is its own
        env = RankEnv.from_environ(os.environ, **options)
    if env is None:
        _run_plain(train, options.get("backend"))
        return
    name_process(env.slot)
    rank_log.say_who(env.slot)
    if env.batch_producer:
        from resilience.data import producer

        producer.main(env, batches)
        return
    Agent(env, batches=batches is not None).run(train)


def _run_plain(train: Callable[[Context], None], backend: str | None) -> None:
    """``train`` once, in the process group torchrun described, or alone in a group of one:
    ``python train.py`` is how a user tries a script first, and ``resilience.ddp`` (DDP itself)
    needs a default group even for one process (it raised "Default process group has not been
    initialized" where the guide says that command works)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ours = not dist.is_initialized()
    if ours and world > 1:
        dist.init_process_group(backend or ("nccl" if _cuda() else "gloo"))
    elif ours:  # alone: a group of one on an in-process store (no port, no file)
        dist.init_process_group(
            backend or ("nccl" if _cuda() else "gloo"), store=store_core.alone(), rank=0, world_size=1
        )
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))  # torchrun's, else one node
    node = int(os.environ.get("GROUP_RANK", "0"))
    place = RankPlace(rank, world, local_rank, per_node, node=node, num_nodes=math.ceil(world / per_node))
    train(Context(rank=rank, world_size=world, local_rank=local_rank, generation=0, step=-1, place=place))
    if ours:
        # Leave together: a rank that exits while a peer's gloo threads still use the
        # connection makes that peer abort (seen in CI as SIGABRT under torchrun).
        dist.barrier()
        dist.destroy_process_group()


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
