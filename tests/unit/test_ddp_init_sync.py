"""DDP's initial broadcast after a recovery, with real gloo ranks: skipped for a module whose
whole state ``ctx.register`` just loaded (every rank holds the commit's bits), kept otherwise."""

from __future__ import annotations

import textwrap

import pytest

from tests.support.rank_pair import run_rank_pair

# Each rank builds a module of its own bits, so that a broadcast shows: afterwards rank 1 holds
# rank 0's weight. "restored" stands for what ctx.register records when it loads a commit.
SCRIPT = textwrap.dedent("""
    import sys
    from datetime import timedelta
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import resilience
    from resilience.context import _restored_modules
    from resilience.ddp import deterministic_by_default
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    deterministic_by_default()

    def first_weight(wrap, restored, **kwargs):
        torch.manual_seed(rank)
        module = torch.nn.Linear(4, 4)
        if restored:
            _restored_modules.add(module)
        wrap(module, **kwargs)
        return round(float(module.weight[0, 0]), 6)

    print(
        first_weight(DDP, restored=True),
        first_weight(DDP, restored=False),
        first_weight(DDP, restored=True, init_sync=True),
        first_weight(resilience.ddp, restored=True),
        first_weight(resilience.ddp, restored=False),
        flush=True,
    )
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.local  # spawns: the two gloo ranks
def test_a_ddp_of_a_module_just_restored_skips_its_initial_broadcast_and_any_other_keeps_it():
    ranks = run_rank_pair(SCRIPT)
    assert [r.returncode for r in ranks] == [0, 0], [r.stderr[-2000:] for r in ranks]
    (mine0, synced0, asked0, ours0, oursync0), (mine1, synced1, asked1, ours1, oursync1) = (
        r.stdout.split() for r in ranks
    )
    assert mine0 != mine1 and ours0 != ours1  # restored: each rank keeps its own (no broadcast)
    assert synced1 == synced0 and oursync1 == oursync0  # not restored: rank 0's bits everywhere
    assert asked1 == asked0  # an explicit init_sync=True is kept
