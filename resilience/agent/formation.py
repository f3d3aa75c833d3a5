"""Forming and leaving a generation's process groups.

Two groups per generation: the training group (``init_process_group``, the user's backend)
and the state group (gloo, CPU buffers) that recovery and buddy copies use from a background
thread, so that state traffic never interleaves with training collectives. Both rendezvous on
the supervisor's store under the generation's own prefix: a generation that a later fault
ended cannot be joined by mistake.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed.distributed_c10d import _get_default_group

from resilience.agent.abort import GroupSockets
from resilience.agent.heartbeat import GenerationWatch
from resilience.contract.messages import Plan
from resilience.contract.rank_env import RankEnv
from resilience.contract.run_store import RunStore

log = logging.getLogger("resilience")


def form(plan: Plan, rank: int, env: RankEnv, store: RunStore, watch: GenerationWatch) -> dist.ProcessGroup:
    """Both groups of ``plan``'s generation; returns the state group. Their sockets are
    registered with ``watch`` as they open, so that a fault during formation releases this rank."""
    sockets = GroupSockets()
    watch.enter(plan.generation, env.backend, sockets, [])
    timeout = timedelta(seconds=env.reform_timeout_s)
    group_store = store.plans.group_store(plan.generation)
    with sockets:
        state_group = join_groups(group_store, rank, plan.world_size, env.backend, timeout)
    watch.enter(plan.generation, env.backend, sockets, [_get_default_group(), state_group])
    return state_group


def join_groups(
    store: dist.Store, rank: int, world_size: int, backend: str, timeout: timedelta
) -> dist.ProcessGroup:
    """The default group and the state group on ``store``; returns the state group.

    torch names groups by a process-wide counter that only the destruction of a default group
    resets, and the names are part of the rendezvous keys. An ``init_process_group`` that failed
    part-way (a peer died during gloo's connectFullMesh) leaves the counter advanced with no
    group to destroy: this rank would then wait on keys its peers never write, generation after
    generation, until the restart limit (seen on a loaded 2-core CI machine). Every generation
    has a store prefix of its own, so the names only need to agree between ranks: start them
    at 0 each time, as torch's own destroy does for "trainers recovering from failure"."""
    if not dist.is_initialized():
        c10d._world.group_count = 0
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    state_group: dist.ProcessGroup = dist.new_group(backend="gloo", timeout=timeout)  # unannotated in torch
    return state_group


def destroy() -> None:
    """Destroy the default group (the caller has shut its sockets down: see
    :mod:`resilience.agent.abort`); a failure here only matters to the log."""
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as err:  # noqa: BLE001
            log.debug("destroy of the process group failed: %s", err)
